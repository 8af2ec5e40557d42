"""Contrastive and prototype losses shared by the client steps of several algorithms.

The prototype losses are InfoNCE over a ``[B, anchors]`` logits matrix; the algorithms differ only
in which anchors they compare against and which anchors count as positives:

- FedSC's RPCL (FedSC Eq. 13–14) and FedSKC's LCL (FedSKC Eq. 2–3; docs/algorithms_prototypes.md):
  :func:`prototype_contrastive_loss`, a multi-positive InfoNCE (:func:`multi_positive_info_nce`)
  with similarity cos / 𝒰 (:func:`scaled_cosine`, :func:`distance_scale`); the official codes'
  forms are :func:`single_mean_positive_contrastive_loss` and :func:`duplicated_positive_anchor_loss`;
- MOON's model-contrastive loss (Li et al. 2021): :func:`model_contrastive_loss`.

:func:`prototype_distance` is the pull toward a target prototype (FedSC's CPDR, FedProto's
regulariser). None of these lets a gradient reach the anchors / prototypes. The in-batch
supervised contrastive pieces serve FedRCL.

The global-model baselines' terms close the module: :func:`proximal_term` (FedProx, FedDyn),
:func:`linear_term` (SCAFFOLD's and FedDyn's gradient corrections), :func:`logit_calibrated_cross_entropy`
(FedLC), :func:`not_true_distillation` (FedNTD) and :func:`decorrelation_loss` (FedDecorr). FedProc's
prototype InfoNCE is :func:`prototype_contrastive_loss` with one prototype per class.
"""

from __future__ import annotations

from typing import Iterable, Literal

import torch
import torch.nn.functional as F

from fedray.algorithms.prototypes import class_means, class_sums

Tensor = torch.Tensor

COSINE_EPS = 1e-8  # cos(a, b) = aᵀb / (‖a‖‖b‖ + ε); the papers give no ε
MIN_DISTANCE_SCALE = 1e-6  # lower clamp of 𝒰 (fedray's choice; the papers give none)

DistanceMetric = Literal["mse", "l2", "l1"]


def cosine_matrix(features: Tensor, anchors: Tensor) -> Tensor:
    """``[B, P]`` cosine similarities ``aᵀb / (‖a‖₂‖b‖₂ + 1e-8)`` of ``features`` ``[B, d]`` with
    ``anchors`` ``[P, d]`` (gradient flows into ``features`` only)."""
    anchors = anchors.detach()
    norms = features.norm(dim=1, keepdim=True) * anchors.norm(dim=1).unsqueeze(0)
    return features @ anchors.T / (norms + COSINE_EPS)


def distance_scale(features: Tensor, anchors: Tensor) -> Tensor:
    """𝒰 per anchor: the mean Euclidean distance of ``features`` ``[n, d]`` to each anchor ``[P, d]``,
    detached and clamped at ≥ 1e-6 (FedSC Eq. 13's 𝒰, FedSKC Eq. 2's 𝒰_j). Called on a batch this is
    fedray's default per-batch estimate (``u_mode="batch"``, docs/algorithms_prototypes.md,
    'Ambiguities': u_mode); on a client's whole split it is the papers' dataset mean."""
    return torch.cdist(features.detach(), anchors.detach()).mean(0).clamp_min(MIN_DISTANCE_SCALE)


def scaled_cosine(features: Tensor, anchors: Tensor, scale: Tensor | None) -> Tensor:
    """``s(z, r) = cos(z, r) / 𝒰(r)`` as a ``[B, P]`` matrix; ``scale=None`` means 𝒰 = 1."""
    similarity = cosine_matrix(features, anchors)
    return similarity if scale is None else similarity / scale.unsqueeze(0)


def multi_positive_info_nce(logits: Tensor, positives: Tensor) -> Tensor:
    """Per-row ``−log( Σ_pos exp(g) / Σ_all exp(g) ) = logsumexp(g) − logsumexp(g[pos])``.

    ``logits`` ``[B, P]`` (already divided by the temperature; ``-inf`` entries are ignored) and a
    boolean ``positives`` mask of the same shape. Rows without a positive are dropped **before** the
    log-sum-exps, so their (undefined) loss cannot put NaN into the gradient. Returns the ``[B']``
    losses of the kept rows. With exactly one positive per row this is ``F.cross_entropy``.
    """
    keep = positives.any(dim=1)
    logits, positives = logits[keep], positives[keep]
    return torch.logsumexp(logits, dim=1) - torch.logsumexp(logits.masked_fill(~positives, float("-inf")), dim=1)


