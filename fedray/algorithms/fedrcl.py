"""FedRCL (Seo, Kim, Kim, Han, CVPR 2024): relaxed contrastive learning at every level of the backbone.

Maths and choices: docs/algorithms_fedrcl.md. The server is FedAvg and clients upload only their weights; what
changes is the local objective (paper Alg. 1; the two parts' separate weights are the official code's)::

    L = CE(logits, y) + w_scl · (1/L) Σ_l L_scl^l + β · (1/L) Σ_l L_pen^l

over the levels ``l`` of the model's :meth:`~fedray.models.FedModel.forward_with_taps` (paper and
code: equal weights; ResNet-18's five pre-ReLU taps conv1, conv2_x … conv5_x; ``cnn_small``'s ``conv1``,
``conv2``, ``fc``). Each level is global-average-pooled and L2-normalised; similarities and
log-sum-exps are computed in float32 even under autocast (``exp(1/τ) = e^20`` overflows fp16).

Paper symbols → config keys:

==========  ==========================  =========================================================
symbol      key                         meaning (default)
==========  ==========================  =========================================================
τ           ``algorithm.tau``           contrastive temperature, in SCL and penalty (0.05)
β           ``algorithm.beta``          divergence-penalty weight (1); β = 0 is the FedSCL ablation
λ           ``algorithm.lam``           similarity threshold of the penalty (0.7)
w_scl       ``algorithm.scl_weight``    weight of the SCL part (1; implicit in the paper)
levels      ``algorithm.levels``        tap names used as levels (all taps; ``[stage4]`` is Table 4's
                                        last-layer-only ablation on ResNet-18)
==========  ==========================  =========================================================

Two forms of the relaxed loss, switched by ``algorithm.variant`` (why: docs/algorithms_fedrcl.md,
'Ambiguities', loss form):

- ``official`` (default; the official code's ``CLLoss``, which produced the paper's numbers):
  hard-mined. Per anchor i, the positive is the least similar same-class sample (i itself
  included, so a singleton's positive is s_ii = 1) against the ``k_neg`` = 2 most similar samples of
  other classes: ``ℓ_scl = −log softmax`` at the positive. The penalty treats i itself as the
  positive and the least similar *other* same-class sample q as the negative, only if s_iq ≥ λ:
  ``ℓ_pen = log(e^{s_ii/τ} + e^{s_iq/τ}) − s_ii/τ``. Both are averaged over all n anchors.
  ``k_pos`` > 1 (official variant only) takes that many least-similar samples, as the code does.
- ``paper``: Eq. (5), normalised as docs/algorithms_fedrcl.md, 'Ambiguities' explains: the
  supervised contrastive loss of Eq. (2)/(3) (mean over Pos(i), denominator over all k ≠ i) plus,
  once per anchor,
  ``β · log(1 + Σ_{k∈P_λ(i)} e^{(s_ik − 1)/τ})`` with P_λ(i) = {k ≠ i, y_k = y_i, s_ik > λ}: Eq. (5)'s
  ``log(Σ_{P_λ} e^{s/τ} + e^{1/τ})`` minus the constant 1/τ, so it is ≥ 0 and 0 when no pair is over λ.
  Averaged over anchors that have a positive (0 if none). ``pos_reduction: sum`` is the literal
  reading (sum over positives, penalty × |Pos(i)|).

Deviations from the official code, all of which only shift the loss by a constant: its penalty adds
e^{−1/τ} for every non-selected slot (a similarity of −1, ≈4e-18 per anchor at τ = 0.05), which is
dropped here; the code's ``s ≥ λ`` is kept for ``official``, the paper's ``s > λ`` for ``paper``.

Local optimisation (paper and code), from existing keys: per-round decay ``train.lr_decay`` (0.998: the
round-t learning rate is ``train.lr · 0.998^(t−1)``), ``train.grad_clip`` (10) and
``train.weight_decay`` (1e-3). ``algorithm.epoch_lr_decay`` (0.998, the code's per-epoch LambdaLR)
multiplies the rate by ``0.998^e`` in local epoch e; it is done by restarting the optimiser at every
epoch, which is exact for the momentum-free SGD FedRCL uses, so it is refused with momentum or Adam
(set it to 1 there). ``algorithm.weighted`` (False) picks the sample-weighted mean instead
of the paper's unweighted mean of client models. Mixed precision is not part of the runtime.

Server optimizers (FedRCL's Table 5 / B combine client methods with FedAvgM and FedADAM):
``algorithm.server_optimizer`` and the ``server_*`` keys of
:mod:`fedray.algorithms.server_optimizers` step the global model along the mean's pseudo-gradient.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal, Sequence

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator

from fedray.algorithms.base import (
    Broadcast,
    ClientContext,
    ClientUpdate,
    weighted_weights_sums,
)
from fedray.algorithms.local import LossFn, local_train
from fedray.algorithms.losses import batch_cosine_similarities, supervised_contrastive_per_anchor
from fedray.algorithms.requirements import CLASS_LABELS, FEATURE_TAPS
from fedray.algorithms.server_optimizers import ServerOptimizedAlgorithm, ServerOptimizerParams
from fedray.config import RunConfig
from fedray.data import DatasetInfo
from fedray.models import set_flat_weights

Tensor = torch.Tensor

# Logit of an excluded entry: finite, so that masked rows never produce inf − inf = NaN gradients.
_EXCLUDED_LOGIT = -1e30
# Fill for similarities (in [−1, 1]) that must lose a "least similar" / "most similar" selection.
_ABOVE_ANY_SIMILARITY = 3.0
_BELOW_ANY_SIMILARITY = -3.0


class FedRCLParams(ServerOptimizerParams):
    variant: Literal["official", "paper"] = Field("official", description="official: hard-mined loss of the authors' code; paper: Eq. (5)")
    tau: float = Field(0.05, gt=0, description="contrastive temperature τ")
    beta: float = Field(1.0, ge=0, description="divergence-penalty weight β (0: plain SCL, FedSCL)")
    lam: float = Field(0.7, description="similarity threshold λ of the penalty (> 1 disables it; 1 already does for paper)")
    scl_weight: float = Field(1.0, ge=0, description="weight w_scl of the supervised contrastive part")
    k_pos: int = Field(1, ge=1, description="official: least-similar same-class samples per anchor")
    k_neg: int = Field(2, ge=1, description="official: most similar other-class samples per anchor")
    pos_reduction: Literal["mean", "sum"] = Field(
        "mean", description="paper: mean over positives (Appendix B) or the literal sum of Eq. (5)"
    )
    levels: list[str] | None = Field(None, description="model tap names used as levels (None: every tap of the model)")
    epoch_lr_decay: float = Field(0.998, gt=0, le=1, description="learning rate × epoch_lr_decay^e in local epoch e (1: off)")
    weighted: bool = Field(False, description="sample-weighted mean of client models (False: unweighted, as the paper)")

    @model_validator(mode="after")
    def _variant_specific_keys(self) -> "FedRCLParams":
        if self.variant == "paper" and (self.k_pos, self.k_neg) != (1, 2):
            raise ValueError("algorithm.k_pos / algorithm.k_neg apply to variant 'official' only")
        if self.variant == "official" and self.pos_reduction != "mean":
            raise ValueError("algorithm.pos_reduction applies to variant 'paper' only")
        if self.levels is not None and not self.levels:
            raise ValueError("algorithm.levels must name at least one tap (or be null for all taps)")
        return self


@dataclass(frozen=True)
class RCLTerms:
    """The two parts of the relaxed contrastive loss (scalars, averaged over anchors and levels)."""

    scl: Tensor
    penalty: Tensor

    def total(self, params: FedRCLParams) -> Tensor:
        """``w_scl · scl + β · penalty``."""
        return params.scl_weight * self.scl + params.beta * self.penalty


# --------------------------------------------------------------------- the loss, one level


def official_rcl_terms(similarities: Tensor, labels: Tensor, tau: float, lam: float, k_pos: int = 1, k_neg: int = 2) -> RCLTerms:
    """The official code's hard-mined loss (``CLLoss``) from fp32 cosine similarities ``[n, n]``."""
    n = labels.shape[0]
    same = labels[:, None] == labels[None, :]
    others = same & ~torch.eye(n, dtype=torch.bool, device=labels.device)
    k_p, k_n = min(k_pos, n), min(k_neg, n)

    # SCL: one InfoNCE row per mined positive, all against the same mined negatives.
    pos_sims, pos_index = similarities.masked_fill(~same, _ABOVE_ANY_SIMILARITY).topk(k_p, dim=1, largest=False)
    pos_found = same.gather(1, pos_index)
    neg_sims, neg_index = similarities.masked_fill(same, _BELOW_ANY_SIMILARITY).topk(k_n, dim=1)
    neg_logits = torch.where((~same).gather(1, neg_index), neg_sims / tau, _EXCLUDED_LOGIT)
    pos_logits = pos_sims / tau
    rows = torch.cat([pos_logits.unsqueeze(2), neg_logits.unsqueeze(1).expand(-1, k_p, -1)], dim=2)
    # The code averages over k_pos rows and a missing positive contributes 0 to that mean.
    scl = torch.where(pos_found, rows.logsumexp(dim=2) - pos_logits, 0.0).sum(dim=1) / k_pos

    # Penalty: the anchor is its own positive; the least similar other same-class samples are its
    # negatives when their similarity is at least λ (≥, as in the code).
    gate_sims, gate_index = similarities.masked_fill(~others, _ABOVE_ANY_SIMILARITY).topk(k_p, dim=1, largest=False)
    gated = others.gather(1, gate_index) & (gate_sims >= lam)
    self_logit = similarities.diagonal().unsqueeze(1) / tau
    gated_logits = torch.where(gated, gate_sims / tau, _EXCLUDED_LOGIT)
    penalty = (torch.cat([self_logit, gated_logits], dim=1).logsumexp(dim=1) - self_logit.squeeze(1)) / k_pos
    return RCLTerms(scl=scl.mean(), penalty=penalty.mean())


