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

from pathlib import Path
from typing import Any

import pandas as pd

from fedray.config import ConfigError
from fedray.layout import ERROR, ROUNDS_FILE, TERMINATED, TRIALS_DIR, TRIALS_FILE
from fedray.tracking.paired import (
    ALGORITHM_KEY,
    CONFIDENCE,
    PERSONAL_DISTRIBUTION,
    SEED_KEY,
    column_labels,
    comparison_reference,
    compared_metrics,
    final_values,
    metric_mode,
    paired_comparison,
    paired_rows,
    read_sweep_file,
)

COMPARISON_FILE = "comparison.md"
PERSONALISED_NOTE = (
    "Rows marked (personalised) are evaluated by each client's own model on its held-out split: compare their "
    "personal_accuracy. Their test_accuracy is a global model with an untrained personal part, not comparable "
    "to the other rows'."
)


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
    """A plain-text table of the ``count`` best trials (best value of the sweep's metric); one line
    saying so when no trial has one (every trial errored, or none reported yet)."""
    meta = read_meta(sweep_dir)
    trials = read_table(sweep_dir / TRIALS_FILE)
    ranked = ranked_trials(trials, meta["mode"]).head(count)
    if ranked.empty:  # not pandas' "Empty DataFrame" with its column list
        errored = int((trials["status"] == ERROR).sum())
        return f"no trial finished with a value of {meta['metric']}" + (
            f" ({errored} of {len(trials)} errored: see below)" if errored else f" ({len(trials)} trials)"
        )
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
        table["column"] = column_labels(table, columns)
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