def mean_or_zero(losses: Tensor, reference: Tensor) -> Tensor:
    """The mean of ``losses``, or a zero connected to ``reference``'s graph when there are none (a
    batch whose samples all lack an anchor: the term vanishes, the step stays finite)."""
    return losses.mean() if losses.numel() > 0 else reference.sum() * 0.0


def prototype_contrastive_loss(
    features: Tensor, labels: Tensor, prototypes: Tensor, prototype_classes: Tensor, tau: float, scale: Tensor | None
) -> Tensor:
    """Class-anchor InfoNCE in the papers' form, with ``g = cos(z, r) / 𝒰(r) / τ``:

    - FedSC's RPCL (Eq. 13–14): ``prototypes`` are every client's relational prototypes, so every
      prototype of the sample's class is a positive (multi-positive, sum inside the log);
    - FedSKC's LCL (Eq. 3): ``prototypes`` are the global knowledge vectors, one per class, so this
      is ``F.cross_entropy(g, y)`` over the classes present.

    ``features`` ``[B, d]``, ``prototypes`` ``[P, d]`` with class ids ``prototype_classes`` ``[P]``,
    ``scale`` the per-prototype 𝒰 ``[P]`` (None: 𝒰 = 1). Mean over the samples whose class has at
    least one prototype (the others are skipped: the papers assume every class has one); 0 if none has."""
    logits = scaled_cosine(features, prototypes, scale) / tau
    positives = prototype_classes.unsqueeze(0) == labels.unsqueeze(1)
    return mean_or_zero(multi_positive_info_nce(logits, positives), features)


def first_positive_info_nce(logits: Tensor) -> Tensor:
    """``F.cross_entropy(logits, 0)``: InfoNCE whose positive is column 0 of every row."""
    return F.cross_entropy(logits, torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device))


def single_mean_positive_contrastive_loss(
    features: Tensor, labels: Tensor, prototypes: Tensor, prototype_classes: Tensor, tau: float
) -> Tensor:
    """RPCL as the official FedSC code shapes it (``rpcl_variant="single_mean_positive"``):
    one positive, the mean of the prototypes of the sample's class; negatives, every prototype of
    another class; plain cosine (no 𝒰). Samples whose class has no prototype are skipped."""
    classes, index = torch.unique(prototype_classes, return_inverse=True)
    mean_per_class = class_means(*class_sums(prototypes, index, len(classes)))  # [C', d], one per class present
    own_class = classes.unsqueeze(0) == labels.unsqueeze(1)  # [B, C']
    keep = own_class.any(dim=1)
    if not bool(keep.any()):
        return mean_or_zero(features.new_zeros(0), features)
    features, labels, own_class = features[keep], labels[keep], own_class[keep]
    positive = cosine_matrix(features, mean_per_class)[own_class].unsqueeze(1)  # [B', 1]
    negatives = cosine_matrix(features, prototypes)
    negatives = negatives.masked_fill(prototype_classes.unsqueeze(0) == labels.unsqueeze(1), float("-inf"))
    return first_positive_info_nce(torch.cat([positive, negatives], dim=1) / tau)


def duplicated_positive_anchor_loss(features: Tensor, labels: Tensor, anchors: Tensor, anchor_classes: Tensor, tau: float) -> Tensor:
    """LCL as the official FedSKC code computes it (``lcl_variant="code"``): logits
    ``[cos(l, c̃^y), cos(l, c̃^1), …, cos(l, c̃^C')] / τ`` with target 0, so the positive is counted
    twice; plain cosine (no 𝒰). Samples whose class has no anchor are skipped."""
    own_class = anchor_classes.unsqueeze(0) == labels.unsqueeze(1)
    keep = own_class.any(dim=1)
    if not bool(keep.any()):
        return mean_or_zero(features.new_zeros(0), features)
    logits = cosine_matrix(features[keep], anchors) / tau
    return first_positive_info_nce(torch.cat([logits[own_class[keep]].unsqueeze(1), logits], dim=1))


