"""SCAFFOLD (Karimireddy et al., ICML 2020), option II: control variates against client drift.

The server's control variate c estimates the global gradient and client i's c_i its own gradient.
Every local step follows the corrected direction (paper Alg. 1, line 10)::

    y ← y − η_l (∇ℓ(y; b) − c_i + c)

implemented by adding the linear term ``⟨c − c_i, y − x⟩`` (detached c − c_i and x, the round's
global weights) to the cross-entropy, so autograd yields g + c − c_i and momentum, weight decay and
``train.grad_clip`` act on the corrected gradient, as in the official code. Measured from x, the term
is 0 when the round starts and the reported ``train_loss`` stays near the cross-entropy (``ce``). After K local steps (option II, Alg. 1 line 12)::

    c_i⁺ = c_i − c + (x − y) / (K_eff · η_l)

with K = ``train.local_epochs`` · ⌈n_i / ``train.batch_size``⌉ and η_l this round's ``train.lr``. With
SGD momentum ρ > 0 the displacement of K steps is not K·η_l·g, so K_eff = (K − ρ(1 − ρ^K)/(1 − ρ))/(1 − ρ)
(the FedNTD repository's SCAFFOLD; K_eff = K at ρ = 0). Option II assumes SGD: ``train.optimizer=adam``
is refused.

Server (Alg. 1, lines 16–17), with N = ``data.num_clients`` and S the round's clients::

    x ← x + η_g (ȳ − x)          ȳ: the weighted mean of the y_i (``algorithm.weighting``)
    c ← c + (1/N) Σ_{i∈S} Δc_i,   Δc_i = c_i⁺ − c_i

so c stays the mean of all N stored c_i (zeros for clients that never trained; a client whose update
was not finite keeps its c_i and is not summed). Both sums are reduced in the workers. Control
variates live on parameter entries only (zero at BatchNorm buffers, which take the plain mean).
c_i⁺ is the client's state in the client state store; c, with the weights, is the server state, so
both survive checkpoints and resume.

``train.vectorize`` trains a worker's clients as one batched computation
(:mod:`fedray.algorithms.vectorized`) through the ``vectorized_*`` hooks below, with this client
step's maths: each client's ``c − c_i`` is a per-client input (its stored c_i, or zeros), the loss
adds the same linear term, and the new control variate is computed from the client's own K (clients
differ in sample counts, so in steps) by the loop's code (:meth:`Scaffold.client_result`).

Symbols → config keys: η_g → ``algorithm.server_lr`` (1, the paper's experiments); the weighting of
ȳ → ``algorithm.weighting`` (``samples``, so that round 1 equals FedAvg; ``uniform`` is the paper's
1/|S|). The server step is :mod:`fedray.algorithms.server_optimizers`'s, so
``algorithm.server_optimizer`` can also put momentum or Adam on ȳ − x (default ``none``: the
paper's rule).
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

import torch
from pydantic import Field

from fedray.algorithms.base import (
    Broadcast,
    ClientContext,
    ClientUpdate,
    RoundResults,
    ServerState,
    Tensor,
    weighted_sums,
)
from fedray.algorithms.local import local_train
from fedray.algorithms.losses import linear_term
from fedray.algorithms.server_optimizers import ServerOptimizedAlgorithm, ServerOptimizerParams
from fedray.algorithms.uploads import Upload
from fedray.config import ConfigError, RunConfig, TrainConfig
from fedray.data import DatasetInfo
from fedray.models import FedModel, get_flat_weights, set_flat_weights
from fedray.models.weights import parameter_views

CONTROL = "control"  # server-state, broadcast and client-state key of a control variate
CORRECTION = "correction:"  # vectorised inputs: c − c_i of one parameter, keyed CORRECTION + its name


class ScaffoldParams(ServerOptimizerParams):
    weighting: Literal["samples", "uniform"] = Field(
        "samples", description="weights of the client models in ȳ: n_i (FedAvg's) or 1 (the paper's 1/|S|)"
    )


def effective_local_steps(num_steps: int, momentum: float) -> float:
    """K_eff: the number of plain-SGD steps that move as far as ``num_steps`` heavy-ball steps."""
    if momentum == 0:
        return float(num_steps)
    return (num_steps - momentum * (1 - momentum**num_steps) / (1 - momentum)) / (1 - momentum)


def local_steps(num_samples: int, train: TrainConfig) -> int:
    """K = E · ⌈n / B⌉, the number of batches :meth:`ClientContext.batches` yields."""
    return train.local_epochs * math.ceil(num_samples / train.batch_size)


class Scaffold(ServerOptimizedAlgorithm):
    name = "scaffold"
    uploads = ServerOptimizedAlgorithm.uploads | {
        Upload(
            "control variates",
            sums=("delta_control",),
            clipped=(("delta_control", "clip_controls"),),
            compressed=("delta_control",),
            robust=(("delta_control", ""),),
        )
    }
    keeps_client_state = True
    Params = ScaffoldParams
    params: ScaffoldParams
    #: The client step has pure batched hooks (below): train.vectorize may train clients as a group.
    vectorizable: ClassVar[bool] = True

    def __init__(self, config: RunConfig, info: DatasetInfo) -> None:
        super().__init__(config, info)
        if config.train.optimizer != "sgd":
            raise ConfigError(
                "train.optimizer",
                "SCAFFOLD's control-variate update (option II) assumes SGD "
                f"(with or without momentum), got {config.train.optimizer!r}; use train.optimizer=sgd",
            )

    def init_server_state(self, model: FedModel) -> ServerState:
        state = super().init_server_state(model)
        return {**state, CONTROL: torch.zeros_like(state["weights"])}

    def broadcast(self, server_state: ServerState, round: int) -> Broadcast:
        return {"weights": server_state["weights"], CONTROL: server_state[CONTROL]}

    def aggregate(self, server_state: ServerState, round: int, results: RoundResults) -> tuple[ServerState, dict[str, float]]:
        control = (server_state[CONTROL].double() + results.sums["delta_control"] / self.config.data.num_clients).float()
        new_state = {**server_state, **self.server_step(server_state, results), CONTROL: control}
        return new_state, {"control_norm": float(control.norm())}

    def client_update(self, ctx: ClientContext, broadcast: Broadcast) -> ClientUpdate:
        model = ctx.model
        x, control, own_control = self.client_controls(ctx, broadcast)
        set_flat_weights(model, x)
        correction = parameter_views(model, control - own_control)  # fixed for the whole round
        start = parameter_views(model, x)

        def loss_fn(inputs: Tensor, y: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
            base = self.task.loss(model(inputs), y)
            return base + linear_term(model.parameters(), correction, start), {self.task.loss_term: base.detach()}

        metrics = local_train(ctx, loss_fn)
        return self.client_result(ctx, x, control, own_control, get_flat_weights(model), metrics)

    def client_controls(self, ctx: ClientContext, broadcast: Broadcast) -> tuple[Tensor, Tensor, Tensor]:
        """``(x, c, c_i)`` on the client's device: the round's global weights, the server's control
        variate and the client's own (its stored state, or zeros before its first round)."""
        x = broadcast["weights"].to(ctx.device)
        control = broadcast[CONTROL].to(ctx.device)
        own_control = torch.zeros_like(control) if ctx.state is None else ctx.state[CONTROL]
        return x, control, own_control

    def client_result(
        self, ctx: ClientContext, x: Tensor, control: Tensor, own_control: Tensor, y_flat: Tensor, metrics: dict[str, float]
    ) -> ClientUpdate:
        """The client's update from its trained flat weights ``y_flat``: option II's
        ``c_i⁺ = c_i − c + (x − y) / (K_eff · η_l)`` with the client's own K, its weighted weights,
        ``Δc_i`` and its new state (the loop's and the vectorised step's)."""
        steps = effective_local_steps(local_steps(ctx.num_samples, ctx.train), ctx.train.momentum)
        mask = self.parameter_mask.to(ctx.device)
        new_control = torch.where(mask, own_control - control + (x - y_flat) / (steps * ctx.lr), 0.0)
        weight = ctx.num_samples if self.params.weighting == "samples" else 1
        sums = {**weighted_sums(y_flat, weight), "delta_control": (new_control - own_control).double()}
        return ClientUpdate(sums=sums, metrics=metrics, state={CONTROL: new_control})

    # ----------------------------------------------------------------- vectorised client step
    def vectorized_start(self, broadcast: Broadcast) -> Tensor:
        """The flat weights every client of the round starts from: x."""
        return broadcast["weights"]

    def vectorized_inputs(self, ctx: ClientContext, broadcast: Broadcast) -> dict[str, Tensor]:
        """The client's ``c − c_i``, one tensor per parameter (``CORRECTION`` + its name), shaped
        like it: fixed for the round, as the loop's ``correction``."""
        _, control, own_control = self.client_controls(ctx, broadcast)
        views = parameter_views(ctx.model, control - own_control)
        return {CORRECTION + name: view for (name, _), view in zip(ctx.model.named_parameters(), views, strict=True)}

    def vectorized_loss(
        self, base: Tensor, params: dict[str, Tensor], start: dict[str, Tensor], inputs: dict[str, Tensor]
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """The loop's objective: the base loss plus ``⟨c − c_i, y − x⟩`` (x: ``start``)."""
        correction = [inputs[CORRECTION + name] for name in params]
        return base + linear_term(params.values(), correction, start.values()), {self.task.loss_term: base}

    def vectorized_update(
        self, ctx: ClientContext, broadcast: Broadcast, flat: Tensor, metrics: dict[str, float], inputs: dict[str, Tensor]
    ) -> ClientUpdate:
        """:meth:`client_result` of the client's trained flat weights, as the loop's."""
        return self.client_result(ctx, *self.client_controls(ctx, broadcast), flat, metrics)
