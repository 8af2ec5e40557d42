"""Robust aggregation rules over the clients' individual updates ``[n, d]`` (one row per client, in
ascending client id): each replaces the weighted mean, unweighted, as in the papers.

- ``median``: the coordinate-wise median (Yin et al., ICML 2018, Option I); with even n the mean of
  the two middle values, as ``numpy.median``;
- ``trimmed_mean``: per coordinate, the mean after removing the ⌊β·n⌋ largest and smallest values
  (Yin et al., Option II; β = ``robust.trim_fraction`` < 1/2);
- ``krum``: the update with the smallest score, the sum of squared distances to its n − f − 2
  nearest others (Blanchard et al., NeurIPS 2017, Sec. 4; f = ``robust.krum_f``, needs n ≥ 2f + 3);
- ``multi_krum``: the mean of the m updates with the smallest Krum scores (Blanchard et al., Sec. 5;
  m = ``robust.multi_krum_m``, default n − f). Scores are computed once over all n (Flower's
  ``aggregate_krum`` does the same), not recomputed after each pick.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

RobustRule = Literal["median", "trimmed_mean", "krum", "multi_krum"]


def coordinate_median(updates: torch.Tensor) -> torch.Tensor:
    """Per-coordinate median of ``updates [n, d]``."""
    ordered = updates.sort(dim=0).values
    n = ordered.shape[0]
    if n % 2 == 1:
        return ordered[n // 2]
    return (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def trimmed_mean(updates: torch.Tensor, trim_fraction: float) -> torch.Tensor:
    """Per-coordinate mean of ``updates [n, d]`` without the ⌊β·n⌋ smallest and largest values."""
    n = updates.shape[0]
    cut = math.floor(trim_fraction * n)
    return updates.sort(dim=0).values[cut : n - cut].mean(dim=0)


def krum_scores(updates: torch.Tensor, f: int) -> torch.Tensor:
    """Krum's score of each row: the sum of its squared distances to its n − f − 2 nearest other rows."""
    n = updates.shape[0]
    squared = torch.cdist(updates, updates).square()
    squared.fill_diagonal_(float("inf"))  # a row is not its own neighbour
    return squared.sort(dim=1).values[:, : n - f - 2].sum(dim=1)


def krum(updates: torch.Tensor, f: int) -> torch.Tensor:
    """The row with the smallest Krum score (the first such row on ties)."""
    return updates[int(torch.argmin(krum_scores(updates, f)))]


def multi_krum(updates: torch.Tensor, f: int, m: int | None = None) -> torch.Tensor:
    """The mean of the ``m`` rows (default n − f) with the smallest Krum scores."""
    m = updates.shape[0] - f if m is None else m
    chosen = torch.argsort(krum_scores(updates, f), stable=True)[:m]
    return updates[chosen].mean(dim=0)


def robust_aggregate(rule: RobustRule, updates: torch.Tensor, trim_fraction: float, krum_f: int, multi_krum_m: int | None) -> torch.Tensor:
    """``rule`` applied to ``updates [n, d]`` with the ``robust.*`` parameters."""
    if rule == "median":
        return coordinate_median(updates)
    if rule == "trimmed_mean":
        return trimmed_mean(updates, trim_fraction)
    if rule == "krum":
        return krum(updates, krum_f)
    return multi_krum(updates, krum_f, multi_krum_m)
