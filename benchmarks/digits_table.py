"""Results table on the embedded digits data: algorithms × Dirichlet α × seeds.

Each algorithm starts from ``examples/<algorithm>_digits.yaml`` (its own hyperparameters), then the
shared protocol below is applied, so every row of every table is comparable:

    digits (80/20 split), 20 clients, Dirichlet α ∈ {0.1, 0.5}, 10 clients per round, 30 rounds,
    2 local epochs, batch 16, SGD lr 0.05, cnn_small, seeds 0, 1, 2.

Usage (one Ray instance serves every run)::

    python benchmarks/digits_table.py --algorithms fedavg fedprox --out docs/results/baselines.md
    python benchmarks/digits_table.py --algorithms fedcosr --metric personal_accuracy \
        --set data.client_test_fraction=0.25 --set eval.personalized=true --out docs/results/fedcosr.md

Writes a Markdown table (mean ± std over seeds of the final and best value of ``--metric``), the raw
per-run rows as ``<out>.csv`` and the learning curves as ``<out>.png`` (an ``--out`` ending in ``.csv``:
the per-run rows only, for a table rendered elsewhere, e.g. ``digits_summaries.py``'s). ``--also METRIC ...`` adds, for
each named metric, its mean over seeds at the final round and at the round where ``--metric`` was
best (e.g. ``--also personal_accuracy_std``, the fairness of a personalised run).
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from benchmark_tables import plot_mean_band, run_result
from fedray import load_config
from fedray.runtime import run_experiment
from fedray.tracking import read_metrics

REPO = Path(__file__).resolve().parent.parent
PROTOCOL = [
    "data.name=digits",
    "data.num_clients=20",
    "data.partition=dirichlet",
    "train.clients_per_round=10",
    "train.rounds=30",
    "train.local_epochs=2",
    "train.batch_size=16",
    "train.lr=0.05",
    "output.tensorboard=false",
    "output.plots=false",
    "checkpoint.every=30",
]


def run_one(algorithm: str, alpha: float, seed: int, metric: str, extra: list[str], out_dir: Path, also: list[str] = ()) -> dict:
    base = REPO / "examples" / f"{algorithm}_digits.yaml"
    overrides = (
        PROTOCOL + [f"data.alpha={alpha}", f"seed={seed}", f"output.dir={out_dir}", f"output.name={algorithm}-a{alpha}-s{seed}"] + extra
    )
    config = load_config(base if base.is_file() else None, overrides if base.is_file() else overrides + [f"algorithm.name={algorithm}"])
    started = time.perf_counter()
    summary = run_experiment(config, progress=False)
    result = run_result(read_metrics(summary.run_dir), metric, also)
    return {"algorithm": algorithm, "alpha": alpha, "seed": seed, "seconds": time.perf_counter() - started, **result}


#: The per-run CSV's first columns; the ``--also`` metrics' ``<name>_final`` and ``<name>_at_best`` follow.
CSV_FIELDS = ["algorithm", "alpha", "seed", "final", "best", "seconds"]


def also_columns(also: Sequence[str]) -> list[str]:
    """The CSV columns of the ``--also`` metrics: each one's ``<name>_final`` and ``<name>_at_best``."""
    return [f"{name}_{when}" for name in also for when in ("final", "at_best")]


def algorithms_and_alphas(results: list[dict[str, Any]]) -> tuple[list[str], list[float]]:
    """The table's rows (algorithms, in run order) and its α values (ascending)."""
    return list(dict.fromkeys(r["algorithm"] for r in results)), sorted({r["alpha"] for r in results})


