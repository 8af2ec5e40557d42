"""Per-client L2 clipping of an update (McMahan et al., ICLR 2018, Alg. 1, ``ClipFn`` with flat
clipping): ``Δ · min(1, C / ‖Δ‖₂)``, C = ``privacy.clip``. It bounds one client's contribution to
the round's sum by C, the sensitivity the Gaussian noise is calibrated to."""

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
