"""The shared client of the divergence-aware federated BYOL methods, FedU and FedEMA (Zhuang et al.,
ICCV 2021 and ICLR 2022), following their authors' code (EasyFL ``applications/fedssl``).

Unlike FedAvg+BYOL (:mod:`fedray.algorithms.fedavg_byol`), which averages and broadcasts the target
network too, each client keeps its BYOL *target* network (encoder + projector) to itself; only the
online network (``encoder.`` + ``projector.`` + ``predictor.``) is uploaded and averaged. A client's
state (the client state store) is its online network, its target network and the divergence d of its
last local training (plus FedEMA's scaler λ_k).

Per round a client:

* **first participation**: online ← the global online network; target ← its encoder + projector;
* **later participations**: target ← its own stored target; the online network is formed from the
  global and its own stored online network by the method's rule (:meth:`DivergenceAwareBYOL.start_online`:
  FedU's divergence-aware predictor update, FedEMA's divergence-aware moving average);
* trains ``train.local_epochs`` of BYOL (:meth:`SiameseAlgorithm.train_local`; the target follows the
  online network by ``algorithm.ema_decay`` after every step);
* measures d = the mean over the encoder's ``nn.Conv2d`` weights W (selected by module type) of
  ‖W_end − W_start‖₂, the change of this round's training (EasyFL ``_calculate_divergence``; EasyFL
  selects parameters named "conv", which skips ResNet shortcut convolutions);
* uploads ``n_k · online_k``; the server takes the sample-weighted mean (FedAvg; the sums are
  reduced in the workers).

Evaluation: the linear probe of :mod:`fedray.algorithms.ssl` on the *global* online encoder
(``probe_accuracy``, also ``test_accuracy``), as EasyFL tests the aggregated encoder. Only BYOL is
supported (``algorithm.ssl`` must be ``byol``).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import nn

from fedray.algorithms.base import Broadcast, ClientContext, ClientUpdate, ServerState, Tensor, weighted_sums
from fedray.algorithms.ssl import ONLINE_PREFIXES, TARGET_PREFIXES, SiameseAlgorithm, SSLParams
from fedray.config import RunConfig
from fedray.data import DatasetInfo
from fedray.models import FedModel, get_flat_weights, set_flat_weights

PREDICTOR_PREFIXES = ("predictor.",)  # the online-only head (FedU keeps or replaces it)


class DivergenceAwareParams(SSLParams):
    ssl: Literal["byol"] = Field("byol", description="local self-supervised method (BYOL only: the target stays local)")


def encoder_conv_weights(model: nn.Module) -> list[Tensor]:
    """The weights of every ``nn.Conv2d`` under ``model.encoder`` (module order)."""
    return [m.weight for m in model.encoder.modules() if isinstance(m, nn.Conv2d)]


@torch.no_grad()
def mean_divergence(start: list[Tensor], end: list[Tensor]) -> float:
    """``mean_i ‖end_i − start_i‖₂`` over paired weight tensors (each flattened)."""
    return float(torch.stack([torch.dist(e.double(), s.double(), 2) for s, e in zip(start, end)]).mean())


class DivergenceAwareBYOL(SiameseAlgorithm):
    """FedU's and FedEMA's common client and server (not registered: no ``name``)."""

    keeps_client_state = True

    Params = DivergenceAwareParams

    def __init__(self, config: RunConfig, info: DatasetInfo) -> None:
        super().__init__(config, info)
        with torch.device("meta"):
            if not encoder_conv_weights(self.build_model(self.model_key(None))):
                raise ValueError(f"{self.name}: the divergence needs convolutions in the encoder; model {config.model.name} has none")

    def init_server_state(self, model: FedModel) -> ServerState:
        """The seeded initial online network; no target (it never leaves a client)."""
        return {"weights": get_flat_weights(model, ONLINE_PREFIXES)}

    def start_online(self, ctx: ClientContext, global_online: Tensor) -> tuple[dict[str, float], dict[str, Tensor]]:
        """Load this round's starting online network into ``ctx.model`` for a client with stored
        state; return per-client metrics and extra state entries to store."""
        raise NotImplementedError

    def client_update(self, ctx: ClientContext, broadcast: Broadcast) -> ClientUpdate:
        model = ctx.model
        target = self.target_model(self.model_key(ctx.client_id), ctx.device)
        assert target is not None  # BYOL only
        if ctx.state is None:
            set_flat_weights(model, broadcast["weights"], ONLINE_PREFIXES)
            set_flat_weights(target, get_flat_weights(model, TARGET_PREFIXES), TARGET_PREFIXES)
            metrics: dict[str, float] = {}
            extra_state: dict[str, Tensor] = {}
        else:
            metrics, extra_state = self.start_online(ctx, broadcast["weights"].to(ctx.device))
            set_flat_weights(target, ctx.state["target"], TARGET_PREFIXES)
        start = [w.detach().clone() for w in encoder_conv_weights(model)]
        metrics.update(self.train_local(ctx, target))
        divergence = mean_divergence(start, encoder_conv_weights(model))
        online = get_flat_weights(model, ONLINE_PREFIXES)
        state = {
            "online": online,
            "target": get_flat_weights(target, TARGET_PREFIXES),
            "divergence": torch.tensor(divergence, dtype=torch.float64),
            **extra_state,
        }
        return ClientUpdate(sums=weighted_sums(online, ctx.num_samples), metrics={**metrics, "divergence": divergence}, state=state)

    def evaluation_clients(self, num_clients: int) -> list[int]:
        return [0]

    def evaluate_on_test_set(
        self, ctx: ClientContext, broadcast: Broadcast, train: tuple[Tensor, Tensor], test: tuple[Tensor, Tensor]
    ) -> dict[str, float]:
        """The linear probe of the global online encoder."""
        set_flat_weights(ctx.model, broadcast["weights"], ONLINE_PREFIXES)
        return self.probe_metrics(ctx, train, test)
