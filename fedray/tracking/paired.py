"""Paired comparisons of a sweep's algorithms: each algorithm's final metric minus a reference
algorithm's, seed by seed, with Student's t confidence intervals.

The rows ``comparison.md`` prints (:mod:`fedray.tune.summary`) and the dashboard's sweep view shows
(:mod:`fedray.dashboard.data`), computed from the frames of ``trials.parquet`` and ``rounds.parquet``
and the sweep file: pandas, yaml and scipy only (neither Ray nor torch), so that both can import it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from fedray.config.schema import TASK_REPORTS, metric_direction
from fedray.layout import SWEEP_FILE, TERMINATED

#: Each task's personalised headline (personal_accuracy, personal_rmse...), shown beside the sweep's metric.
PERSONAL_HEADLINES = tuple(f"personal_{report.headline}" for report in TASK_REPORTS.values())
#: The suffixes of the clients' distribution of a personalised headline that comparison.md shows when the
#: trials report them: the worst client, and the value 10 % of the clients are worse than.
PERSONAL_DISTRIBUTION = ("_worst", "_p10")
#: The personalised columns comparison.md shows beside the sweep's metric (those the trials report).
PERSONAL_COLUMNS = tuple(f"{headline}{suffix}" for headline in PERSONAL_HEADLINES for suffix in ("", *PERSONAL_DISTRIBUTION))
ALGORITHM_KEY = "algorithm.name"
SEED_KEY = "seed"
#: The algorithm the paired comparison compares the others with when the sweep file names none and the sweep runs it.
DEFAULT_REFERENCE = "fedavg"
#: The confidence of the paired differences' intervals.
CONFIDENCE = 0.95


def final_values(rounds: pd.DataFrame) -> pd.DataFrame:
    """Each trial's last reported round row (of ``rounds.parquet``), indexed by ``trial_id``."""
    if rounds.empty or not {"trial_id", "round"} <= set(rounds.columns):
        return pd.DataFrame(index=pd.Index([], name="trial_id"))
    return rounds.sort_values("round", kind="stable").groupby("trial_id").tail(1).set_index("trial_id")


def compared_metrics(sweep_metric: str, reported: Any) -> list[str]:
    """The sweep's metric, then the personalised columns (:data:`PERSONAL_COLUMNS`) the trials report."""
    return [sweep_metric] + [m for m in PERSONAL_COLUMNS if m in set(reported) and m != sweep_metric]


def metric_mode(metric: str, sweep_metric: str, sweep_mode: str) -> str:
    """Whether a larger ``metric`` is better (``max``) or a smaller one (``min``): the sweep's mode for
    its own metric, else the metric's own direction (:func:`fedray.config.schema.metric_direction`)."""
    return sweep_mode if metric == sweep_metric else metric_direction(metric)


def read_sweep_file(sweep_dir: Path) -> dict[str, Any] | None:
    """The sweep directory's ``sweep.yaml`` as a mapping, or None when it is missing or unreadable."""
    try:
        data = yaml.safe_load((sweep_dir / SWEEP_FILE).read_text())
    except (OSError, yaml.YAMLError):
        return None
    return data if isinstance(data, dict) else None


def algorithm_order(sweep_file: dict[str, Any] | None, trials: pd.DataFrame) -> list[str]:
    """The swept algorithms in the space's order (``sweep.yaml``), then any other algorithm the trials
    ran, in the order of ``trials.parquet``."""
    space = (sweep_file or {}).get("space")
    domain = space.get(ALGORITHM_KEY) if isinstance(space, dict) else None
    listed = next(iter(domain.values()), None) if isinstance(domain, dict) and domain else None
    order = [str(name) for name in listed] if isinstance(listed, list) else []
    ran = [str(name) for name in trials[ALGORITHM_KEY].dropna()] if ALGORITHM_KEY in trials.columns else []
    return list(dict.fromkeys(order + ran))


def comparison_reference(sweep_file: dict[str, Any] | None, trials: pd.DataFrame) -> tuple[str | None, str]:
    """The algorithm the others are compared with, and why it is the one: the sweep file's
    ``reference``; else ``fedavg`` when the sweep runs it; else the first algorithm of the space."""
    configured = (sweep_file or {}).get("reference")
    if isinstance(configured, str) and configured:
        return configured, "named by the sweep file's reference"
    order = algorithm_order(sweep_file, trials)
    if DEFAULT_REFERENCE in order:
        return DEFAULT_REFERENCE, f"the default: {DEFAULT_REFERENCE} runs in this sweep"
    if order:
        return order[0], f"the default without {DEFAULT_REFERENCE}: the first algorithm of the space"
    return None, "no algorithm"


def t_interval(differences: np.ndarray, confidence: float = CONFIDENCE) -> tuple[float, float, float] | None:
    """Mean of the paired ``differences`` and its ``confidence`` interval by Student's t with n − 1
    degrees of freedom (mean ± t · s / √n, s the sample std, ddof=1); None for fewer than 2 differences."""
    n = len(differences)
    if n < 2:
        return None
    from scipy import stats  # scipy comes with scikit-learn

    mean = float(np.mean(differences))
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * float(np.std(differences, ddof=1)) / math.sqrt(n)
    return mean, mean - half, mean + half


