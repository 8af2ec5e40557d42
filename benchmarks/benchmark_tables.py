"""Pieces shared by the results-table benchmarks (``digits_table.py``, ``real_table.py``,
``privacy_utility_fmnist.py``, ``secagg_dp_table.py``): a finished run's final, best and curve from its
round metrics, plotting mean ± band curves over seeds, a paired difference's table cell, and the median
upload norms that DP's clip bounds are chosen from."""

from __future__ import annotations

import statistics
import tempfile
from typing import Any, Mapping, Sequence

import numpy as np

from fedray.tracking.paired import t_interval


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


def paired_text(values: Mapping[Any, float], reference: Mapping[Any, float], decimals: int, with_n: bool) -> str | None:
    """A table cell for ``values`` minus ``reference`` seed by seed (both keyed by seed, as fractions),
    in points: the mean over the seeds both have and its 95 % Student's t interval
    (:func:`fedray.tracking.paired.t_interval`), bold when the interval excludes 0, followed by
    ``(n = k)`` when ``with_n``; one seed: its difference and ``(n = 1)``; no seed in common: None."""
    seeds = sorted(set(values) & set(reference))
    if not seeds:
        return None
    differences = np.array([100 * (values[seed] - reference[seed]) for seed in seeds])
    interval = t_interval(differences)
    if interval is None:
        return f"{differences[0]:+.{decimals}f} (n = 1)"
    mean, low, high = interval
    text = f"{mean:+.{decimals}f} [{low:+.{decimals}f}, {high:+.{decimals}f}]" + (f" (n = {len(seeds)})" if with_n else "")
    return f"**{text}**" if low > 0 or high < 0 else text


def median_update_norms(overrides: Sequence[str], rounds: int) -> dict[str, float]:
    """Median over ``rounds`` rounds' clients of each ``update_norm*`` a run with ``overrides`` (privacy on,
    its bounds ``.inf`` and no noise: nothing clipped, nothing added) reports: what each upload's clip
    bound is chosen from. A deployment would pay privacy for this measurement, or take it from public data."""
    from fedray.testing import Federation

    with tempfile.TemporaryDirectory() as run_dir:
        federation = Federation(run_dir, [*overrides, f"train.rounds={rounds}"], defaults=()).run(rounds)
    norms: dict[str, list[float]] = {}
    for results in federation.results:
        for metrics in results.client_metrics.values():
            for key, value in metrics.items():
                if key.startswith("update_norm"):
                    norms.setdefault(key, []).append(value)
    return {key: statistics.median(values) for key, values in norms.items()}
