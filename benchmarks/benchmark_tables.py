"""Pieces shared by the results-table benchmarks (``digits_table.py``, ``real_table.py``): a
finished run's final, best and curve from its round metrics, and plotting mean ± band curves over seeds."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np


def run_result(rounds: Sequence[dict[str, Any]], metric: str, also: Sequence[str] = ()) -> dict[str, Any]:
    """``final`` and ``best`` value of ``metric`` over the evaluated rows of ``rounds`` (a run's round
    metrics, ``read_metrics``), its ``curve`` [(round, value)], and each metric of ``also`` at the
    final round (``<name>_final``) and at the round where ``metric`` was best (``<name>_at_best``)."""
    rows = [r for r in rounds if r.get(metric) is not None]
    if not rows:
        raise ValueError(f"no round reports {metric!r}")
    best_row = max(rows, key=lambda r: r[metric])
    return {
        "final": rows[-1][metric],
        "best": best_row[metric],
        "curve": [(int(r["round"]), float(r[metric])) for r in rows],
        **{f"{name}_final": rows[-1].get(name) for name in also},
        **{f"{name}_at_best": best_row.get(name) for name in also},
    }


def plot_mean_band(ax: Any, curves: Sequence[Sequence[tuple[int, float]]], label: str) -> None:
    """The mean over seeds of curves [(round, value)] with a ± std band (rounds common to all)."""
    common = sorted(set.intersection(*(set(r for r, _ in c) for c in curves)))
    values = np.array([[dict(c)[r] for r in common] for c in curves])
    mean, std = values.mean(axis=0), values.std(axis=0)
    (line,) = ax.plot(common, mean, label=f"{label} ({len(curves)} seed{'s' * (len(curves) > 1)})")
    if len(curves) > 1:
        ax.fill_between(common, mean - std, mean + std, color=line.get_color(), alpha=0.2)
