"""FedAvg over a Siamese SSL model ("FedBYOL" / "FedSimSiam", baselines of the Hetero-SSFL paper):
the homogeneous-client baseline of Hetero-SSFL.

Every client trains the same architecture (the ``model`` section) with the local SSL loss of
:mod:`fedray.algorithms.ssl` on its unlabelled images; the server takes the sample-weighted mean
(FedAvg) of the online encoder, projector and predictor and, for BYOL, of the target network too, so
the whole Siamese model is global and clients keep no state. ``algorithm.ssl=simsiam`` gives
FedSimSiam. The SSL keys (``ssl``, ``byol_loss``, ``ema_decay`` = BYOL τ, ``projection_dim``,
``hidden_dim``) and the probe keys are those of :class:`~fedray.algorithms.ssl.SSLParams`.

Evaluation: the linear probe of :mod:`fedray.algorithms.ssl` on the global encoder
(``probe_accuracy``, also reported as ``test_accuracy``). Every client holds the global model, so
client 0's evaluation context probes it once per evaluation.
"""

from __future__ import annotations

import torch

from fedray.algorithms.base import Broadcast, ClientContext, ClientUpdate, ServerState, Tensor, weighted_sums
from fedray.algorithms.ssl import ONLINE_PREFIXES, TARGET_PREFIXES, SiameseAlgorithm
from fedray.models import FedModel, get_flat_weights, num_flat_weights, set_flat_weights


class FedAvgBYOL(SiameseAlgorithm):
    name = "fedavg_byol"

    def _split(self, model: FedModel, weights: Tensor) -> tuple[Tensor, Tensor]:
        """The global vector as (online part, target part); the target part is empty for SimSiam."""
        online = num_flat_weights(model, ONLINE_PREFIXES)
        return weights[:online], weights[online:]

    def _load(self, model: FedModel, target: FedModel | None, weights: Tensor) -> None:
        online, target_weights = self._split(model, weights)
        set_flat_weights(model, online, ONLINE_PREFIXES)
        if target is not None:
            set_flat_weights(target, target_weights, TARGET_PREFIXES)

    def _flat(self, model: FedModel, target: FedModel | None) -> Tensor:
        parts = [get_flat_weights(model, ONLINE_PREFIXES)]
        if target is not None:
            parts.append(get_flat_weights(target, TARGET_PREFIXES))
        return torch.cat(parts)

    def init_server_state(self, model: FedModel) -> ServerState:
        """The seeded initial online model; a BYOL target starts as a copy of it. Aggregation is the
        base class's FedAvg mean of the clients' ``n_k · weights``."""
        return {"weights": self._flat(model, model if self.params.ssl == "byol" else None)}

    def client_update(self, ctx: ClientContext, broadcast: Broadcast) -> ClientUpdate:
        target = self.target_model(self.model_key(ctx.client_id), ctx.device)
        self._load(ctx.model, target, broadcast["weights"])
        metrics = self.train_local(ctx, target)
        return ClientUpdate(sums=weighted_sums(self._flat(ctx.model, target), ctx.num_samples), metrics=metrics)

    def evaluation_clients(self, num_clients: int) -> list[int]:
        return [0]

    def evaluate_on_test_set(
        self, ctx: ClientContext, broadcast: Broadcast, train: tuple[Tensor, Tensor], test: tuple[Tensor, Tensor]
    ) -> dict[str, float]:
        online, _ = self._split(ctx.model, broadcast["weights"])
        set_flat_weights(ctx.model, online, ONLINE_PREFIXES)
        return self.probe_metrics(ctx, train, test)
