"""Resumable results table on the real Fashion-MNIST files: every algorithm, a paper-style protocol.

Each algorithm starts from ``examples/<base>_digits.yaml`` (its own hyperparameters, the papers'
defaults), then the shared protocol is applied:

    Fashion-MNIST (60,000 train / 10,000 test, 28×28), 100 clients, 10 per round (10 %), 100 rounds,
    2 local epochs, batch 32, the example's optimiser, cnn_small, evaluated every 5 rounds, seeds 0, 1.

and one of three settings groups:

* ``global`` (test accuracy of the global model): Dirichlet α = 0.1 and α = 0.5. FedAvg, FedProx,
  FedSC, FedRCL, FedProto, MOON, FedSKC, FedRCL's β = 0 ablation (``fedrcl_beta0``) and FedSKC
  with ``gpr_mode=residual, u_mode=none`` (``fedskc_stabilised``).
* ``personalised`` (``personal_accuracy``: every client's own model on its held-out 25 %, and its
  spread across clients ``personal_accuracy_std``): a pathological split (``shards2``: 2 classes per
  client) and Dirichlet α = 0.1 (``pdir0.1``). FedAvg, Local, FedPer, FedCoSR.
* ``ssl`` (``probe_accuracy``: linear probe of the learned encoders on labelled data): Dirichlet
  α = 0.1 and 0.5. Hetero-SSFL, its μ = 0 local-SSL variant (``hetero_ssfl_local``), FedAvg+BYOL,
  and Hetero-SSFL with the debiased alignment (``hetero_ssfl_debiased``).

Every finished (algorithm, setting, seed) is appended to ``<out>.csv`` (and its curve to
``<out>_curves.csv``) and skipped on the next invocation; an interrupted run (Ctrl-C, SIGTERM) keeps
its checkpoints under ``--runs-dir`` and is resumed from them. ``--report`` rewrites the table part of
``<out>.md`` (between the two marker lines; the prose around it is kept) and ``<out>.png`` (mean ± std
band over seeds) from the CSVs alone::

    nice -n 19 python benchmarks/real_table.py                 # run (or continue) everything, in order
    python benchmarks/real_table.py --groups global --algorithms fedavg --seeds 0
    python benchmarks/real_table.py --report                   # table and figure from the CSVs
"""

from __future__ import annotations

import argparse
import csv
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmark_tables import plot_mean_band, run_result
from fedray import load_config
from fedray.runtime import resume_experiment, run_experiment
from fedray.tracking import read_metrics

REPO = Path(__file__).resolve().parent.parent
ROUNDS = 100
PROTOCOL = [
    "data.name=fmnist",
    "data.num_clients=100",
    "train.clients_per_round=10",
    f"train.rounds={ROUNDS}",
    "train.local_epochs=2",
    "train.batch_size=32",
    "eval.every=5",
    "checkpoint.every=5",
    "checkpoint.keep=1",
    "output.tensorboard=false",
    "output.plots=false",
]
SETTINGS = {
    "dir0.1": ["data.partition=dirichlet", "data.alpha=0.1"],
    "dir0.5": ["data.partition=dirichlet", "data.alpha=0.5"],
    "shards2": ["data.partition=shards", "data.classes_per_client=2",
                "data.client_test_fraction=0.25", "eval.personalized=true"],
    "pdir0.1": ["data.partition=dirichlet", "data.alpha=0.1",
                "data.client_test_fraction=0.25", "eval.personalized=true"],
}
# Table name -> (examples/<base>_digits.yaml, extra overrides).
VARIANTS = {
    "fedrcl_beta0": ("fedrcl", ["algorithm.beta=0"]),
    # FedSKC with the switches chosen on a digits validation split (docs/results_fmnist.md, "FedSKC"):
    # non-shrinking period review and no 1/U sharpening of LCL; the `fedskc` row keeps the paper's.
    "fedskc_stabilised": ("fedskc", ["algorithm.gpr_mode=residual", "algorithm.u_mode=none"]),
    # 20 probe epochs over a client's ~600 Fashion-MNIST images (the digits examples use 300 over ~70).
    "hetero_ssfl": ("hetero_ssfl", ["algorithm.probe_epochs=20"]),
    "hetero_ssfl_local": ("hetero_ssfl_local", ["algorithm.probe_epochs=20"]),
    "hetero_ssfl_debiased": ("hetero_ssfl_debiased", ["algorithm.probe_epochs=20"]),
    "fedavg_byol": ("fedavg_byol", ["algorithm.probe_epochs=20"]),
}
GROUPS: dict[str, dict[str, Any]] = {
    "global": {
        "algorithms": ["fedavg", "fedprox", "fedsc", "fedrcl", "fedproto", "moon", "fedskc", "fedrcl_beta0",
                       "fedskc_stabilised"],
        "settings": ["dir0.1", "dir0.5"],
        "metric": "test_accuracy",
        "also": [],
    },
    "personalised": {
        "algorithms": ["fedavg", "local", "fedper", "fedcosr"],
        "settings": ["shards2", "pdir0.1"],
        "metric": "personal_accuracy",
        "also": ["personal_accuracy_std"],
    },
    "ssl": {
        "algorithms": ["hetero_ssfl", "hetero_ssfl_local", "fedavg_byol", "hetero_ssfl_debiased"],
        "settings": ["dir0.1", "dir0.5"],
        "metric": "probe_accuracy",
        "also": [],
    },
}
RESULT_FIELDS = ["group", "algorithm", "setting", "seed", "metric", "final", "best", "rounds",
                 "seconds", "seconds_per_round", "personal_accuracy_std_final",
                 "personal_accuracy_std_at_best"]
