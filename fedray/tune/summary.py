"""What ``fedray tune`` prints when a sweep ends, read from the sweep directory's files (no Ray):
the best trial, the top trials, the errored trials with their errors, and — when the sweep's space
includes ``algorithm.name`` — the algorithm comparison table (also written as ``comparison.md``), in
which errored trials are counted and listed, never dropped, and personalised algorithms' rows are
marked (their ``test_accuracy`` is not a global model's)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from fedray.config import ConfigError
from fedray.config.schema import TASK_REPORTS
from fedray.layout import ERROR, ROUNDS_FILE, TERMINATED, TRIALS_DIR, TRIALS_FILE
from fedray.tune.results import read_meta, read_table

COMPARISON_FILE = "comparison.md"
PERSONALISED_NOTE = (
    "Rows marked (personalised) are evaluated by each client's own model on its held-out split: compare their "
    "personal_accuracy. Their test_accuracy is a global model with an untrained personal part, not comparable "
    "to the other rows'."
)
#: Each task's personalised headline (personal_accuracy, personal_rmse...), shown beside the sweep's metric.
PERSONAL_HEADLINES = tuple(f"personal_{report.headline}" for report in TASK_REPORTS.values())
ALGORITHM_KEY = "algorithm.name"
SEED_KEY = "seed"


def format_metric(metric: str, value: float | None) -> str:
    """Accuracies and F1 scores as percentages, other metrics (losses, RMSE, perplexity, R²) as numbers."""
    if value is None or pd.isna(value):
        return "n/a"
    return f"{100 * value:.2f}%" if metric.endswith(("accuracy", "_f1")) else f"{value:.4g}" if abs(value) >= 1000 else f"{value:.4f}"


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
    """Algorithms (rows) × the other swept keys except ``seed`` (columns): mean ± std over seeds of
    each completed trial's final value of the sweep's metric (and of the task's personalised headline,
    ``personal_accuracy`` for classification, when the trials report it); a cell with errored trials says how many (``2 errored``), and the errored
    trials are listed below the tables with their errors. None when the sweep's space does not
    include ``algorithm.name``."""
    meta = read_meta(sweep_dir)
    if ALGORITHM_KEY not in meta["swept_keys"]:
        return None
    trials = read_table(sweep_dir / TRIALS_FILE)
    rounds = read_table(sweep_dir / ROUNDS_FILE) if (sweep_dir / ROUNDS_FILE).is_file() else pd.DataFrame()
    shown = trials[trials["status"].isin([TERMINATED, ERROR])]
    if shown.empty:
        return None
    final = (
        rounds.sort_values("round").groupby("trial_id").tail(1).set_index("trial_id")
        if not rounds.empty
        else pd.DataFrame(index=pd.Index([], name="trial_id"))
    )
    metrics = [meta["metric"]] + [m for m in PERSONAL_HEADLINES if m in final.columns and m != meta["metric"]]
    columns = [key for key in meta["swept_keys"] if key not in (ALGORITHM_KEY, SEED_KEY)]
    evaluation_marks = {name: evaluation_mark(name) for name in shown[ALGORITHM_KEY].unique()}
    sections = []
    for metric in metrics:
        table = shown[[ALGORITHM_KEY, *columns]].copy()
        values = final[metric] if metric in final.columns else pd.Series(dtype=float)
        table["value"] = values.reindex(shown["trial_id"]).to_numpy(dtype=float, na_value=float("nan"))
        table["errored"] = (shown["status"] == ERROR).to_numpy()
        table["column"] = table[columns].astype(str).agg(", ".join, axis=1) if columns else "all"
        header = ", ".join(columns) if columns else ""
        cells = table.groupby([ALGORITHM_KEY, "column"], sort=True)[["value", "errored"]].apply(lambda group: _cell(metric, group))
        pivot = cells.unstack("column").fillna("—")
        lines = [
            f"### final {metric} (mean ± std over seeds)" + (f"; columns: {header}" if header else ""),
            "",
            "| algorithm | " + " | ".join(str(c) for c in pivot.columns) + " |",
            "|---|" + "---|" * len(pivot.columns),
        ]
        lines += [f"| {name}{evaluation_marks.get(name, '')} | " + " | ".join(row) + " |" for name, row in pivot.iterrows()]
        sections.append("\n".join(lines))
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
    return f"# {meta['sweep_id']}\n\n" + "\n\n".join(sections) + "\n"


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
