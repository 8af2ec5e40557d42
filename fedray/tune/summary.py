"""What ``fedray tune`` prints when a sweep ends, read from the sweep directory's files (no Ray):
the best trial, the top trials, and — when the sweep's space includes ``algorithm.name`` — the
algorithm comparison table (also written as ``comparison.md``)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from fedray.tune.results import ROUNDS_FILE, TERMINATED, TRIALS_FILE, read_meta

COMPARISON_FILE = "comparison.md"
ALGORITHM_KEY = "algorithm.name"
SEED_KEY = "seed"


def _format(metric: str, value: float | None) -> str:
    if value is None or pd.isna(value):
        return "n/a"
    return f"{100 * value:.2f}%" if metric.endswith("accuracy") else f"{value:.4f}"


def ranked_trials(trials: pd.DataFrame, mode: str) -> pd.DataFrame:
    """Trials with a best metric, best first."""
    return trials.dropna(subset=["best_metric"]).sort_values("best_metric", ascending=mode == "min", kind="stable")


def top_trials_table(sweep_dir: Path, count: int = 5) -> str:
    """A plain-text table of the ``count`` best trials (best value of the sweep's metric)."""
    meta = read_meta(sweep_dir)
    trials = pd.read_parquet(sweep_dir / TRIALS_FILE)
    ranked = ranked_trials(trials, meta["mode"]).head(count)
    columns = ["trial_id", "status", *meta["swept_keys"], "best_metric", "best_round", "round"]
    shown = ranked[columns].copy()
    shown["best_metric"] = [_format(meta["metric"], v) for v in shown["best_metric"]]
    shown = shown.rename(columns={"best_metric": f"best {meta['metric']}", "round": "rounds"})
    return shown.to_string(index=False)


def best_trial_lines(sweep_dir: Path) -> list[str]:
    """The best trial's swept values and where its full config is."""
    meta = read_meta(sweep_dir)
    ranked = ranked_trials(pd.read_parquet(sweep_dir / TRIALS_FILE), meta["mode"])
    if ranked.empty:
        return ["no trial reported a result"]
    best = ranked.iloc[0]
    lines = [
        f"best trial         {best['trial_id']} ({meta['metric']} {_format(meta['metric'], best['best_metric'])} "
        f"at round {int(best['best_round'])})"
    ]
    lines += [f"  {key} = {best[key]}" for key in meta["swept_keys"]]
    lines.append(f"  full config: {sweep_dir / best['run_dir'] / 'config.yaml'}")
    return lines


def comparison_markdown(sweep_dir: Path) -> str | None:
    """Algorithms (rows) × the other swept keys except ``seed`` (columns): mean ± std over seeds of
    each completed trial's final value of the sweep's metric (and of ``personal_accuracy`` when the
    trials report it). None when the sweep's space does not include ``algorithm.name``."""
    meta = read_meta(sweep_dir)
    if ALGORITHM_KEY not in meta["swept_keys"]:
        return None
    trials = pd.read_parquet(sweep_dir / TRIALS_FILE)
    rounds = pd.read_parquet(sweep_dir / ROUNDS_FILE) if (sweep_dir / ROUNDS_FILE).is_file() else pd.DataFrame()
    completed = trials[trials["status"] == TERMINATED]
    if completed.empty or rounds.empty:
        return None
    final = rounds.sort_values("round").groupby("trial_id").tail(1).set_index("trial_id")
    metrics = [meta["metric"]] + [m for m in ("personal_accuracy",) if m in final.columns and m != meta["metric"]]
    columns = [key for key in meta["swept_keys"] if key not in (ALGORITHM_KEY, SEED_KEY)]
    sections = []
    for metric in metrics:
        table = completed[[ALGORITHM_KEY, *columns]].copy()
        table["value"] = final[metric].reindex(completed["trial_id"]).to_numpy()
        table["column"] = table[columns].astype(str).agg(", ".join, axis=1) if columns else "all"
        header = ", ".join(columns) if columns else ""
        grouped = table.dropna(subset=["value"]).groupby([ALGORITHM_KEY, "column"], sort=True)["value"]
        cells = grouped.agg(lambda v: f"{_format(metric, v.mean())} ± {_format(metric, v.std(ddof=0))} (n={len(v)})")
        pivot = cells.unstack("column").fillna("—")
        lines = [
            f"### final {metric} (mean ± std over seeds)" + (f"; columns: {header}" if header else ""),
            "",
            "| algorithm | " + " | ".join(str(c) for c in pivot.columns) + " |",
            "|---|" + "---|" * len(pivot.columns),
        ]
        lines += [f"| {name} | " + " | ".join(row) + " |" for name, row in pivot.iterrows()]
        sections.append("\n".join(lines))
    return f"# {meta['sweep_id']}\n\n" + "\n\n".join(sections) + "\n"


def write_comparison(sweep_dir: Path) -> str | None:
    text = comparison_markdown(sweep_dir)
    if text is not None:
        (sweep_dir / COMPARISON_FILE).write_text(text)
    return text