def model_contrastive_loss(
    representation: Tensor, global_representation: Tensor, previous_representation: Tensor | None, tau: float
) -> Tensor:
    """MOON's ℓ_con (Li et al. 2021, Eq. 3): ``−log( e^{sim(z, z_glob)/τ} / (e^{sim(z, z_glob)/τ} +
    e^{sim(z, z_prev)/τ}) )``, mean over the batch, sim = cosine. Without a previous local model
    (the client's first participation) there is no negative and the loss is exactly 0."""
    positive = F.cosine_similarity(representation, global_representation.detach(), dim=1)
    if previous_representation is None:
        return (positive * 0.0).mean()
    negative = F.cosine_similarity(representation, previous_representation.detach(), dim=1)
    return first_positive_info_nce(torch.stack([positive, negative], dim=1) / tau)


def prototype_distance(features: Tensor, targets: Tensor, metric: DistanceMetric = "mse") -> Tensor:
    """Pull of ``features`` ``[B, d]`` toward their target prototypes ``[B, d]`` (no gradient into
    the targets): ``"mse"`` = (1/(B·d)) Σ‖z − o‖₂² (FedSC's CPDR default and FedProto's
    ``nn.MSELoss``), ``"l2"`` = mean ‖z − o‖₂, ``"l1"`` = mean ‖z − o‖₁ (FedSC Eq. 15, whose literal
    reading is L1 and whose proof uses L2; ``cpdr_metric``).
    Zero for an empty batch."""
    if features.shape[0] == 0:
        return features.sum() * 0.0
    difference = features - targets.detach()
    if metric == "mse":
        return difference.pow(2).mean()
    if metric == "l2":
        return torch.linalg.vector_norm(difference, dim=1).mean()
    if metric == "l1":
        return difference.abs().sum(dim=1).mean()
    raise ValueError(f"unknown prototype distance {metric!r}; expected 'mse', 'l2' or 'l1'")


# --------------------------------------------------------------------- in-batch supervised contrast
# (FedRCL, docs/algorithms_fedrcl.md; any algorithm contrasting the samples of a batch with each other)


def batch_cosine_similarities(features: Tensor) -> Tensor:
    """``[n, n]`` cosine similarities of the rows of ``features`` ``[n, d]`` with each other, in
    float32 (float64 inputs stay float64) and outside autocast (``exp(s/τ)`` reaches e^20 at τ = 0.05, beyond fp16). Unlike
    :func:`cosine_matrix` the gradient flows into both sides. Rows are normalised by
    ``max(‖z‖₂, 1e-12)`` (``F.normalize``), so a zero row has similarity 0 to everything, not NaN."""
    with torch.autocast(device_type=features.device.type, enabled=False):
        unit = F.normalize(features.to(torch.promote_types(features.dtype, torch.float32)), dim=1, eps=1e-12)
        return unit @ unit.T


def supervised_contrastive_per_anchor(
    similarities: Tensor, labels: Tensor, tau: float, pos_reduction: Literal["mean", "sum"] = "mean"
) -> tuple[Tensor, Tensor]:
    """The supervised contrastive loss of every anchor of a batch (Khosla et al. 2020; FedRCL Eq. 2–3)::

        ℓ_i = r_i · Σ_{j ∈ Pos(i)} [ log Σ_{k ≠ i} exp(s_ik / τ) − s_ij / τ ]

    with Pos(i) = {j ≠ i : y_j = y_i} and r_i = 1/|Pos(i)| (``"mean"``) or 1 (``"sum"``). The
    denominator runs over every other sample, positives included. ``similarities`` ``[n, n]`` (see
    :func:`batch_cosine_similarities`), ``labels`` ``[n]``. Returns ``(ℓ [n], has_positive [n])``;
    ℓ_i = 0 with a zero gradient where Pos(i) is empty (average over ``has_positive`` anchors)."""
    n = labels.shape[0]
    self_mask = torch.eye(n, dtype=torch.bool, device=labels.device)
    positives = (labels.unsqueeze(1) == labels.unsqueeze(0)) & ~self_mask
    logits = similarities / tau
    # a finite fill (not -inf): a row with no other sample must not give inf - inf = NaN gradients
    log_denominator = logits.masked_fill(self_mask, -1e30).logsumexp(dim=1, keepdim=True)
    losses = torch.where(positives, log_denominator - logits, 0.0).sum(dim=1)
    counts = positives.sum(dim=1)
    if pos_reduction == "mean":
        losses = losses / counts.clamp_min(1)
    elif pos_reduction != "sum":
        raise ValueError(f"unknown pos_reduction {pos_reduction!r}; expected 'mean' or 'sum'")
    return losses, counts > 0


