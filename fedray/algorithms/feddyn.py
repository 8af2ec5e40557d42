"""FedDyn (Acar et al., ICLR 2021): federated learning with dynamic regularisation.

Each client's linear and proximal terms make its local optimum consistent with the global
stationary point; the server corrects the model average by the accumulated client drift.

**Client** (paper Alg. 1, Eq. 1): with θ^{t−1} the received server model and λ_k the client's state
(λ_k = −∇L_k(θ_k)/α, so that λ_k = Σ over its past rounds of (θ_k − θ_broadcast), starting at 0)::

    L = CE + α_k ⟨λ_k, θ − θ^{t−1}⟩ + (α_k / 2) ‖θ − θ^{t−1}‖²        (on parameters)
    after training: λ_k ← λ_k + (θ_k − θ^{t−1})

The linear term is added with λ_k detached, so autograd adds α_k λ_k to every gradient (the official
code's form). It is measured from θ^{t−1}: the paper's ⟨λ_k, θ⟩ shifted by a constant, with the same
gradient, so the reported ``train_loss`` starts each round at the cross-entropy instead of drifting
below zero. ``alpha_scaling: size`` uses α_k = α / (n_k / n̄) with n̄ the mean client size, as the
official code (``alpemreacar/FedDyn``); ``none`` is the paper's α_k = α. The two agree for
equal-size clients.

**Server** (Alg. 1, in the official code's form without 1/α): with N = ``data.num_clients``, P the
round's clients and S = Σ over all N clients of their λ_k (so non-participants still count)::

    S  ← S + Σ_{k∈P} (θ_k − θ^{t−1})
    θ̄ = mean of the θ_k over P        (``weighting: uniform``, the paper's; ``samples``: n_k-weighted)
    θᵗ = θ̄ + S / N                    (= θ̄ − h/α in the paper's notation)

on parameter entries; buffers take θ̄. The server reduces only sums: Σ θ_k (and Σ n_k θ_k with
``samples``) are reduced in the workers, and Σ(θ_k − θ^{t−1}) = Σ θ_k − |P| θ^{t−1}. θᵗ is
broadcast; ``eval_model: average`` (the official script's reported model) evaluates θ̄, ``server``
evaluates θᵗ. The server state {weights θᵗ, average θ̄, lambda_sum S} is checkpointed; λ_k lives in the
client state store. Not a weighted mean, so ``algorithm.server_optimizer`` does not apply.

Symbols → config keys: α → ``algorithm.dyn_alpha`` (0.01, the official CIFAR-10 example; the key
``alpha`` is the Dirichlet ``data.alpha``), α_k → ``algorithm.alpha_scaling`` (``size`` | ``none``),
θ̄ vs θᵗ for evaluation → ``algorithm.eval_model`` (``average`` | ``server``), the mean →
``algorithm.weighting`` (``uniform`` | ``samples``). The official code also clips gradients at 10
and uses lr 0.1, E = 5, weight decay 1e-3: those are ``train.*`` settings, not FedDyn.

``train.vectorize`` trains a worker's clients as one batched computation
(:mod:`fedray.algorithms.vectorized`) through the ``vectorized_*`` hooks below, with this client
step's maths: each client's α_k λ_k (the linear term's direction) and α_k/2 are per-client inputs,
the loss adds the same linear and proximal terms to θ^{t−1}, and λ_k's update is the loop's code
(:meth:`FedDyn.client_result`).
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
from pydantic import Field

from fedray.algorithms.base import (
    Algorithm,
    AlgorithmParams,
    Broadcast,
    ClientContext,
    ClientUpdate,
    RoundResults,
    ServerState,
    Tensor,
    weighted_sums,
)
from fedray.algorithms.local import LossFn, local_train
from fedray.algorithms.losses import linear_term, proximal_term
from fedray.models import FedModel, get_flat_weights, set_flat_weights
from fedray.models.weights import parameter_views

LAMBDA = "lambda"  # client-state key of λ_k (flat layout, zero at buffers)
DIRECTION = "direction:"  # vectorised inputs: α_k λ_k of one parameter, keyed DIRECTION + its name
HALF_ALPHA = "half_alpha"  # vectorised input: α_k / 2, the proximal term's weight


class FedDynParams(AlgorithmParams):
    dyn_alpha: float = Field(0.01, gt=0, description="FedDyn's regularisation weight α (> 0: the server divides by it)")
    alpha_scaling: Literal["size", "none"] = Field("size", description="α_k = α·n̄/n_k (official code) or α (paper)")
    eval_model: Literal["average", "server"] = Field("average", description="evaluate the client average θ̄ or the server model θᵗ")
    weighting: Literal["uniform", "samples"] = Field("uniform", description="θ̄: plain mean (paper) or n_k-weighted mean")


class FedDyn(Algorithm):
    name = "feddyn"
    keeps_client_state = True
    Params = FedDynParams
    params: FedDynParams
    #: The client step has pure batched hooks (below): train.vectorize may train clients as a group.
    vectorizable: ClassVar[bool] = True

    # ----------------------------------------------------------------- server side
    def init_server_state(self, model: FedModel) -> ServerState:
        weights = get_flat_weights(model)
        return {"weights": weights, "average": weights.clone(), "lambda_sum": torch.zeros(weights.shape, dtype=torch.float64)}

    def broadcast(self, server_state: ServerState, round: int) -> Broadcast:
        broadcast = {"weights": server_state["weights"]}
        if self.params.eval_model == "average":
            broadcast["average"] = server_state["average"]
        return broadcast

    def aggregate(self, server_state: ServerState, round: int, results: RoundResults) -> tuple[ServerState, dict[str, float]]:
        sums, mask = results.sums, self.parameter_mask
        previous = server_state["weights"].double()
        total = sums.get("weights_sum", sums["weights"])  # Σ θ_k (uniform weighting: the weighted sum is it)
        drift = torch.where(mask, total - results.num_clients * previous, 0.0)
        lambda_sum = server_state["lambda_sum"] + drift
        average = sums["weights"] / sums["num_samples"]
        weights = torch.where(mask, average + lambda_sum / self.config.data.num_clients, average)
        new_state = {"weights": weights.float(), "average": average.float(), "lambda_sum": lambda_sum}
        return new_state, {"lambda_sum_norm": float(lambda_sum.norm())}

    # ----------------------------------------------------------------- client side
    def client_alpha(self, ctx: ClientContext) -> float:
        """α_k: α, or α·n̄/n_k with ``alpha_scaling: size``."""
        if self.params.alpha_scaling == "none":
            return self.params.dyn_alpha
        assert ctx.mean_client_samples is not None, "the worker sets ClientContext.mean_client_samples"
        return self.params.dyn_alpha * ctx.mean_client_samples / ctx.num_samples

    def local_loss(self, ctx: ClientContext, lam: Tensor, alpha_k: float) -> LossFn:
        """CE + α_k⟨λ_k, θ − θ^{t−1}⟩ + (α_k/2)‖θ − θ^{t−1}‖², with θ^{t−1} the weights now in
        ``ctx.model``. The paper's α_k⟨λ_k, θ⟩ differs by a constant: same gradient, but no lower
        bound on the reported loss."""
        model = ctx.model
        anchors = [p.detach().clone() for p in model.parameters()]
        linear_directions = [alpha_k * d for d in parameter_views(model, lam)]

        def loss_fn(x: Tensor, y: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
            base = self.task.loss(model(x), y)
            proximal = proximal_term(model.parameters(), anchors)
            loss = base + linear_term(model.parameters(), linear_directions, anchors) + 0.5 * alpha_k * proximal
            return loss, {self.task.loss_term: base.detach(), "proximal": proximal.detach()}

        return loss_fn

    def client_update(self, ctx: ClientContext, broadcast: Broadcast) -> ClientUpdate:
        previous = broadcast["weights"].to(ctx.device)
        set_flat_weights(ctx.model, previous)
        lam = self.client_lambda(ctx, previous)
        metrics = local_train(ctx, self.local_loss(ctx, lam, self.client_alpha(ctx)))
        return self.client_result(ctx, previous, lam, get_flat_weights(ctx.model), metrics)

    def client_lambda(self, ctx: ClientContext, previous: Tensor) -> Tensor:
        """λ_k: the client's stored state, or zeros before its first round."""
        return torch.zeros_like(previous) if ctx.state is None else ctx.state[LAMBDA]

    def client_result(self, ctx: ClientContext, previous: Tensor, lam: Tensor, trained: Tensor, metrics: dict[str, float]) -> ClientUpdate:
        """The client's update from its trained flat weights: ``λ_k ← λ_k + (θ_k − θ^{t−1})`` on
        parameters, and its sums (the loop's and the vectorised step's)."""
        new_lambda = torch.where(self.parameter_mask.to(ctx.device), lam + trained - previous, 0.0)
        if self.params.weighting == "uniform":
            sums = weighted_sums(trained, 1)
        else:
            sums = {**weighted_sums(trained, ctx.num_samples), "weights_sum": trained.double()}
        return ClientUpdate(sums=sums, metrics=metrics, state={LAMBDA: new_lambda})

    # ----------------------------------------------------------------- vectorised client step
    def vectorized_start(self, broadcast: Broadcast) -> Tensor:
        """The flat weights every client of the round starts from: θ^{t−1}."""
        return broadcast["weights"]

    def vectorized_inputs(self, ctx: ClientContext, broadcast: Broadcast) -> dict[str, Tensor]:
        """The client's linear direction α_k λ_k, one tensor per parameter (``DIRECTION`` + its
        name), computed as :meth:`local_loss` computes it, and α_k/2 (a float32 scalar, as the loop's
        Python float meets a float32 tensor)."""
        previous = broadcast["weights"].to(ctx.device)
        lam, alpha_k = self.client_lambda(ctx, previous), self.client_alpha(ctx)
        model = ctx.model
        directions = {
            DIRECTION + name: alpha_k * d for (name, _), d in zip(model.named_parameters(), parameter_views(model, lam), strict=True)
        }
        return {**directions, HALF_ALPHA: torch.tensor(0.5 * alpha_k, dtype=torch.float32, device=ctx.device)}

    def vectorized_loss(
        self, base: Tensor, params: dict[str, Tensor], start: dict[str, Tensor], inputs: dict[str, Tensor]
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """:meth:`local_loss`'s objective: ``base + α_k⟨λ_k, θ − θ^{t−1}⟩ + (α_k/2)‖θ − θ^{t−1}‖²``
        (θ^{t−1}: ``start``)."""
        proximal = proximal_term(params.values(), start.values())
        directions = [inputs[DIRECTION + name] for name in params]
        loss = base + linear_term(params.values(), directions, start.values()) + inputs[HALF_ALPHA] * proximal
        return loss, {self.task.loss_term: base, "proximal": proximal}

    def vectorized_update(
        self, ctx: ClientContext, broadcast: Broadcast, flat: Tensor, metrics: dict[str, float], inputs: dict[str, Tensor]
    ) -> ClientUpdate:
        """:meth:`client_result` of the client's trained flat weights, as the loop's."""
        previous = broadcast["weights"].to(ctx.device)
        return self.client_result(ctx, previous, self.client_lambda(ctx, previous), flat, metrics)

    # ----------------------------------------------------------------- evaluation
    def load_global_model(self, model: FedModel, broadcast: Broadcast) -> FedModel:
        set_flat_weights(model, broadcast["average" if self.params.eval_model == "average" else "weights"])
        return model