def paired_rows(trials: pd.DataFrame, final: pd.Series, swept_keys: list[str], mode: str, reference: str | None) -> list[dict[str, Any]]:
    """The paired comparison of each algorithm with ``reference``, one row per algorithm and value of
    the swept keys other than ``algorithm.name`` and ``seed`` (the comparison table's columns).

    ``trials``: ``trials.parquet``; ``final``: each trial's final value of the metric, by ``trial_id``.
    Only completed (``TERMINATED``) trials with a finite final value count. A trial is paired with the
    reference's trial of the same ``seed`` and the same values of every other swept key (trials that
    are identical on all of them, e.g. repeated samples of a grid, are averaged first); the difference
    is the algorithm's value minus the reference's. Each row: ``algorithm``, ``column`` (the values as
    the table's column label), ``values`` (key → value), ``n`` (paired seeds), ``unpaired`` (the
    algorithm's trials without a partner), ``mean_difference``, ``ci_low`` / ``ci_high`` (the
    :data:`CONFIDENCE` interval by Student's t, n − 1 dof; None for n < 2), ``significant`` (the
    interval excludes 0), ``verdict`` (``better`` / ``worse`` in the metric's direction ``mode`` when
    significant, ``no clear difference`` when not, None for n < 2), ``mode`` and ``reference``."""
    if reference is None or ALGORITHM_KEY not in trials.columns:
        return []
    pair_keys = [key for key in swept_keys if key != ALGORITHM_KEY and key in trials.columns]
    columns = [key for key in pair_keys if key != SEED_KEY]
    done = trials[trials["status"] == TERMINATED].copy()
    done["value"] = final.reindex(done["trial_id"]).to_numpy(dtype=float, na_value=float("nan"))
    done = done[np.isfinite(done["value"].to_numpy(dtype=float))]
    if done.empty:
        return []
    done["pair"] = done[pair_keys].astype(str).agg("\x1f".join, axis=1) if pair_keys else ""
    done["column"] = column_labels(done, columns)
    rows = []
    for (name, column), group in done.groupby([ALGORITHM_KEY, "column"], sort=True):
        if name == reference:
            continue
        mine = group.groupby("pair")["value"].mean()
        theirs = done[(done[ALGORITHM_KEY] == reference) & (done["column"] == column)].groupby("pair")["value"].mean()
        common = mine.index.intersection(theirs.index)
        differences = (mine[common] - theirs[common]).to_numpy(dtype=float)
        interval = t_interval(differences)
        significant = interval is not None and (interval[1] > 0 or interval[2] < 0)
        mean = float(differences.mean()) if len(differences) else None
        if interval is None:
            verdict = None
        elif not significant:
            verdict = "no clear difference"
        else:
            verdict = "better" if (mean > 0) == (mode == "max") else "worse"
        rows.append(
            {
                "algorithm": str(name),
                "column": str(column),
                "values": {key: plain_value(group.iloc[0][key]) for key in columns},
                "n": int(len(differences)),
                "unpaired": int(len(mine) - len(common)),
                "mean_difference": mean,
                "ci_low": None if interval is None else interval[1],
                "ci_high": None if interval is None else interval[2],
                "significant": bool(significant),
                "verdict": verdict,
                "mode": mode,
                "reference": reference,
            }
        )
    return rows


def paired_comparison(
    trials: pd.DataFrame,
    rounds: pd.DataFrame,
    sweep_metric: str,
    sweep_mode: str,
    swept_keys: list[str],
    sweep_file: dict[str, Any] | None,
) -> dict[str, Any] | None:
    """The paired comparison of a sweep as data (what the dashboard shows): ``reference``,
    ``reference_rule`` (why that algorithm), ``confidence``, ``columns`` (the swept keys of the columns)
    and ``metrics``: for the sweep's metric and each personalised column the trials report
    (:func:`compared_metrics`), ``{metric, mode, rows}`` with the rows of :func:`paired_rows`. None
    when the sweep does not sweep ``algorithm.name``. Reads only the frames given (no Ray)."""
    if ALGORITHM_KEY not in swept_keys or ALGORITHM_KEY not in trials.columns:
        return None
    reference, rule = comparison_reference(sweep_file, trials)
    final = final_values(rounds)
    metrics = []
    for metric in compared_metrics(sweep_metric, final.columns):
        mode = metric_mode(metric, sweep_metric, sweep_mode)
        values = final[metric] if metric in final.columns else pd.Series(dtype=float)
        metrics.append({"metric": metric, "mode": mode, "rows": paired_rows(trials, values, swept_keys, mode, reference)})
    columns = [key for key in swept_keys if key not in (ALGORITHM_KEY, SEED_KEY)]
    return {"reference": reference, "reference_rule": rule, "confidence": CONFIDENCE, "columns": columns, "metrics": metrics}


def column_labels(table: pd.DataFrame, columns: list[str]) -> pd.Series | str:
    """Each row's values of ``columns`` as the comparison table's column label (``"all"`` without columns)."""
    return table[columns].astype(str).agg(", ".join, axis=1) if columns else "all"


def plain_value(value: Any) -> Any:
    """A swept value as a plain JSON value (numpy scalars unwrapped, missing values None)."""
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return None
    return value.item() if isinstance(value, np.generic) else value
