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
  ``aggregate_krum`` does the same), not recomputed after each pick;
- ``bulyan``: Bulyan (El Mhamdi et al., ICML 2018, "The Hidden Vulnerability of Distributed
  Learning in Byzantium", Sec. 4): θ = n − 2f updates selected by Krum one at a time (each pick's
  scores computed over the updates not yet picked, with the set's own size: :func:`bulyan_selection`), then per coordinate
  the mean of the β = θ − 2f selected values closest to their median (f = ``robust.krum_f``, needs
  n ≥ 4f + 3).

Uploads other than the model weights that declare how (``Upload.robust``) go through the same rule
(:func:`robust_sum`): a vector in one space on every client (SCAFFOLD's Δc_i) over the clients, and
per-class sums (prototypes) per class, over the class means of the clients that hold the class, a
coordinate-wise rule (median, trimmed mean) only, since whole-update selections (Krum, Bulyan)
compare clients that hold different classes.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

RobustRule = Literal["median", "trimmed_mean", "krum", "multi_krum", "bulyan"]


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


def bulyan_selection(updates: torch.Tensor, f: int) -> torch.Tensor:
    """The indices (in the order picked) of Bulyan's θ = n − 2f rows: Krum applied again and again
    to the rows not yet picked (a set of n' rows scores each row over its n' − f − 2 nearest others,
    at least its nearest one: the last picks, from 2f + 1 rows, would otherwise all score 0), each
    time taking the best-scored row (the first on ties)."""
    n = updates.shape[0]
    remaining = list(range(n))
    picked = []
    for _ in range(n - 2 * f):
        rows = updates[remaining]
        squared = torch.cdist(rows, rows).square()
        squared.fill_diagonal_(float("inf"))
        neighbours = max(len(remaining) - f - 2, 1)
        scores = squared.sort(dim=1).values[:, :neighbours].sum(dim=1)
        picked.append(remaining.pop(int(torch.argmin(scores))))
    return torch.tensor(picked, dtype=torch.long)


def bulyan(updates: torch.Tensor, f: int) -> torch.Tensor:
    """Bulyan (module docstring) of ``updates [n, d]``: per coordinate, the mean of the β = n − 4f
    values of the Krum-selected rows that are closest to their coordinate-wise median (the first
    rows, in the order picked, on ties)."""
    n = updates.shape[0]
    if n < 4 * f + 3:
        raise ValueError(f"bulyan with f={f} needs at least 4f + 3 = {4 * f + 3} updates, got {n}")
    selected = updates[bulyan_selection(updates, f)]
    beta = selected.shape[0] - 2 * f
    distance = (selected - coordinate_median(selected)).abs()
    closest = torch.argsort(distance, dim=0, stable=True)[:beta]
    return selected.gather(0, closest).mean(dim=0)


def robust_aggregate(rule: RobustRule, updates: torch.Tensor, trim_fraction: float, krum_f: int, multi_krum_m: int | None) -> torch.Tensor:
    """``rule`` applied to ``updates [n, d]`` with the ``robust.*`` parameters."""
    if rule == "median":
        return coordinate_median(updates)
    if rule == "trimmed_mean":
        return trimmed_mean(updates, trim_fraction)
    if rule == "krum":
        return krum(updates, krum_f)
    if rule == "bulyan":
        return bulyan(updates, krum_f)
    return multi_krum(updates, krum_f, multi_krum_m)


def robust_sum(
    rule: RobustRule, sums: torch.Tensor, counts: torch.Tensor | None, trim_fraction: float, krum_f: int, multi_krum_m: int | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """What replaces the cohort's sum of an upload other than the model weights under ``rule``, as
    (the sum, the counts), so that the algorithm's own reading of the sum is the rule's:

    - ``counts`` None: ``sums [n, ...]`` are n clients' vectors; returns n · rule(vectors), for an
      algorithm that divides the sum by a fixed number (SCAFFOLD's c ← c + Σ Δc_i / N);
    - per-class: ``sums [n, C, ...]`` and ``counts [n, C]``, client k's class-c mean being
      sums[k, c] / counts[k, c]; for each class held by some client, m_c = rule(the means of the
      clients with counts[k, c] > 0); returns (m_c · N_c, N_c) with N_c = Σ_k counts[k, c], whose
      ratio, the class mean the algorithm takes, is m_c (zero for a class nobody holds)."""
    n = sums.shape[0]
    if counts is None:
        return n * robust_aggregate(rule, sums.reshape(n, -1), trim_fraction, krum_f, multi_krum_m).view(sums.shape[1:]), None
    totals = counts.sum(dim=0)
    result = torch.zeros_like(sums[0])
    for c in range(counts.shape[1]):
        holders = counts[:, c] > 0
        if not bool(holders.any()):
            continue
        means = sums[holders, c] / counts[holders, c].reshape(-1, *[1] * (sums.dim() - 2))
        robust_mean = robust_aggregate(rule, means.reshape(means.shape[0], -1), trim_fraction, krum_f, multi_krum_m)
        result[c] = robust_mean.view(sums.shape[2:]) * totals[c]
    return result, totals
