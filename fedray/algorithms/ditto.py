"""Ditto (Li et al., "Ditto: Fair and Robust Federated Learning Through Personalization", ICML 2021).

Every client k keeps a personal model v_k next to the global model w, and solves (paper Eq. 2)

    min_v  F_k(v) + λ/2 · ‖v − w*‖²

while w itself is trained by an ordinary FedAvg. Per round (paper Alg. 1), a client:

1. **Global step**: loads the received w^t, trains ``train.local_epochs`` of cross-entropy exactly as
   ``fedavg`` (same optimiser, same batches from ``ctx.generator``) and uploads ``n_k · w_k`` (summed
   in the workers); the server takes the sample-weighted mean, so the global model is bit-identical
   to FedAvg's for every λ.
2. **Personal step**: loads its own v_k (θ_0 at its first participation, so λ = 0 is Local) and takes
   ``personal_epochs`` epochs of ``v ← v − η_p (∇F_k(v) + λ (v − w^t))`` — cross-entropy plus
   ``λ/2 ‖v − w^t‖²`` on the parameters, with the *received* w^t as the anchor, through a fresh
   momentum-free SGD (PFLlib's ``PerturbedGradientDescent``; ``train.weight_decay`` and
   ``train.grad_clip`` still apply). v_k, BatchNorm buffers included, is stored in the client state
   store and never leaves the client. The personal step runs after the global step, so it draws its
   batches after the global step's; PFLlib runs it first.

Paper symbol → config key: λ → ``algorithm.mu`` (a proximal weight: the project's μ, as FedProx's;
the paper's letter is λ); s (personal epochs) → ``algorithm.personal_epochs`` (None: ``train.local_epochs``);
η_p → ``algorithm.personal_lr`` (None: the round's ``train.lr`` after decay); η, E, R → ``train.lr``,
``train.local_epochs``, ``train.rounds``.

Evaluation: ``personal_accuracy`` (``eval.personalized`` with ``data.client_test_fraction > 0``) is
each client's v_k (θ_0 for a client that never trained) on its held-out split; unlike FedPer-style
methods, ``test_accuracy`` is the global w on the global test set, a meaningful FedAvg model.
The server state also keeps θ_0 (``initial_model``, broadcast with w) to start every v_k from it.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from pydantic import Field

from fedray.algorithms.base import AlgorithmParams, Broadcast, ClientContext, ClientUpdate, ServerState, evaluation_sums
from fedray.algorithms.local import local_train
from fedray.algorithms.losses import proximal_term
from fedray.algorithms.personalized import PersonalizedAlgorithm
from fedray.models import FedModel, get_flat_weights, set_flat_weights


class DittoParams(AlgorithmParams):
    mu: float = Field(0.1, ge=0, description="proximal weight λ of the personal objective (paper Eq. 2)")
    personal_epochs: int | None = Field(None, ge=0, description="personal-step epochs s (None: train.local_epochs)")
    personal_lr: float | None = Field(None, gt=0, description="personal-step lr η_p (None: the round's train.lr)")


class Ditto(PersonalizedAlgorithm):
    """The split shares everything (w is a whole global model); v_k is the client state."""

    name = "ditto"
    Params = DittoParams
    params: DittoParams

    def personal_prefixes(self) -> tuple[str, ...]:
        return ()

    def init_server_state(self, model: FedModel) -> ServerState:
        return {**super().init_server_state(model), "initial_model": get_flat_weights(model)}

    def client_update(self, ctx: ClientContext, broadcast: Broadcast) -> ClientUpdate:
        params, model = self.params, ctx.model
        # 1. the global step: FedAvg's client update
        set_flat_weights(model, broadcast["weights"])
        anchor = [p.detach().clone() for p in model.parameters()]  # the received w^t
        global_metrics = local_train(ctx, lambda x, y: (self.task.loss(model(x), y), {}))
        sums = self.shared_sums(get_flat_weights(model), ctx.num_samples)
        # 2. the personal step: a fresh momentum-free SGD on CE + λ/2 ‖v − w^t‖²
        self.load_personal_model(ctx, broadcast)
        personal_ctx = replace(
            ctx,
            train=ctx.train.model_copy(update={"optimizer": "sgd", "momentum": 0.0}),
            lr=ctx.lr if params.personal_lr is None else params.personal_lr,
        )
        epochs = ctx.train.local_epochs if params.personal_epochs is None else params.personal_epochs

        def personal_loss(x: torch.Tensor, y: torch.Tensor):
            base = self.task.loss(model(x), y)
            proximal = proximal_term(model.parameters(), anchor)
            return base + 0.5 * params.mu * proximal, {self.task.loss_term: base.detach(), "proximal": proximal.detach()}

        personal_metrics = local_train(personal_ctx, personal_loss, epochs=epochs)
        metrics = {**global_metrics, **{f"personal_{k}": v for k, v in personal_metrics.items()}}
        metrics.update(self.post_train_metrics(ctx, broadcast))
        return ClientUpdate(sums=sums, metrics=metrics, state={"personal_model": get_flat_weights(model)})

    def load_personal_model(self, ctx: ClientContext, broadcast: Broadcast) -> None:
        """v_k into ``ctx.model``: the stored one, or θ_0 before the client's first round."""
        personal = broadcast["initial_model"] if ctx.state is None else ctx.state["personal_model"]
        set_flat_weights(ctx.model, personal)

    def evaluate_client(self, ctx: ClientContext, broadcast: Broadcast) -> dict[str, float]:
        """v_k on the client's held-out split."""
        assert ctx.x_test is not None and ctx.y_test is not None
        self.load_personal_model(ctx, broadcast)
        return evaluation_sums(self, ctx.model, broadcast, ctx.x_test, ctx.y_test, self.config.eval.batch_size)