def read_results(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """The per-run rows of a table's CSV (as :func:`write_outputs` wrote them, numbers parsed) and the
    ``--also`` metrics it records, in column order."""
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        rows = list(reader)
        also = [name.removesuffix("_final") for name in reader.fieldnames[len(CSV_FIELDS) :: 2]]
    results = [
        {key: str(value) if key == "algorithm" else int(value) if key == "seed" else float(value) for key, value in row.items()}
        for row in rows
    ]
    return results, also


def spread_cell(values: Sequence[float]) -> str:
    """A table cell of fractions ``values`` (one per seed): their mean ± std (divisor n), in percent."""
    percent = 100 * np.array(values)
    return f"{percent.mean():.2f} ± {percent.std():.2f}"


def mean_cell(values: Sequence[float]) -> str:
    """A table cell of fractions ``values`` (one per seed): their mean, in percent."""
    return f"{100 * np.mean(values):.2f}"


def table_markdown(results: list[dict[str, Any]], metric: str, also: Sequence[str] = ()) -> str:
    """The Markdown table of ``results`` (one row per algorithm, mean ± std over seeds of the final and
    best ``metric`` per α, and each ``also`` metric's mean), with the line above it that names the metric."""
    also_keys = also_columns(also)
    algorithms, alphas = algorithms_and_alphas(results)
    lines = [
        f"Metric: `{metric}` (%), mean ± std (divisor n) over seeds {sorted({r['seed'] for r in results})}; "
        "protocol in `benchmarks/digits_table.py`.",
        "",
        "| algorithm | "
        + " | ".join(
            f"α={a} final | α={a} best"
            + "".join(f" | α={a} {k.replace('_at_best', ' at best').replace('_final', ' final')}" for k in also_keys)
            for a in alphas
        )
        + " |",
        "|---|" + "---|" * ((2 + len(also_keys)) * len(alphas)),
    ]
    if also:
        lines[0] += f" `{'`, `'.join(also)}` (%): mean over seeds at the final round and at the round where `{metric}` was best."
    for algorithm in algorithms:
        cells = []
        for alpha in alphas:
            runs = [r for r in results if r["algorithm"] == algorithm and r["alpha"] == alpha]
            cells += [spread_cell([r[key] for r in runs]) for key in ("final", "best")]
            cells += [mean_cell([r[key] for r in runs]) for key in also_keys]
        lines.append(f"| {algorithm} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_outputs(results: list[dict], metric: str, out: Path, also: list[str] = ()) -> None:
    """Writes the per-run rows as ``<out>.csv`` and, unless ``out`` is that CSV, ``out``
    (:func:`table_markdown`) and the curves as ``<out>.png``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_suffix(".csv"), "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=[*CSV_FIELDS, *also_columns(also)])
        writer.writeheader()
        writer.writerows({k: r[k] for k in writer.fieldnames} for r in results)
    if out.suffix == ".csv":
        return
    out.write_text(table_markdown(results, metric, also))

    algorithms, alphas = algorithms_and_alphas(results)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(alphas), figsize=(6 * len(alphas), 4), squeeze=False)
    for ax, alpha in zip(axes[0], alphas):
        for algorithm in algorithms:
            curves = [r["curve"] for r in results if r["algorithm"] == algorithm and r["alpha"] == alpha]
            plot_mean_band(ax, curves, algorithm)
        ax.set_title(f"digits, Dirichlet α={alpha} (mean ± std over seeds)")
        ax.set_xlabel("round")
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algorithms", nargs="+", required=True)
    parser.add_argument("--alphas", nargs="+", type=float, default=[0.1, 0.5])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--metric", default="test_accuracy")
    parser.add_argument("--also", nargs="+", default=[], metavar="METRIC", help="also report these metrics at the final and the best round")
    parser.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE", help="extra override for every run")
    parser.add_argument("--out", type=Path, required=True, help="Markdown table to write (also .csv, .png), or only the per-run .csv")
    args = parser.parse_args(argv)

    results = []
    with tempfile.TemporaryDirectory() as scratch:
        for algorithm in args.algorithms:
            for alpha in args.alphas:
                for seed in args.seeds:
                    result = run_one(algorithm, alpha, seed, args.metric, args.extra, Path(scratch), args.also)
                    print(
                        f"{algorithm:10s} α={alpha:<4} seed={seed}  final={result['final']:.4f}  best={result['best']:.4f}  ({result['seconds']:.0f} s)",
                        file=sys.stderr,
                    )
                    results.append(result)
    write_outputs(results, args.metric, args.out, args.also)
    print(table_markdown(results, args.metric, args.also))
    return 0


if __name__ == "__main__":
    sys.exit(main())
