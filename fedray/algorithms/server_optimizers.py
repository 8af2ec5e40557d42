"""Server optimizers on the pseudo-gradient: FedAvgM (Hsu et al. 2019) and FedAdagrad, FedAdam,
FedYogi (Reddi et al., ICLR 2021, Alg. 2), usable on top of any algorithm whose server rule is a
weighted mean of the client models.

The clients are unchanged. The server takes the weighted mean ȳ of the client weights (reduced in
the workers, as FedAvg), treats ``Δ = ȳ − x`` as a pseudo-gradient and steps the global model ``x``
(element-wise, on parameter entries; m₋₁ = 0, v₋₁ = τ²)::

    none      x ← x + η Δ                            (η = 1: exactly the weighted mean, FedAvg)
    avgm      m ← β m + Δ;  x ← x + η m               (heavy ball; ``ema``: m ← β m + (1 − β) Δ)
    adagrad   m ← β₁ m + (1 − β₁) Δ;  v ← v + Δ²                          ;  x ← x + η m / (√v + τ)
    adam      m ← β₁ m + (1 − β₁) Δ;  v ← β₂ v + (1 − β₂) Δ²              ;  x ← x + η m / (√v + τ)
    yogi      m ← β₁ m + (1 − β₁) Δ;  v ← v − (1 − β₂) Δ² sign(v − Δ²)    ;  x ← x + η m / (√v + τ)

Reddi's Alg. 2 has no bias correction. Hsu et al. write the FedAvgM step with Δw = x − ȳ, the
opposite sign of Δ here. Buffers (BatchNorm running statistics) take the weighted mean ȳ. The update
runs in float64 and is cast to float32 once (x + (ȳ − x) ≠ ȳ in float32). The moments m, v are part
of the server state, so checkpoints hold them and ``--resume`` continues the same trajectory; they
are never broadcast.

Symbols → config keys (``algorithm.*``). The keys carry a ``server_`` prefix because the project's
names are shared across algorithms: ``algorithm.tau`` is a temperature and ``algorithm.beta`` a loss
weight (FedRCL's divergence penalty), and an algorithm such as FedRCL can combine both with a
server optimizer:

==========  =========================  ======================================================
symbol      key                        meaning (default)
==========  =========================  ======================================================
            ``server_optimizer``       ``none`` | ``avgm`` | ``adam`` | ``yogi`` | ``adagrad`` (none)
η           ``server_lr``              server learning rate (null: 1 for none/avgm, 0.01 adaptive)
β, β₁       ``server_momentum``        avgm momentum β; first-moment decay β₁ (0.9)
β₂          ``server_beta2``           second-moment decay of adam / yogi (0.99)
τ           ``server_tau``             adaptivity constant of adam / yogi / adagrad (1e-3)
            ``server_momentum_form``   avgm: ``heavy_ball`` (Hsu; FedRCL's baseline) | ``ema``
            ``server_v_init``          ``tau2`` (v₋₁ = τ², Reddi) | ``zero``
==========  =========================  ======================================================

FedRCL's paper runs FedAvgM with β = 0.4, η = 1 and FedADAM with β₁ 0.9, β₂ 0.99, τ 1e-3 (η not
stated; 0.01 in its lab's code). Reddi's Alg. 2 also gives FedAdagrad the β₁ momentum: set
``server_momentum: 0`` for plain Adagrad.
"""

from __future__ import annotations

from functools import cached_property
from typing import Literal

import torch
from pydantic import Field

from fedray.algorithms.base import Algorithm, AlgorithmParams, RoundResults, ServerState, Tensor
from fedray.algorithms.uploads import MODEL_WEIGHTS
from fedray.models import FedModel

ServerOptimizerName = Literal["none", "avgm", "adam", "yogi", "adagrad"]
ADAPTIVE = ("adam", "yogi", "adagrad")


class ServerOptimizerParams(AlgorithmParams):
    """The ``algorithm.server_*`` keys; mix into the ``Params`` of any weighted-mean algorithm."""

    server_optimizer: ServerOptimizerName = Field("none", description="optimizer on the pseudo-gradient ȳ − x")
    server_lr: float | None = Field(None, gt=0, description="server learning rate η (null: 1 for none/avgm, 0.01 for adam/yogi/adagrad)")
    server_momentum: float = Field(0.9, ge=0, lt=1, description="avgm momentum β / adaptive first-moment decay β₁")
    server_beta2: float = Field(0.99, ge=0, lt=1, description="second-moment decay β₂ (adam, yogi)")
    server_tau: float = Field(1e-3, gt=0, description="adaptivity constant τ (adam, yogi, adagrad)")
    server_momentum_form: Literal["heavy_ball", "ema"] = Field("heavy_ball", description="avgm: m ← βm + Δ or m ← βm + (1−β)Δ")
    server_v_init: Literal["tau2", "zero"] = Field("tau2", description="initial second moment v₋₁: τ² or 0")

    @property
    def effective_server_lr(self) -> float:
        if self.server_lr is not None:
            return self.server_lr
        return 0.01 if self.server_optimizer in ADAPTIVE else 1.0