CURVE_FIELDS = ["group", "algorithm", "setting", "seed", "round", "value"]
TABLE_START = "<!-- table: generated by `python benchmarks/real_table.py --report`; do not edit -->"
TABLE_END = "<!-- end of generated table -->"


def config_for(algorithm: str, setting: str, seed: int, extra: list[str]):
    base, variant_overrides = VARIANTS.get(algorithm, (algorithm, []))
    path = REPO / "examples" / f"{base}_digits.yaml"
    overrides = PROTOCOL + SETTINGS[setting] + variant_overrides + [f"seed={seed}"] + extra
    return load_config(path, overrides)


def read_csv(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def append_csv(path: Path, fields: list[str], rows: list[dict[str, Any]]) -> None:
    new = not path.is_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields, extrasaction="ignore")
        if new:
            writer.writeheader()
        writer.writerows(rows)


def run_entry(group: str, algorithm: str, setting: str, seed: int, runs_dir: Path, extra: list[str]) -> dict[str, Any]:
    """Run (or resume, or just read back) one entry in ``runs_dir/<algorithm>-<setting>-s<seed>``."""
    spec = GROUPS[group]
    config = config_for(algorithm, setting, seed, extra)
    run_dir = runs_dir / f"{group}-{algorithm}-{setting}-s{seed}"
    summary_file = run_dir / "summary.json"
    started = time.perf_counter()
    finished = summary_file.is_file() and json.loads(summary_file.read_text()).get("rounds") == config.train.rounds
    if not finished:
        if (run_dir / "config.yaml").is_file():
            print(f"resuming {run_dir}", file=sys.stderr)
            resume_experiment(run_dir, progress=False)
        else:
            run_experiment(config, run_dir=run_dir, progress=False)
    seconds = json.loads(summary_file.read_text()).get("seconds", time.perf_counter() - started)
    result = run_result(run_dir, spec["metric"], spec["also"])
    return {
        "group": group, "algorithm": algorithm, "setting": setting, "seed": seed, "metric": spec["metric"],
        "rounds": config.train.rounds, "seconds": round(seconds, 1),
        "seconds_per_round": round(seconds / config.train.rounds, 2), **result,
    }


def planned(groups: list[str], algorithms: list[str] | None, seeds: list[int]) -> list[tuple[str, str, str, int]]:
    """(group, algorithm, setting, seed) in run order: group by group, seed by seed, algorithm by
    algorithm, setting by setting."""
    order = []
    for group in groups:
        spec = GROUPS[group]
        for seed in seeds:
            for algorithm in spec["algorithms"]:
                if algorithms is None or algorithm in algorithms:
                    order += [(group, algorithm, setting, seed) for setting in spec["settings"]]
    return order


def run_all(args: argparse.Namespace) -> None:
    results_csv, curves_csv = args.out.with_suffix(".csv"), args.out.with_name(args.out.stem + "_curves.csv")
    done = {(r["group"], r["algorithm"], r["setting"], int(r["seed"])) for r in read_csv(results_csv)}
    todo = [entry for entry in planned(args.groups, args.algorithms, args.seeds) if entry not in done]
    print(f"{len(done)} entries done, {len(todo)} to run", file=sys.stderr)
    # SIGTERM stops like Ctrl-C: the current run keeps its last checkpoint and resumes next time.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    for group, algorithm, setting, seed in todo:
        result = run_entry(group, algorithm, setting, seed, args.runs_dir, args.extra)
        append_csv(curves_csv, CURVE_FIELDS, [
            {"group": group, "algorithm": algorithm, "setting": setting, "seed": seed, "round": r, "value": v}
            for r, v in result["curve"]
        ])
        append_csv(results_csv, RESULT_FIELDS, [result])
        print(f"{group:12s} {algorithm:18s} {setting:8s} seed={seed}  final={result['final']:.4f}  "
              f"best={result['best']:.4f}  ({result['seconds_per_round']:.1f} s/round)", file=sys.stderr, flush=True)


def cell(rows: list[dict[str, str]], key: str, seeds_wanted: int) -> str:
    if not rows:
        return "pending"
    values = 100 * np.array([float(r[key]) for r in rows])
    text = f"{values.mean():.2f} ± {values.std():.2f}" if len(values) > 1 else f"{values[0]:.2f}"
    return text + (f" ({len(values)}/{seeds_wanted} seeds)" if len(values) < seeds_wanted else "")


