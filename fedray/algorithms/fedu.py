"""FedU (Zhuang et al., "Collaborative Unsupervised Visual Representation Learning from Decentralized
Data", ICCV 2021): federated BYOL with a divergence-aware predictor update (DAPU).

The client and server are those of :mod:`fedray.algorithms.divergence_byol` (targets stay on their
clients, online networks are averaged, the global encoder is linear-probed). At every participation
after its first, a client (EasyFL ``update_encoder=online``, ``update_predictor=dapu``):

* takes the global online encoder and projector;
* takes the global predictor only if the divergence d_prev it measured at its *previous*
  participation is below the threshold μ, and keeps its own predictor otherwise (paper Eq. 3);
* keeps its own target network.

Since training starts from the global encoder, d is the mean per-conv-layer ‖W_global − W_trained‖₂.

Paper symbol → config key: μ (DAPU threshold) → ``algorithm.dapu_threshold`` (0.4, EasyFL's
``--dapu_threshold``; an absolute L2 scale set for ResNet-18 on CIFAR — rescale it for other models)
— not ``algorithm.mu``, which fedray keeps for loss weights. ``.inf`` always takes the global predictor
(and equals FedEMA with ``lam: 0``), ``0`` always keeps the client's own. BYOL target decay →
``algorithm.ema_decay``; heads, probe and ``ssl`` keys as :class:`~fedray.algorithms.ssl.SSLParams`.
"""

from __future__ import annotations

import math

from pydantic import Field, field_validator

from fedray.algorithms.base import ClientContext, Tensor
from fedray.algorithms.divergence_byol import PREDICTOR_PREFIXES, DivergenceAwareBYOL, DivergenceAwareParams
from fedray.algorithms.ssl import ONLINE_PREFIXES
from fedray.models import get_flat_weights, set_flat_weights


class FedUParams(DivergenceAwareParams):
    dapu_threshold: float = Field(
        0.4, allow_inf_nan=True, description="DAPU threshold μ: take the global predictor when the last divergence is below it"
    )

    @field_validator("dapu_threshold")
    @classmethod
    def _not_nan(cls, value: float) -> float:
        if math.isnan(value):
            raise ValueError("must be a number or ±.inf, not NaN")
        return value


class FedU(DivergenceAwareBYOL):
    name = "fedu"
    Params = FedUParams
    params: FedUParams

    def start_online(self, ctx: ClientContext, global_online: Tensor) -> tuple[dict[str, float], dict[str, Tensor]]:
        """Global encoder + projector; the global predictor iff d_prev < μ (DAPU), else the client's own."""
        assert ctx.state is not None
        model = ctx.model
        take_global = float(ctx.state["divergence"]) < self.params.dapu_threshold
        set_flat_weights(model, ctx.state["online"], ONLINE_PREFIXES)
        own_predictor = get_flat_weights(model, PREDICTOR_PREFIXES)
        set_flat_weights(model, global_online, ONLINE_PREFIXES)
        if not take_global:
            set_flat_weights(model, own_predictor, PREDICTOR_PREFIXES)
        return {"global_predictor": float(take_global)}, {}