def paper_rcl_terms(
    similarities: Tensor, labels: Tensor, tau: float, lam: float, pos_reduction: Literal["mean", "sum"] = "mean"
) -> RCLTerms:
    """Eq. (5), normalised as the module docstring says, from fp32 cosine similarities ``[n, n]``."""
    n = labels.shape[0]
    others = (labels[:, None] == labels[None, :]) & ~torch.eye(n, dtype=torch.bool, device=labels.device)
    scl, has_positive = supervised_contrastive_per_anchor(similarities, labels, tau, pos_reduction)

    over_threshold = others & (similarities > lam)
    shifted = torch.where(over_threshold, (similarities - 1.0) / tau, _EXCLUDED_LOGIT)
    penalty = torch.cat([torch.zeros_like(shifted[:, :1]), shifted], dim=1).logsumexp(dim=1)  # log(1 + Σ e^{(s−1)/τ})
    if pos_reduction == "sum":
        penalty = penalty * others.sum(dim=1)  # inside Eq. (5)'s sum over positives

    anchor_weights = has_positive.float() / has_positive.sum().clamp_min(1)
    return RCLTerms(scl=(scl * anchor_weights).sum(), penalty=(penalty * anchor_weights).sum())


def relaxed_contrastive_terms(features: Tensor, labels: Tensor, params: FedRCLParams) -> RCLTerms:
    """The relaxed contrastive loss of one level: ``features`` ``[n, d]`` (any float dtype), ``labels`` ``[n]``."""
    similarities = batch_cosine_similarities(features)
    if params.variant == "official":
        return official_rcl_terms(similarities, labels, params.tau, params.lam, params.k_pos, params.k_neg)
    return paper_rcl_terms(similarities, labels, params.tau, params.lam, params.pos_reduction)


