"""What ``fedray tune`` prints when a sweep ends, read from the sweep directory's files (no Ray):
the best trial, the top trials, the errored trials with their errors, and — when the sweep's space
includes ``algorithm.name`` — the algorithm comparison table (also written as ``comparison.md``), in
which errored trials are counted and listed, never dropped, and personalised algorithms' rows are
marked (their ``test_accuracy`` is not a global model's).

The comparison is *paired*: trials with the same ``seed`` draw the same cohorts, clients online, data
order and initial weights whatever their algorithm (fedray/seeding.py), so each algorithm is compared
with a reference algorithm (the sweep file's ``reference``; by default ``fedavg`` when the sweep runs
it, else the first algorithm of the space) seed by seed: the mean over the n paired seeds of the
difference of their final values, with a 95 % confidence interval by Student's t (n − 1 degrees of
freedom) — :func:`paired_rows`, :func:`paired_comparison`. The dashboard shows the same rows."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from fedray.config import ConfigError
from fedray.config.schema import TASK_REPORTS
from fedray.layout import ERROR, ROUNDS_FILE, SWEEP_FILE, TERMINATED, TRIALS_DIR, TRIALS_FILE

COMPARISON_FILE = "comparison.md"
PERSONALISED_NOTE = (
    "Rows marked (personalised) are evaluated by each client's own model on its held-out split: compare their "
    "personal_accuracy. Their test_accuracy is a global model with an untrained personal part, not comparable "
    "to the other rows'."
)
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
#: Metrics (besides a task's headline and its personalised variants) for which lower is better.
_LOWER_IS_BETTER = ("loss", "_std", "rmse", "mae", "perplexity")


def read_meta(sweep_dir: Path) -> dict[str, Any]:
    from fedray.tune.results import read_meta as read  # Ray Tune: not for the dashboard's paired rows

    return read(sweep_dir)


def read_table(path: Path) -> pd.DataFrame:
    from fedray.tune.results import read_table as read

    return read(path)


def format_metric(metric: str, value: float | None) -> str:
    """Accuracies and F1 scores (and their worst and 10th-percentile clients) as percentages, other
    metrics (losses, RMSE, perplexity, R²) as numbers."""
    if value is None or pd.isna(value):
        return "n/a"
    return f"{100 * value:.2f}%" if _is_fraction(metric) else f"{value:.4g}" if abs(value) >= 1000 else f"{value:.4f}"


def ranked_trials(trials: pd.DataFrame, mode: str) -> pd.DataFrame:
    """Trials that did not error and have a best metric, best first. An errored trial is never ranked,
    whatever it reported before it failed: a trial that diverged in round 15 may have led the sweep at
    round 10, and its values are not a setting to run with."""
    usable = trials[trials["status"] != ERROR].dropna(subset=["best_metric"])
    return usable.sort_values("best_metric", ascending=mode == "min", kind="stable")


def top_trials_table(sweep_dir: Path, count: int = 5) -> str:
    """A plain-text table of the ``count`` best trials (best value of the sweep's metric)."""
    meta = read_meta(sweep_dir)
    trials = read_table(sweep_dir / TRIALS_FILE)
    ranked = ranked_trials(trials, meta["mode"]).head(count)
    columns = ["trial_id", "status", *meta["swept_keys"], "best_metric", "best_round", "round"]
    shown = ranked[columns].copy()
    shown["best_metric"] = [format_metric(meta["metric"], v) for v in shown["best_metric"]]
    shown = shown.rename(columns={"best_metric": f"best {meta['metric']}", "round": "rounds"})
    return shown.to_string(index=False)


def best_trial(sweep_dir: Path) -> pd.Series | None:
    """The best trial's row of ``trials.parquet`` (see :func:`ranked_trials`), or None when no trial
    that did not error has reported a value of the sweep's metric."""
    trials_file = sweep_dir / TRIALS_FILE
    if not trials_file.is_file():
        return None
    ranked = ranked_trials(read_table(trials_file), read_meta(sweep_dir)["mode"])
    return None if ranked.empty else ranked.iloc[0]


def best_trial_lines(sweep_dir: Path) -> list[str]:
    """The best trial's swept values and where its full config is."""
    meta = read_meta(sweep_dir)
    best = best_trial(sweep_dir)
    if best is None:
        return ["no trial reported a result"]
    lines = [
        f"best trial         {best['trial_id']} ({meta['metric']} {format_metric(meta['metric'], best['best_metric'])} "
        f"at round {int(best['best_round'])})"
    ]
    lines += [f"  {key} = {best[key]}" for key in meta["swept_keys"]]
    lines.append(f"  full config: {sweep_dir / best['run_dir'] / 'config.yaml'}")
    return lines


def errored_trials(sweep_dir: Path) -> pd.DataFrame:
    """The ERROR trials: ``trial_id``, the swept values and ``error``."""
    meta = read_meta(sweep_dir)
    trials = read_table(sweep_dir / TRIALS_FILE)
    return trials.loc[trials["status"] == ERROR, ["trial_id", *meta["swept_keys"], "error"]]


def errored_trials_table(sweep_dir: Path) -> str | None:
    """A plain-text table of the errored trials (None when no trial errored)."""
    errored = errored_trials(sweep_dir)
    return None if errored.empty else errored.to_string(index=False)


def comparison_markdown(sweep_dir: Path) -> str | None:
    """Algorithms (rows) × the other swept keys except ``seed`` (columns): mean ± std (the population
    std, ddof=0) over seeds of each completed trial's final value of the sweep's metric, and of the
    task's personalised headline and its worst and 10th-percentile clients (:data:`PERSONAL_COLUMNS`)
    when the trials report them; a cell with errored trials says how many (``2 errored``). Each table is
    followed by the paired differences from the reference algorithm (:func:`paired_rows`). The errored
    trials are listed below the tables with their errors. None when the sweep's space does not include
    ``algorithm.name``."""
    meta = read_meta(sweep_dir)
    if ALGORITHM_KEY not in meta["swept_keys"]:
        return None
    trials = read_table(sweep_dir / TRIALS_FILE)
    rounds = read_table(sweep_dir / ROUNDS_FILE) if (sweep_dir / ROUNDS_FILE).is_file() else pd.DataFrame()
    shown = trials[trials["status"].isin([TERMINATED, ERROR])]
    if shown.empty:
        return None
    final = final_values(rounds)
    metrics = compared_metrics(meta["metric"], final.columns)
    columns = [key for key in meta["swept_keys"] if key not in (ALGORITHM_KEY, SEED_KEY)]
    evaluation_marks = {name: evaluation_mark(name) for name in shown[ALGORITHM_KEY].unique()}
    reference, reference_rule = comparison_reference(read_sweep_file(sweep_dir), trials)
    header = ", ".join(columns) if columns else ""
    sections = []
    for metric in metrics:
        table = shown[[ALGORITHM_KEY, *columns]].copy()
        values = final[metric] if metric in final.columns else pd.Series(dtype=float)
        table["value"] = values.reindex(shown["trial_id"]).to_numpy(dtype=float, na_value=float("nan"))
        table["errored"] = (shown["status"] == ERROR).to_numpy()
        table["column"] = _column_labels(table, columns)
        cells = table.groupby([ALGORITHM_KEY, "column"], sort=True)[["value", "errored"]].apply(lambda group: _cell(metric, group))
        pivot = cells.unstack("column").fillna("—")
        lines = [
            f"### final {metric} (mean ± std over n seeds (population std))" + (f"; columns: {header}" if header else ""),
            "",
            "| algorithm | " + " | ".join(str(c) for c in pivot.columns) + " |",
            "|---|" + "---|" * len(pivot.columns),
        ]
        lines += [f"| {name}{evaluation_marks.get(name, '')} | " + " | ".join(row) + " |" for name, row in pivot.iterrows()]
        sections.append("\n".join(lines))
        mode = metric_mode(metric, meta["metric"], meta["mode"])
        rows = paired_rows(
            trials, final[metric] if metric in final.columns else pd.Series(dtype=float), meta["swept_keys"], mode, reference
        )
        if reference is not None:
            sections.append(_paired_markdown(metric, mode, reference, rows, list(pivot.columns), header, evaluation_marks))
    if any(evaluation_marks.values()):
        sections.append(PERSONALISED_NOTE)
    errored = errored_trials(sweep_dir)
    if not errored.empty:
        keys = list(meta["swept_keys"])
        lines = [
            f"### errored trials ({len(errored)})",
            "",
            "| trial | " + " | ".join(keys) + " | error |",
            "|---|" + "---|" * (len(keys) + 1),
        ]
        lines += [
            f"| {row['trial_id']} | " + " | ".join(str(row[key]) for key in keys) + f" | {_one_line(row['error'])} |"
            for _, row in errored.iterrows()
        ]
        sections.append("\n".join(lines))
    return f"# {meta['sweep_id']}\n\n{paired_note(reference, reference_rule)}\n\n" + "\n\n".join(sections) + "\n"


# ---------------------------------------------------------------------- paired comparison
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
    its own metric; a task's direction for its personalised headline and that headline's distribution
    over the clients (``personal_rmse_worst``, ``_p10``, ``_median``: lower is better, like RMSE); for
    other metrics, ``min`` for losses, spreads, errors and perplexity and ``max`` for the rest."""
    if metric == sweep_metric:
        return sweep_mode
    for report in TASK_REPORTS.values():
        prefix = f"personal_{report.headline}"
        if metric in (prefix, f"test_{report.headline}") or metric in (
            f"{prefix}{s}" for s in ("_worst", "_p10", "_median", "_client_mean")
        ):
            return report.mode
    return "min" if metric.endswith(_LOWER_IS_BETTER) else "max"


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
    done["column"] = _column_labels(done, columns)
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
                "values": {key: _plain(group.iloc[0][key]) for key in columns},
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


def sweep_paired_comparison(sweep_dir: Path) -> dict[str, Any] | None:
    """:func:`paired_comparison` of a sweep directory's files."""
    meta = read_meta(sweep_dir)
    trials = read_table(sweep_dir / TRIALS_FILE)
    rounds = read_table(sweep_dir / ROUNDS_FILE) if (sweep_dir / ROUNDS_FILE).is_file() else pd.DataFrame()
    return paired_comparison(trials, rounds, meta["metric"], meta["mode"], list(meta["swept_keys"]), read_sweep_file(sweep_dir))


def format_difference(metric: str, value: float | None) -> str:
    """A signed difference: of accuracies and F1 scores in percentage points, of other metrics as numbers."""
    if value is None or pd.isna(value):
        return "n/a"
    if _is_fraction(metric):
        return f"{100 * value:+.2f} pp"
    return f"{value:+.4g}" if abs(value) >= 1000 else f"{value:+.4f}"


def _is_fraction(metric: str) -> bool:
    """Whether ``metric`` is an accuracy or an F1 score (a fraction shown in %), possibly a client-distribution column of one."""
    base = metric
    for suffix in PERSONAL_DISTRIBUTION:
        base = base.removesuffix(suffix)
    return base.endswith(("accuracy", "_f1"))


def _paired_cell(metric: str, row: dict[str, Any]) -> str:
    if row["n"] == 0:
        text = "no paired seeds"
    elif row["ci_low"] is None:
        text = f"{format_difference(metric, row['mean_difference'])} (n={row['n']}; no interval: n < 2)"
    else:
        low, high = (format_difference(metric, row[k]).removesuffix(" pp") for k in ("ci_low", "ci_high"))
        text = f"{format_difference(metric, row['mean_difference'])} [{low}, {high}] (n={row['n']})"
        if row["significant"]:
            text += f" * {row['verdict']}"
    if row["unpaired"]:
        text += f"; {row['unpaired']} unpaired"
    return text


def paired_note(reference: str | None, rule: str) -> str:
    """How to read comparison.md's tables (once, under its title)."""
    note = (
        "How to read these tables. `final <metric>`: mean ± std over n seeds of each completed trial's final value; "
        "the std is the population std (ddof=0)."
    )
    if reference is None:
        return note
    return note + (
        f" `paired difference`: the reference is {reference} ({rule}; `reference:` in the sweep file chooses another). "
        f"Each cell is the mean over n seeds of (the algorithm's final value − {reference}'s), pairing the trials with "
        "the same seed and the same values of the other swept keys (the same seed draws the same cohorts, clients "
        f"online, data order and initial weights), then [low, high]: its {CONFIDENCE:.0%} confidence interval by "
        "Student's t (t, n−1 dof). * marks an interval that excludes 0 and says whether the algorithm is better or "
        "worse in the metric's direction; n < 2: no interval; `unpaired`: completed trials without a partner (not counted)."
    )


def _paired_markdown(
    metric: str, mode: str, reference: str, rows: list[dict[str, Any]], columns: list[str], header: str, marks: dict[str, str]
) -> str:
    """The paired-difference table of ``metric`` under its mean ± std table (same columns)."""
    title = (
        f"### paired difference in final {metric}: algorithm − {reference}, mean [{CONFIDENCE:.0%} CI] "
        f"({'higher' if mode == 'max' else 'lower'} is better)" + (f"; columns: {header}" if header else "")
    )
    by_cell = {(row["algorithm"], row["column"]): _paired_cell(metric, row) for row in rows}
    names = sorted({row["algorithm"] for row in rows})
    if not names:
        return f"{title}\n\nNo completed trial of another algorithm has a value to compare with {reference}'s."
    lines = [title, "", "| algorithm | " + " | ".join(str(c) for c in columns) + " |", "|---|" + "---|" * len(columns)]
    lines += [f"| {name}{marks.get(name, '')} | " + " | ".join(by_cell.get((name, str(c)), "—") for c in columns) + " |" for name in names]
    return "\n".join(lines)


def _column_labels(table: pd.DataFrame, columns: list[str]) -> pd.Series | str:
    """Each row's values of ``columns`` as the comparison table's column label (``"all"`` without columns)."""
    return table[columns].astype(str).agg(", ".join, axis=1) if columns else "all"


def _plain(value: Any) -> Any:
    """A swept value as a plain JSON value (numpy scalars unwrapped, missing values None)."""
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return None
    return value.item() if isinstance(value, np.generic) else value


def evaluation_mark(algorithm_name: str) -> str:
    """What a comparison row's name is followed by: ``" (personalised)"`` for an algorithm evaluated by
    each client's own model (it requires per-client test splits), ``""`` for one with a global model,
    ``" (evaluation unknown)"`` when its code cannot be imported here."""
    from fedray.algorithms import get_algorithm_class  # torch: only for a sweep over algorithms
    from fedray.algorithms.requirements import is_personalised

    try:
        return " (personalised)" if is_personalised(get_algorithm_class(algorithm_name)) else ""
    except ConfigError:
        return " (evaluation unknown)"


def _cell(metric: str, group: pd.DataFrame) -> str:
    """``mean ± std (n=k)`` of the completed trials, then how many errored."""
    values = group.loc[~group["errored"], "value"].dropna()
    parts = (
        [f"{format_metric(metric, values.mean())} ± {format_metric(metric, values.std(ddof=0))} (n={len(values)})"] if len(values) else []
    )
    if group["errored"].any():
        parts.append(f"{int(group['errored'].sum())} errored")
    return "; ".join(parts) or "—"


def _one_line(error: str | None) -> str:
    return str(error or "").replace("|", "\\|").replace("\n", " ")


def write_comparison(sweep_dir: Path) -> str | None:
    text = comparison_markdown(sweep_dir)
    if text is not None:
        (sweep_dir / COMPARISON_FILE).write_text(text)
    return text


def tensorboard_hint(sweep_dir: Path) -> str | None:
    """The TensorBoard command for the trials' own event files (None when no trial wrote any)."""
    trials_dir = sweep_dir / TRIALS_DIR
    if not any(trials_dir.glob("*/tensorboard")):
        return None
    return f"tensorboard        tensorboard --logdir {trials_dir}"
