"""FedEMA (Zhuang et al., "Divergence-aware Federated Self-Supervised Learning", ICLR 2022): federated
BYOL with a divergence-aware moving average of the global model into each client's own.

The client and server are those of :mod:`fedray.algorithms.divergence_byol` (targets stay on their
clients, online networks are averaged, the global encoder is linear-probed). At every participation
after its first, a client does not overwrite its online network with the global one but mixes them
(paper Eq. 4–5, EasyFL ``ema_online``/``ema_predictor``):

    μ = min(λ_k · d_prev, 1),        W_k ← μ · W_k + (1 − μ) · W_g

over the whole online network (encoder, projector and predictor, BatchNorm statistics included;
in float64), where d_prev is the divergence the client measured at its *previous* participation and
W_k its stored online network. The more a client diverged, the more of its own model it keeps.

The scaler λ_k is fixed at a client's first EMA: the auto scaler λ_k = τ / d_prev (so μ = τ exactly
at the second participation), or the constant ``algorithm.lam`` when it is set. If d_prev is 0 there,
μ = min(τ, 1) and λ_k stays unset until a positive divergence arrives.

Paper symbol → config key: τ (the auto scaler's target μ) → ``algorithm.scaler_target`` (0.7, the
EasyFL README; its ``main.py`` default is 0.8) — not ``algorithm.tau``, which fedray keeps for
contrastive temperatures; λ (constant scaler) → ``algorithm.lam`` (None: the auto scaler); μ is
derived each round, not a key; the BYOL target decay → ``algorithm.ema_decay`` (0.99); heads,
probe and ``ssl`` keys as :class:`~fedray.algorithms.ssl.SSLParams`.

With ``lam: 0`` every client takes the global online network (μ = 0) and FedEMA is FedU with
``dapu_threshold: .inf`` bit for bit.
"""

from __future__ import annotations

import torch
from pydantic import Field

from fedray.algorithms.base import ClientContext, Tensor
from fedray.algorithms.divergence_byol import DivergenceAwareBYOL, DivergenceAwareParams
from fedray.algorithms.fedcosr import mix_shared
from fedray.algorithms.ssl import ONLINE_PREFIXES
from fedray.models import set_flat_weights


class FedEMAParams(DivergenceAwareParams):
    scaler_target: float = Field(0.7, gt=0, description="auto scaler target τ: μ at a client's second participation")
    lam: float | None = Field(None, ge=0, description="constant scaler λ (None: the auto scaler λ_k = τ / d)")


def ema_weight(divergence: float, scaler: float | None, target: float, constant: float | None) -> tuple[float, float | None]:
    """``(μ, λ_k)`` for a client whose previous divergence is ``divergence`` and whose scaler so far
    is ``scaler`` (None before its first EMA): μ = min(λ_k · d, 1); the auto scaler λ_k = τ / d is
    set at the first EMA with d > 0, where μ = min(τ, 1) exactly."""
    if constant is not None:
        return min(constant * divergence, 1.0), constant
    if scaler is None:
        return min(target, 1.0), (target / divergence if divergence > 0 else None)
    return min(scaler * divergence, 1.0), scaler


class FedEMA(DivergenceAwareBYOL):
    name = "fedema"
    Params = FedEMAParams
    params: FedEMAParams

    def start_online(self, ctx: ClientContext, global_online: Tensor) -> tuple[dict[str, float], dict[str, Tensor]]:
        """W_k ← μ W_k + (1 − μ) W_g over the online network (Eq. 4–5)."""
        assert ctx.state is not None
        stored_scaler = float(ctx.state["scaler"]) if "scaler" in ctx.state else None
        mu, scaler = ema_weight(float(ctx.state["divergence"]), stored_scaler, self.params.scaler_target, self.params.lam)
        set_flat_weights(ctx.model, mix_shared(ctx.state["online"], global_online, mu), ONLINE_PREFIXES)
        extra = {} if scaler is None else {"scaler": torch.tensor(scaler, dtype=torch.float64)}
        return {"ema_mu": mu}, extra