def in_progress(runs_dir: Path, done: set[tuple[str, str, str, int]]) -> list[str]:
    """One line per started but unfinished entry in ``runs_dir``: its last evaluated round and value."""
    lines = []
    for group, spec in GROUPS.items():
        for run_dir in sorted(runs_dir.glob(f"{group}-*")):
            _, algorithm, setting, seed = run_dir.name.split("-")  # run_entry's <group>-<algorithm>-<setting>-s<seed>
            if (group, algorithm, setting, int(seed[1:])) in done:
                continue
            rows = [r for r in read_metrics(run_dir) if r.get(spec["metric"]) is not None]
            if rows:
                lines.append(f"- {group} / {algorithm} / {setting} / seed {seed[1:]}: round {rows[-1]['round']} "
                             f"of {ROUNDS}, `{spec['metric']}` {100 * rows[-1][spec['metric']]:.2f} %")
    return lines


def report(out: Path, seeds_wanted: int, runs_dir: Path) -> None:
    results = read_csv(out.with_suffix(".csv"))
    curves = read_csv(out.with_name(out.stem + "_curves.csv"))
    lines = [TABLE_START, ""]
    for group, spec in GROUPS.items():
        settings = spec["settings"]
        header = [f"{s} final | {s} best" for s in settings]
        if spec["also"]:
            header = [f"{s} final | {s} best | {s} std across clients (final)" for s in settings]
        lines += [
            f"**{group}** — `{spec['metric']}` (%), mean ± std over seeds, {ROUNDS} rounds:",
            "",
            "| algorithm | " + " | ".join(header) + " |",
            "|---|" + "---|" * (len(settings) * (3 if spec["also"] else 2)),
        ]
        for algorithm in spec["algorithms"]:
            cells = []
            for setting in settings:
                rows = [r for r in results if (r["group"], r["algorithm"], r["setting"]) == (group, algorithm, setting)]
                cells += [cell(rows, "final", seeds_wanted), cell(rows, "best", seeds_wanted)]
                if spec["also"]:
                    cells.append(cell(rows, f"{spec['also'][0]}_final", seeds_wanted))
            lines.append(f"| {algorithm} | " + " | ".join(cells) + " |")
        lines.append("")
    seconds = [float(r["seconds_per_round"]) for r in results]
    if seconds:
        lines.append(f"{len(results)} entries finished; median {np.median(seconds):.1f} s per round on a shared 2-core CPU.")
    done = {(r["group"], r["algorithm"], r["setting"], int(r["seed"])) for r in results}
    unfinished = in_progress(runs_dir, done)
    if unfinished:
        lines += ["", "Started, not finished (not in the table; they resume from their last checkpoint):", "", *unfinished]
    lines += ["", TABLE_END]
    table = "\n".join(lines)
    md = out.with_suffix(".md")
    text = md.read_text() if md.is_file() else f"# Fashion-MNIST results\n\n{TABLE_START}\n{TABLE_END}\n"
    before, _, rest = text.partition(TABLE_START)
    _, _, after = rest.partition(TABLE_END)
    md.write_text(before + table + after)
    plot_curves(curves, out.with_suffix(".png"))
    print(table)


def plot_curves(curves: list[dict[str, str]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(group, setting) for group, spec in GROUPS.items() for setting in spec["settings"]]
    fig, axes = plt.subplots(len(GROUPS), 2, figsize=(12, 4 * len(GROUPS)), squeeze=False)
    for ax, (group, setting) in zip(axes.flat, panels):
        for algorithm in GROUPS[group]["algorithms"]:
            rows = [r for r in curves if (r["group"], r["algorithm"], r["setting"]) == (group, algorithm, setting)]
            by_seed: dict[str, list[tuple[int, float]]] = {}
            for r in rows:
                by_seed.setdefault(r["seed"], []).append((int(r["round"]), float(r["value"])))
            if by_seed:
                plot_mean_band(ax, list(by_seed.values()), algorithm)
        ax.set_title(f"Fashion-MNIST, {group}, {setting}")
        ax.set_xlabel("round")
        ax.set_ylabel(GROUPS[group]["metric"])
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "pending", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", nargs="+", choices=list(GROUPS), default=list(GROUPS))
    parser.add_argument("--algorithms", nargs="+", default=None, help="only these algorithms (default: all of each group)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE",
                        help="extra override for every run (changes the protocol: use another --out)")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "results_fmnist.md",
                        help="table to write; the CSVs and the PNG sit next to it")
    parser.add_argument("--runs-dir", type=Path, default=REPO / "runs" / "real_table",
                        help="run directories (checkpoints of unfinished entries)")
    parser.add_argument("--report", action="store_true", help="only regenerate the table and the figure from the CSVs")
    args = parser.parse_args(argv)
    if not args.report:
        try:
            run_all(args)
        except KeyboardInterrupt:
            print("stopped; the same command resumes (finished entries are in the CSV)", file=sys.stderr)
            return 130
    report(args.out, len(args.seeds), args.runs_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
