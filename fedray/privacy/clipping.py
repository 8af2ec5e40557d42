"""Per-client L2 clipping of an update (McMahan et al., ICLR 2018, Alg. 1, ``ClipFn`` with flat
clipping): ``Δ · min(1, C / ‖Δ‖₂)``, C = ``privacy.clip``. It bounds one client's contribution to
the round's sum by C, the sensitivity the Gaussian noise is calibrated to. The other parts of an
upload (prototypes and their counts, ...) are clipped together by :func:`clip_jointly`.

With ``privacy.clipping: adaptive`` C moves each round towards the ``privacy.target_quantile`` of
the clients' update norms (Andrew et al., NeurIPS 2021, "Differentially Private Learning with
Adaptive Clipping", Alg. 1): :func:`next_adaptive_clip`."""

from __future__ import annotations

import math

import torch


def clip_to_norm(delta: torch.Tensor, clip: float) -> tuple[torch.Tensor, float]:
    """``delta`` scaled to L2 norm at most ``clip``, and its norm before clipping. An update already
    within the bound (always, with ``clip = inf``) is returned as it is, not multiplied by 1."""
    norm = float(torch.linalg.vector_norm(delta.double()))
    if math.isinf(clip) or norm <= clip:
        return delta, norm
    return delta * (clip / norm), norm


def clip_jointly(tensors: list[torch.Tensor], bounds: list[float]) -> tuple[list[torch.Tensor], list[float]]:
    """``tensors`` all scaled by one factor f = min(1, min_i C_i/‖x_i‖₂) so that each is within its bound
    C_i (``bounds``; inf: none), and their norms before. One upload's parts (a client's per-class
    prototype sums and their counts, ``privacy.clip_prototypes`` and ``privacy.clip_counts``) keep their
    ratios, the class means, and each has sensitivity C_i. Tensors already within their bounds are
    returned as they are."""
    norms = [float(torch.linalg.vector_norm(tensor.double())) for tensor in tensors]
    factor = min([1.0] + [bound / norm for norm, bound in zip(norms, bounds) if norm > bound])
    if factor == 1.0:
        return list(tensors), norms
    return [(tensor.double() * factor).to(tensor.dtype) for tensor in tensors], norms


def next_adaptive_clip(clip: float, unclipped_fraction: float, target_quantile: float, clip_lr: float) -> float:
    """The geometric update of Andrew et al. 2021 (Alg. 1): C ← C · exp(−η_C · (b̃ − γ)), where b̃ is the
    noised share of the round's updates with ‖Δ_k‖ ≤ C (``unclipped_fraction``), γ =
    ``privacy.target_quantile`` and η_C = ``privacy.clip_lr``. Its fixed point in expectation is the
    γ-quantile of the update norms."""
    return clip * math.exp(-clip_lr * (unclipped_fraction - target_quantile))
