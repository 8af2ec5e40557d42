"""FedAvg (McMahan et al., AISTATS 2017): local SGD on cross-entropy, sample-weighted averaging.

Server: ``w ← Σ_k n_k w_k / Σ_k n_k`` over the round's clients. The weighted sums are reduced inside
each worker. ``algorithm.server_optimizer`` (default ``none``) steps the global model along the
pseudo-gradient ``ȳ − w`` instead (FedAvgM, FedAdam, FedYogi, FedAdagrad; keys in
:mod:`fedray.algorithms.server_optimizers`).

Algorithms that change only the local objective (FedProx, FedLC, FedNTD, FedDecorr) subclass
:class:`FedAvg` and override :meth:`FedAvg.local_loss`.
"""

from __future__ import annotations


from fedray.algorithms.base import Broadcast, ClientContext, ClientUpdate, weighted_weights_sums
from fedray.algorithms.local import LossFn, local_train
from fedray.algorithms.server_optimizers import ServerOptimizedAlgorithm, ServerOptimizerParams
from fedray.models import set_flat_weights


class FedAvgParams(ServerOptimizerParams):
    pass


class FedAvg(ServerOptimizedAlgorithm):
    name = "fedavg"
    Params = FedAvgParams

    def client_update(self, ctx: ClientContext, broadcast: Broadcast) -> ClientUpdate:
        set_flat_weights(ctx.model, broadcast["weights"])
        metrics = local_train(ctx, self.local_loss(ctx, broadcast))
        return ClientUpdate(sums=weighted_weights_sums(ctx.model, ctx.num_samples), metrics=metrics)

    def local_loss(self, ctx: ClientContext, broadcast: Broadcast) -> LossFn:
        """The client's local objective for this round, built once the broadcast weights are in
        ``ctx.model``. FedAvg: cross-entropy."""
        return lambda x, y: (self.task.loss(ctx.model(x), y), {})