# --------------------------------------------------------------------- global-model baselines


def proximal_term(parameters: Iterable[Tensor], anchors: Iterable[Tensor]) -> Tensor:
    """``Σ_p ‖p − a_p‖²`` over matching parameter / anchor tensors (FedProx Eq. 2 and FedDyn's
    quadratic term, both without their ½·weight)."""
    return sum(((p - a) ** 2).sum() for p, a in zip(parameters, anchors, strict=True))


def linear_term(parameters: Iterable[Tensor], directions: Iterable[Tensor], anchors: Iterable[Tensor]) -> Tensor:
    """``Σ_p ⟨d_p, p − a_p⟩`` with the directions and anchors detached: added to a loss, it adds ``d``
    to every gradient, so momentum, weight decay and clipping act on the corrected gradient
    (SCAFFOLD's ``c − c_i``, FedDyn's ``α λ_k``). Measured from the anchors (the weights the round
    started from), it is 0 at the start of a round, so the reported ``train_loss`` stays near the
    cross-entropy; ``⟨d, p⟩`` alone, with the same gradient, has no lower bound and made it negative."""
    return sum((d.detach() * (p - a.detach())).sum() for p, d, a in zip(parameters, directions, anchors, strict=True))


def logit_calibrated_cross_entropy(
    logits: Tensor, labels: Tensor, class_counts: Tensor, tau: float, absent_classes: Literal["exclude", "clamp"] = "exclude"
) -> Tensor:
    """FedLC's calibrated loss (Zhang et al., ICML 2022): cross-entropy of ``z_c − τ · n_c^{−1/4}``
    (softmax over all classes), with ``n_c`` the client's training count of class c ``[C]``.

    ``exclude``: classes with ``n_c = 0`` get margin ∞, i.e. they drop out of the softmax (their
    logits get no gradient); ``clamp``: ``n_c ← max(n_c, 1e-8)``. τ = 0 is plain cross-entropy
    (never masked: 0·∞ would be NaN). Computed with log-softmax in float32."""
    if tau == 0:
        return F.cross_entropy(logits, labels)
    counts = class_counts.to(device=logits.device, dtype=torch.float32)
    if absent_classes == "clamp":
        margins = tau * counts.clamp_min(1e-8).pow(-0.25)
    else:
        margins = torch.where(counts > 0, tau * counts.clamp_min(1).pow(-0.25), torch.inf)
    return F.cross_entropy(logits.float() - margins.unsqueeze(0), labels)


def not_true_distillation(local_logits: Tensor, global_logits: Tensor, labels: Tensor, tau: float) -> Tensor:
    """FedNTD's not-true distillation (Lee et al., NeurIPS 2022): ``KL(q̃ᵍ ‖ q̃ˡ)``, batch mean, where
    q̃ = softmax(z̃ / τ) over the C − 1 columns other than the true class. The global logits are
    detached. 0 (connected to the graph) when C = 1."""
    num_classes = local_logits.shape[1]
    if num_classes < 2:
        return local_logits.sum() * 0.0
    not_true = torch.arange(num_classes, device=labels.device).unsqueeze(0) != labels.unsqueeze(1)
    local = local_logits.float()[not_true].view(-1, num_classes - 1) / tau
    target = global_logits.detach().float()[not_true].view(-1, num_classes - 1) / tau
    return F.kl_div(F.log_softmax(local, dim=1), F.log_softmax(target, dim=1), reduction="batchmean", log_target=True)


def decorrelation_loss(features: Tensor) -> Tensor:
    """FedDecorr's regulariser (Shi et al., ICLR 2023), in its official code's form: with Ẑ the
    batch's features ``[N, d]`` standardised per column (unbiased variance + 1e-8) and M = ẐᵀẐ,
    ``mean_{i≠j} M_ij² / N``. 0 for a batch of one sample. Computed in float32."""
    n, d = features.shape
    if n < 2 or d < 2:
        return features.sum() * 0.0
    z = features.float()
    z = (z - z.mean(dim=0)) / torch.sqrt(z.var(dim=0) + 1e-8)
    correlations = z.T @ z
    off_diagonal = ~torch.eye(d, dtype=torch.bool, device=z.device)
    return correlations[off_diagonal].pow(2).mean() / n
