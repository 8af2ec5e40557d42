"""FedAvg (McMahan et al., AISTATS 2017): local SGD on the task's loss (cross-entropy for classification), sample-weighted averaging.

Server: ``w ← Σ_k n_k w_k / Σ_k n_k`` over the round's clients. The weighted sums are reduced inside
each worker. ``algorithm.server_optimizer`` (default ``none``) steps the global model along the
pseudo-gradient ``ȳ − w`` instead (FedAvgM, FedAdam, FedYogi, FedAdagrad; keys in
:mod:`fedray.algorithms.server_optimizers`).

Algorithms that change only the local objective (FedProx, FedLC, FedNTD, FedDecorr) subclass
:class:`FedAvg` and override :meth:`FedAvg.local_loss`.

``train.vectorize`` trains a worker's clients as one batched computation
(:mod:`fedray.algorithms.vectorized`) through the ``vectorized_*`` hooks below, the same client
step written as pure functions of stacked parameters; FedAvgM, FedAdam, FedYogi and FedAdagrad
inherit them (their clients are FedAvg's). A subclass that changes the client step is vectorised
only where it declares ``vectorizable`` itself, with its own hooks (FedProx).
"""

from __future__ import annotations

from typing import ClassVar

from fedray.algorithms.base import Broadcast, ClientContext, ClientUpdate, Tensor, weighted_sums, weighted_weights_sums
from fedray.algorithms.local import LossFn, local_train
from fedray.algorithms.server_optimizers import ServerOptimizedAlgorithm, ServerOptimizerParams
from fedray.models import set_flat_weights


class FedAvgParams(ServerOptimizerParams):
    pass


class FedAvg(ServerOptimizedAlgorithm):
    name = "fedavg"
    Params = FedAvgParams
    #: The client step has pure batched hooks (below): train.vectorize may train clients as a group.
    vectorizable: ClassVar[bool] = True

    def client_update(self, ctx: ClientContext, broadcast: Broadcast) -> ClientUpdate:
        set_flat_weights(ctx.model, broadcast["weights"])
        metrics = local_train(ctx, self.local_loss(ctx, broadcast))
        return ClientUpdate(sums=weighted_weights_sums(ctx.model, ctx.num_samples), metrics=metrics)

    def local_loss(self, ctx: ClientContext, broadcast: Broadcast) -> LossFn:
        """The client's local objective for this round, built once the broadcast weights are in
        ``ctx.model``. FedAvg: cross-entropy."""
        return lambda x, y: (self.task.loss(ctx.model(x), y), {})

    # ----------------------------------------------------------------- vectorised client step
    def vectorized_start(self, broadcast: Broadcast) -> Tensor:
        """The flat weights every client of the round starts from (as :meth:`client_update` loads them)."""
        return broadcast["weights"]

    def vectorized_inputs(self, ctx: ClientContext, broadcast: Broadcast) -> dict[str, Tensor]:
        """Per-client tensors :meth:`vectorized_loss` reads, stacked over a group. FedAvg: none."""
        return {}

    def vectorized_loss(
        self, base: Tensor, params: dict[str, Tensor], start: dict[str, Tensor], inputs: dict[str, Tensor]
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """:meth:`local_loss` as a pure function of one client's mean base loss ``base`` of a batch,
        its parameters ``params``, the start parameters ``start`` and its ``inputs`` (run under
        ``torch.func.vmap`` and ``grad``). FedAvg: the base loss."""
        return base, {}

    def vectorized_update(
        self, ctx: ClientContext, broadcast: Broadcast, flat: Tensor, metrics: dict[str, float], inputs: dict[str, Tensor]
    ) -> ClientUpdate:
        """What :meth:`client_update` returns, from the client's trained flat weights ``flat``."""
        return ClientUpdate(sums=weighted_sums(flat, ctx.num_samples), metrics=metrics)
