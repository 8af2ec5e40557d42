"""Siamese self-supervised learning (BYOL, SimSiam) and the linear probe that evaluates its encoders;
shared by Hetero-SSFL and FedAvg+BYOL (docs/algorithms_hetero_ssfl.md).

A Siamese model is a fedray model (``encoder`` f, ``projector`` g) plus a ``predictor`` q, both heads
being ``Linear → BatchNorm → ReLU → Linear`` MLPs (hidden 4096, output 2048, as in the FedU/FedEMA
code; the Hetero-SSFL paper gives no sizes). The representation the clients align is the predictor
output ``Φ(x) = q(g(f(x)))`` (paper Section 3.2).

Local losses on two augmented views ``v1, v2`` of a batch, with ``p_i = q(g(f(v_i)))``:

- BYOL (default): ``(2 - 2 cos(p_1, sg(z^t_2))) + (2 - 2 cos(p_2, sg(z^t_1)))`` with ``z^t_i`` the
  target network's projection; ``byol_loss="mse"`` is the paper's literal ``‖p - z^t‖²``. After every
  optimiser step the target (encoder + projector) moves to ``θ_t ← τ θ_t + (1 - τ) θ``, τ =
  ``algorithm.ema_decay`` (0.99 as in the FedU/FedEMA code; the paper gives no value;
  docs/architecture.md keeps ``algorithm.tau`` for temperatures).
- SimSiam: ``-½ cos(p_1, sg(z_2)) - ½ cos(p_2, sg(z_1))`` with the online projections ``z_i``.

Both views of a batch go through the network in one forward pass of ``2B`` samples, so BatchNorm
sees at least two samples even for a last batch of one image. Views come from
:func:`fedray.data.ssl_views` (per-sample crop, flip, jitter, noise, drawn on the device from the
client's generator); ``data.augmentation`` does not apply. Labels are never used for training.

Linear probe (the paper's linear evaluation; what it leaves open: docs/algorithms_hetero_ssfl.md,
'Ambiguities': linear probe): the frozen encoder's features of the labelled training set train a
``Linear(feature_dim, K)`` (``probe_out_dim`` outputs if set) with cross-entropy and Adam
(lr ``probe_lr`` 3e-3, batch ``probe_batch_size`` 512, ``probe_epochs`` 100); the result is its top-1
accuracy on the test set.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from fedray.algorithms.base import Algorithm, AlgorithmParams, ClientContext, Tensor
from fedray.algorithms.local import local_train
from fedray.algorithms.requirements import CLASS_LABELS, IMAGES
from fedray.config import ModelConfig, RunConfig
from fedray.data import DatasetInfo, ssl_views
from fedray.data.augment import Augmentation
from fedray.models import FedModel, build_model

ONLINE_PREFIXES = ("encoder.", "projector.", "predictor.")  # trained; the classifier is unused
TARGET_PREFIXES = ("encoder.", "projector.")  # BYOL's target network (no predictor)

# () → (extra loss, {term name: value}); an extra term added to the SSL loss at every step
ExtraLoss = Callable[[], tuple[Tensor, dict[str, Tensor]]]


class SSLParams(AlgorithmParams):
    """The SSL and probe keys shared by every Siamese algorithm."""

    ssl: Literal["byol", "simsiam"] = Field("byol", description="local self-supervised method")
    byol_loss: Literal["normalized", "mse"] = Field("normalized", description="BYOL loss form")
    ema_decay: float = Field(0.99, ge=0, lt=1, description="BYOL target decay τ")
    projection_dim: int = Field(2048, gt=0, description="projector/predictor output d (model.projection_dim overrides)")
    hidden_dim: int = Field(4096, gt=0, description="projector/predictor hidden width")
    probe_epochs: int = Field(100, gt=0)
    probe_lr: float = Field(3e-3, gt=0)
    probe_batch_size: int = Field(512, gt=0)
    probe_out_dim: int | None = Field(None, gt=0, description="probe outputs (None: the class count; paper: 1000)")


def mlp_head(in_dim: int, hidden_dim: int, out_dim: int) -> nn.Sequential:
    """``Linear(in, hidden) → BatchNorm1d → ReLU → Linear(hidden, out)``."""
    return nn.Sequential(nn.Linear(in_dim, hidden_dim), nn.BatchNorm1d(hidden_dim), nn.ReLU(), nn.Linear(hidden_dim, out_dim))


def attach_heads(model: FedModel, projection_dim: int, hidden_dim: int) -> FedModel:
    """Give ``model`` the Siamese ``projector`` g and ``predictor`` q (state-dict prefixes
    ``projector.`` and ``predictor.``)."""
    model.projector = mlp_head(model.feature_dim, hidden_dim, projection_dim)
    model.predictor = mlp_head(projection_dim, hidden_dim, projection_dim)
    model.projection_dim = projection_dim
    return model


def represent(model: FedModel, x: Tensor) -> Tensor:
    """``Φ(x) = q(g(f(x)))``, the representation Hetero-SSFL aligns."""
    return model.predictor(model.project(model.encode(x)))


def pair_loss(method: str, p: Tensor, z: Tensor, byol_form: str = "normalized") -> Tensor:
    """One direction of the symmetric loss, batch mean; ``z`` is detached here (stop-gradient)."""
    z = z.detach()
    if method == "simsiam":
        return -0.5 * F.cosine_similarity(p, z, dim=1).mean()
    if byol_form == "mse":
        return (p - z).pow(2).sum(dim=1).mean()
    return (2 - 2 * F.cosine_similarity(p, z, dim=1)).mean()


@torch.no_grad()
def ema_update(pairs: list[tuple[Tensor, Tensor]], decay: float) -> None:
    """``target ← decay · target + (1 - decay) · online`` for each ``(target, online)`` pair."""
    for target, online in pairs:
        target.lerp_(online, 1 - decay)


def target_pairs(target: nn.Module, online: nn.Module) -> list[tuple[Tensor, Tensor]]:
    """The (target, online) parameter pairs of the encoder and projector."""
    online_parameters = dict(online.named_parameters())
    return [(p, online_parameters[name]) for name, p in target.named_parameters() if name.startswith(TARGET_PREFIXES)]


def two_views(info: DatasetInfo) -> Augmentation:
    """An augmentation for ``local_train``: normalised ``x [B, ...]`` → two independent
    :func:`ssl_views` of it, normalised, stacked as ``[2B, ...]`` (view 1 rows first)."""

    def augment(x: Tensor, generator: torch.Generator) -> Tensor:
        mean = torch.tensor(info.mean, device=x.device).view(1, -1, 1, 1)
        std = torch.tensor(info.std, device=x.device).view(1, -1, 1, 1)
        images = x * std + mean  # back to the 0..1 scale ssl_views works on
        return torch.cat([(ssl_views(images, generator) - mean) / std, (ssl_views(images, generator) - mean) / std])

    return augment


@torch.no_grad()
def embed(model: nn.Module, function: Callable[[Tensor], Tensor], x_uint8: Tensor, info: DatasetInfo, batch_size: int) -> Tensor:
    """``function(normalize(x))`` over ``x`` in batches, with ``model`` in eval mode (BatchNorm uses
    its running statistics and is not updated) and no gradient; float32 ``[n, d]``."""
    was_training = model.training
    model.eval()
    try:
        return torch.cat([function(info.normalize(x_uint8[s : s + batch_size])).float() for s in range(0, x_uint8.shape[0], batch_size)])
    finally:
        model.train(was_training)


def linear_probe(
    train_features: Tensor,
    train_labels: Tensor,
    test_features: Tensor,
    test_labels: Tensor,
    num_outputs: int,
    epochs: int,
    lr: float,
    batch_size: int,
    generator: torch.Generator,
) -> dict[str, float]:
    """Train ``Linear(d, num_outputs)`` on frozen features with cross-entropy and Adam; return its
    test ``accuracy`` and mean test cross-entropy ``loss``. Initialisation uses torch's global RNG,
    the batch order ``generator``."""
    device = train_features.device
    train_features, test_features = train_features.detach(), test_features.detach()
    classifier = nn.Linear(train_features.shape[1], num_outputs).to(device)
    optimizer = torch.optim.Adam(classifier.parameters(), lr=lr)
    num_samples = int(train_labels.shape[0])
    with torch.enable_grad():
        for _ in range(epochs):
            order = torch.randperm(num_samples, generator=generator).to(device)
            for start in range(0, num_samples, batch_size):
                index = order[start : start + batch_size]
                loss = F.cross_entropy(classifier(train_features[index]), train_labels[index])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
    with torch.no_grad():
        logits = classifier(test_features)
        return {
            "accuracy": float((logits.argmax(dim=1) == test_labels).float().mean()),
            "loss": float(F.cross_entropy(logits, test_labels)),
        }


class SiameseAlgorithm(Algorithm):
    """Shared base (not itself registered: no ``name``): models with Siamese heads, a BYOL target per
    model key on each worker, the local SSL loop and the linear probe."""

    Params = SSLParams
    requires = frozenset({IMAGES, CLASS_LABELS})  # two image augmentations as views; a linear probe on class labels

    def __init__(self, config: RunConfig, info: DatasetInfo) -> None:
        super().__init__(config, info)
        if self.params.probe_out_dim is not None and self.params.probe_out_dim < info.num_classes:
            raise ValueError(f"algorithm.probe_out_dim ({self.params.probe_out_dim}) must be >= the class count ({info.num_classes})")
        self._targets: dict[str, FedModel] = {}

    def model_config(self, key: str) -> ModelConfig:
        """The architecture of model ``key`` (default: the ``model`` section)."""
        return self.config.model

    def build_model(self, key: str) -> FedModel:
        cfg = self.model_config(key)
        # model.projection_dim sizes the Siamese heads here, not the factory's MOON projection head.
        model = build_model(cfg.model_copy(update={"projection_dim": None}), self.info, self.config.data.task)
        return attach_heads(model, cfg.projection_dim or self.params.projection_dim, self.params.hidden_dim)

    def target_model(self, key: str, device: torch.device) -> FedModel | None:
        """The worker's BYOL target network for model ``key`` (None for SimSiam); weights are the
        caller's to load. Its parameters never require gradients."""
        if self.params.ssl != "byol":
            return None
        if key not in self._targets:
            self._targets[key] = self.build_model(key).to(device).requires_grad_(False)
        return self._targets[key]

    def train_local(self, ctx: ClientContext, target: FedModel | None, extra_loss: ExtraLoss | None = None) -> dict[str, float]:
        """``train.local_epochs`` of the SSL loss (plus ``extra_loss``) on the client's images,
        updating the online encoder, projector and predictor (and the target by EMA)."""
        model, params = ctx.model, self.params
        online = [p for name, p in model.named_parameters() if name.startswith(ONLINE_PREFIXES)]
        if target is not None:
            target.train()  # batch statistics, as the online network (standard BYOL)
            pairs = target_pairs(target, model)

        def loss_fn(views: Tensor, _labels: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
            z = model.project(model.encode(views))
            p1, p2 = model.predictor(z).chunk(2)
            if target is None:
                r1, r2 = z.chunk(2)
            else:
                with torch.no_grad():
                    r1, r2 = target.project(target.encode(views)).chunk(2)
            loss = pair_loss(params.ssl, p1, r2, params.byol_loss) + pair_loss(params.ssl, p2, r1, params.byol_loss)
            terms = {"ssl_loss": loss.detach()}
            if extra_loss is not None:
                extra, extra_terms = extra_loss()
                loss = loss + extra
                terms.update(extra_terms)
            return loss, terms

        after_step = None if target is None else (lambda: ema_update(pairs, params.ema_decay))
        return local_train(replace(ctx, augment=two_views(ctx.info)), loss_fn, online, after_step=after_step)

    def probe(self, ctx: ClientContext, train: tuple[Tensor, Tensor], test: tuple[Tensor, Tensor]) -> dict[str, float]:
        """Linear-probe accuracy and loss of ``ctx.model``'s frozen encoder (see the module docstring)."""
        model, batch = ctx.model, self.config.eval.batch_size
        train_features = embed(model, model.encode, train[0], self.info, batch)
        test_features = embed(model, model.encode, test[0], self.info, batch)
        p = self.params
        return linear_probe(
            train_features,
            train[1],
            test_features,
            test[1],
            p.probe_out_dim or self.info.num_classes,
            p.probe_epochs,
            p.probe_lr,
            p.probe_batch_size,
            ctx.generator,
        )

    def probe_metrics(self, ctx: ClientContext, train: tuple[Tensor, Tensor], test: tuple[Tensor, Tensor]) -> dict[str, float]:
        """:meth:`probe` as the round metrics of a global encoder: ``probe_accuracy`` (also
        ``test_accuracy``) and ``test_loss``."""
        result = self.probe(ctx, train, test)
        return {"probe_accuracy": result["accuracy"], "test_accuracy": result["accuracy"], "test_loss": result["loss"]}