# --------------------------------------------------------------------- several levels


def pool_level(tap: Tensor) -> Tensor:
    """A level's contrastive feature (as in the official code): the global average pool of a
    ``[n, C, H, W]`` map (in at least float32), or a ``[n, D]`` tap as it is."""
    if tap.dim() == 4:
        return tap.to(torch.promote_types(tap.dtype, torch.float32)).mean(dim=(2, 3))
    if tap.dim() == 2:
        return tap
    raise ValueError(f"a FedRCL level must be [n, C, H, W] or [n, D], got shape {tuple(tap.shape)}")


def multi_level_rcl_terms(taps: Sequence[Tensor], labels: Tensor, params: FedRCLParams) -> RCLTerms:
    """The equal-weight mean (paper and code) of :func:`relaxed_contrastive_terms` over the levels."""
    per_level = [relaxed_contrastive_terms(pool_level(tap), labels, params) for tap in taps]
    return RCLTerms(
        scl=torch.stack([terms.scl for terms in per_level]).mean(),
        penalty=torch.stack([terms.penalty for terms in per_level]).mean(),
    )


# --------------------------------------------------------------------- the algorithm


class FedRCL(ServerOptimizedAlgorithm):
    name = "fedrcl"
    requires = frozenset({CLASS_LABELS, FEATURE_TAPS})
    Params = FedRCLParams
    params: FedRCLParams

    def __init__(self, config: RunConfig, info: DatasetInfo) -> None:
        super().__init__(config, info)
        with torch.device("meta"):  # only the tap names are needed: allocate nothing
            tap_names = list(self.build_model(self.model_key(None)).tap_names)
        wanted = tap_names if self.params.levels is None else self.params.levels
        unknown = [name for name in wanted if name not in tap_names]
        if unknown:
            raise ValueError(f"algorithm.levels: {unknown} are not taps of model {config.model.name!r} (allowed: {tap_names})")
        self.level_indices = [tap_names.index(name) for name in wanted]
        train = config.train
        if self.params.epoch_lr_decay != 1 and (train.optimizer != "sgd" or train.momentum > 0):
            raise ValueError(
                f"algorithm.epoch_lr_decay={self.params.epoch_lr_decay} restarts the optimiser every local "
                f"epoch, which is exact only for momentum-free SGD; with train.optimizer={train.optimizer} "
                f"and train.momentum={train.momentum} set algorithm.epoch_lr_decay=1"
            )

    def client_update(self, ctx: ClientContext, broadcast: Broadcast) -> ClientUpdate:
        model = ctx.model
        set_flat_weights(model, broadcast["weights"])

        def loss_fn(x: Tensor, y: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
            logits, _, taps = model.forward_with_taps(x)
            ce = F.cross_entropy(logits, y)
            rcl = multi_level_rcl_terms([taps[i] for i in self.level_indices], y, self.params)
            return ce + rcl.total(self.params), {"ce": ce.detach(), "scl": rcl.scl.detach(), "penalty": rcl.penalty.detach()}

        metrics = self._local_train(ctx, loss_fn)
        weight = ctx.num_samples if self.params.weighted else 1  # 1: every client counts the same
        return ClientUpdate(sums=weighted_weights_sums(model, weight), metrics=metrics)

    def _local_train(self, ctx: ClientContext, loss_fn: LossFn) -> dict[str, float]:
        """:func:`local_train`, with the learning rate × ``epoch_lr_decay^e`` in local epoch e."""
        decay = self.params.epoch_lr_decay
        if decay == 1:
            return local_train(ctx, loss_fn)
        epochs = [local_train(replace(ctx, lr=ctx.lr * decay**e), loss_fn, epochs=1) for e in range(ctx.train.local_epochs)]
        # every epoch has the same number of steps, so the mean of the epoch means is the step mean
        return {name: sum(epoch[name] for epoch in epochs) / len(epochs) for name in epochs[0]}