class ServerOptimizer:
    """One server step on a weighted mean; ``mask`` marks the parameter entries of the flat layout."""

    def __init__(self, params: ServerOptimizerParams, mask: Tensor) -> None:
        self.params = params
        self.mask = mask

    def init_state(self) -> dict[str, Tensor]:
        """The moments before round 1 (float64, parameter entries only): none for ``none``."""
        name, size = self.params.server_optimizer, int(self.mask.sum())
        if name == "none":
            return {}
        state = {"server_m": torch.zeros(size, dtype=torch.float64)}
        if name in ADAPTIVE:
            v0 = self.params.server_tau**2 if self.params.server_v_init == "tau2" else 0.0
            state["server_v"] = torch.full((size,), v0, dtype=torch.float64)
        return state

    def step(self, server_state: ServerState, mean: Tensor) -> dict[str, Tensor]:
        """``{"weights": x_new (float32), **new moments}`` from the current ``server_state["weights"]``
        and the round's weighted mean ``mean`` (float64, full flat layout)."""
        p, name, lr = self.params, self.params.server_optimizer, self.params.effective_server_lr
        if name == "none" and lr == 1.0:
            return {"weights": mean.float()}
        mask = self.mask.to(mean.device)
        x = server_state["weights"].to(mean.device, torch.float64)[mask]
        delta = mean[mask] - x  # the pseudo-gradient Δ = ȳ − x
        moments: dict[str, Tensor] = {}
        if name == "none":
            step = delta
        elif name == "avgm":
            scale = 1.0 if p.server_momentum_form == "heavy_ball" else 1.0 - p.server_momentum
            step = moments["server_m"] = p.server_momentum * server_state["server_m"] + scale * delta
        else:
            m = moments["server_m"] = p.server_momentum * server_state["server_m"] + (1 - p.server_momentum) * delta
            v, squared = server_state["server_v"], delta * delta
            if name == "adagrad":
                v = v + squared
            elif name == "adam":
                v = p.server_beta2 * v + (1 - p.server_beta2) * squared
            else:  # yogi
                v = v - (1 - p.server_beta2) * squared * torch.sign(v - squared)
            moments["server_v"] = v
            step = m / (v.sqrt() + p.server_tau)
        new = mean.clone()  # buffers: the weighted mean
        new[mask] = x + lr * step
        return {"weights": new.float(), **moments}


class ServerOptimizedAlgorithm(Algorithm):
    """An algorithm whose server rule is the weighted mean of the client weights followed by
    ``algorithm.server_optimizer`` (FedAvg, FedProx, FedRCL, FedLC, ...); clients upload
    ``weighted_sums`` (``"weights"``, ``"num_samples"``). The optimizer needs the
    :class:`ServerOptimizerParams` keys in ``Params``: a subclass whose ``Params`` leave them out
    (e.g. a user's FedAvg variant with its own server rule) gets the plain weighted mean."""

    Params = ServerOptimizerParams
    params: ServerOptimizerParams
    uploads = frozenset({MODEL_WEIGHTS})

    @cached_property
    def server_optimizer(self) -> ServerOptimizer | None:
        if not isinstance(self.params, ServerOptimizerParams):
            return None
        return ServerOptimizer(self.params, self.parameter_mask)

    def init_server_state(self, model: FedModel) -> ServerState:
        state = super().init_server_state(model)
        return state if self.server_optimizer is None else {**state, **self.server_optimizer.init_state()}

    def aggregate(self, server_state: ServerState, round: int, results: RoundResults) -> tuple[ServerState, dict[str, float]]:
        return {**server_state, **self.server_step(server_state, results)}, {}

    def server_step(self, server_state: ServerState, results: RoundResults) -> dict[str, Tensor]:
        """The new ``weights`` (and moments) from the round's ``Σ w_k y_k / Σ w_k``."""
        mean = results.sums["weights"] / results.sums["num_samples"]
        if self.server_optimizer is None:
            return {"weights": mean.float()}
        return self.server_optimizer.step(server_state, mean)
