"""The privacy-utility table on Fashion-MNIST (docs/guide/privacy.md, 'Evidence'): FedAvg, FedProx,
FedSC, FedSKC, FedRCL and FedCoSR under central DP at ε ∈ {1, 4, 8, ∞}, in this process on the local
backend with two workers.

Setting: 100 simulated clients (Dirichlet α = 0.5), 10 per round, ``ROUNDS`` rounds of one local epoch,
batch 32, cnn_small; the noise and the accountant emulate a population of N = 10,000 clients sampling
M = 500 a round (``privacy.population_size``, ``privacy.noise_cohort_size``), δ = 1/N (as the issue asks;
``allow_large_delta``, since fedray's default is 1/N^1.1), RDP accountant, fixed-size sampling (the
draw fedray makes; FedSC and FedSKC need it for their per-client uploads). The ε reported is that of
the emulated deployment, not a guarantee about the 100 simulated clients. FedCoSR is personalised: its
cell is the mean accuracy of each client's own model on its held-out 25 % (``personal_accuracy``),
the others the global model's test accuracy.

Clip bounds: ``privacy.clip`` for the weights' delta and each algorithm's bound of its other part near
the median norm of its non-private updates (``--norms`` measures them: a deployment would have to pay
privacy for that measurement, or take the bounds from public data).

Seeds: 0, 1 and 2 for every cell (seeds 1 and 2 of ε ∈ {4, ∞} first, then ε = 1 and 8), so that each algorithm's loss to DP is a paired difference over seeds (the same seed gives both
cells the same data split, cohorts, data order and initial weights) with Student's t 95 % interval.

Resumable: each finished cell is appended to ``docs/results/privacy_utility_fmnist.csv`` (with its
seed and the commit it ran from) and skipped on a rerun (a cell of another ``ROUNDS`` is run again);
the Markdown table is rewritten from the CSV after every cell, and each invocation's provenance
(``machine()``: commit, versions, machine, date, load) is appended to ``privacy_utility_fmnist.json``.
Sizing: a 20-round cell takes about 3 minutes on two cores (two workers in one process), the 24
seed-0 cells about 1.5 hours, each further seed of ε ∈ {4, ∞} 36 minutes.

    python benchmarks/privacy_utility_fmnist.py                 # every cell not yet in the CSV, in the order above
    python benchmarks/privacy_utility_fmnist.py --only fedsc:4  # one cell (seed 0)
    python benchmarks/privacy_utility_fmnist.py --only fedsc:4:1  # one cell of seed 1
    python benchmarks/privacy_utility_fmnist.py --norms         # median update norms of each part, no DP
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import tempfile
import time
from pathlib import Path

from benchmark_tables import median_update_norms, paired_text
from fedray.testing import Federation
from vectorized import machine

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results"
CSV_PATH, MARKDOWN_PATH = RESULTS / "privacy_utility_fmnist.csv", RESULTS / "privacy_utility_fmnist.md"
JSON_PATH = RESULTS / "privacy_utility_fmnist.json"
ROUNDS = 20
POPULATION, NOISE_COHORT = 10_000, 500
EPSILONS = (1.0, 4.0, 8.0, math.inf)
COMMON = [
    "data.name=fmnist",
    "data.num_clients=100",
    "data.partition=dirichlet",
    "data.alpha=0.5",
    "model.name=cnn_small",
    "train.clients_per_round=10",
    "train.local_epochs=1",
    "train.batch_size=32",
    "eval.every=10",
    "resources.num_workers=2",
]
DP = [
    "privacy.mechanism=central",
    "privacy.accountant=rdp",
    "privacy.sampling=fixed_size",
    f"privacy.population_size={POPULATION}",
    f"privacy.noise_cohort_size={NOISE_COHORT}",
    f"privacy.delta={1 / POPULATION}",
    "privacy.allow_large_delta=true",
]
PERSONAL = ["data.client_test_fraction=0.25", "eval.personalized=true"]
#: label -> (the algorithm's settings: the Fashion-MNIST sweeps' chosen values, docs/results/fmnist.md; the metric)
ALGORITHMS = {
    "fedavg": (["algorithm.name=fedavg", "train.lr=0.2"], "test_accuracy"),
    "fedprox": (["algorithm.name=fedprox", "algorithm.mu=0.01", "train.lr=0.2"], "test_accuracy"),
    "fedsc": (["algorithm.name=fedsc", "algorithm.tau=0.5", "train.lr=0.2"], "test_accuracy"),
    "fedskc": (["algorithm.name=fedskc", "algorithm.tau=0.5", "algorithm.gda_mode=fedavg", "train.lr=0.2"], "test_accuracy"),
    "fedrcl": (["algorithm.name=fedrcl", "algorithm.beta=2.0", "train.lr=0.1"], "test_accuracy"),
    "fedcosr": (["algorithm.name=fedcosr", "algorithm.tau=1.0", "train.lr=0.1", *PERSONAL], "personal_accuracy"),
}
#: label -> the clip bounds, somewhat below --norms' medians over 3 rounds (weights' delta 0.9-2.4, FedSC's
#: prototypes 12.4, FedSKC's knowledge 11.0, FedCoSR's centroid sums 2040 and counts 219: ratio 9.3)
CLIPS = {
    "fedavg": ["privacy.clip=1.0"],
    "fedprox": ["privacy.clip=1.0"],
    "fedsc": ["privacy.clip=1.0", "privacy.clip_prototypes=10"],
    "fedskc": ["privacy.clip=1.0", "privacy.clip_logits=10"],
    "fedrcl": ["privacy.clip=1.0"],
    "fedcosr": ["privacy.clip=1.0", "privacy.clip_prototypes=1400", "privacy.clip_counts=150"],
}
FIELDS = [
    "algorithm",
    "epsilon",
    "delta",
    "population",
    "noise_cohort",
    "noise_multiplier",
    "rounds",
    "metric",
    "final",
    "seconds",
    "seed",
    "commit",
]
#: The seeds run beside seed 0 (see the module docstring).
EXTRA_SEEDS = (1, 2)
PROVENANCE_NOTE = (
    "One entry per invocation of benchmarks/privacy_utility_fmnist.py, taken before its runs; the CSV's commit "
    "column names the tree of each cell. The 24 seed-0 cells came before provenance was recorded: they were "
    "committed in 15dbb21 and dce477d (their commit column is empty)."
)


def run_cell(label: str, epsilon: float, seed: int, commit: str) -> dict:
    settings, metric = ALGORITHMS[label]
    privacy = [*DP, *CLIPS[label], f"privacy.target_epsilon={epsilon}"] if math.isfinite(epsilon) else []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as run_dir:
        overrides = [*COMMON, f"train.rounds={ROUNDS}", f"seed={seed}", *settings, *privacy]
        federation = Federation(run_dir, overrides, defaults=()).run(ROUNDS)
    row = federation.rows[-1]
    return {
        "algorithm": label,
        "epsilon": epsilon,
        "delta": 1 / POPULATION if privacy else "",
        "population": POPULATION if privacy else "",
        "noise_cohort": NOISE_COHORT if privacy else "",
        "noise_multiplier": row.get("dp_noise_multiplier", ""),
        "rounds": ROUNDS,
        "metric": metric,
        "final": row[metric],
        "seconds": round(time.perf_counter() - start, 1),
        "seed": seed,
        "commit": commit,
    }


Cell = tuple[str, float, int]  # (algorithm label, ε, seed)


def finished_cells(path: Path = CSV_PATH) -> dict[Cell, dict]:
    """The cells of this ``ROUNDS`` in the CSV at ``path`` (a cell of another length is run again)."""
    if not path.exists():
        return {}
    with path.open() as file:
        rows = [row for row in csv.DictReader(file) if int(row["rounds"]) == ROUNDS]
    return {(row["algorithm"], float(row["epsilon"]), int(row["seed"])): row for row in rows}


def append(result: dict) -> None:
    new = not CSV_PATH.exists()
    with CSV_PATH.open("a", newline="") as file:
        writer = csv.DictWriter(file, FIELDS)
        if new:
            writer.writeheader()
        writer.writerow(result)


def record_provenance(provenance: dict) -> None:
    """Appends one invocation's ``machine()`` to the JSON beside the CSV."""
    runs = json.loads(JSON_PATH.read_text())["runs"] if JSON_PATH.exists() else []
    JSON_PATH.write_text(json.dumps({"note": PROVENANCE_NOTE, "runs": [*runs, provenance]}, indent=2) + "\n")


def epsilon_label(epsilon: float) -> str:
    return "∞" if math.isinf(epsilon) else f"{epsilon:g}"


def seeds_of(cells: dict[Cell, dict], label: str, epsilon: float) -> dict[int, float]:
    return {seed: float(row["final"]) for (name, eps, seed), row in cells.items() if (name, eps) == (label, epsilon)}


def mean_cell(cells: dict[Cell, dict], label: str, epsilon: float) -> str:
    """One seed: its value; several: mean ± std (ddof 1) and n; z where DP ran."""
    finals = list(seeds_of(cells, label, epsilon).values())
    if not finals:
        return "*pending*"
    z = next((row["noise_multiplier"] for (name, eps, _), row in cells.items() if (name, eps) == (label, epsilon)), "")
    z_text = f"z = {float(z):.2f}" if z else ""
    if len(finals) == 1:
        return f"{finals[0]:.3f}" + (f" ({z_text})" if z_text else "")
    spread = statistics.stdev(finals)
    return f"{statistics.mean(finals):.3f} ± {spread:.3f} (n = {len(finals)}" + (f", {z_text})" if z_text else ")")


def paired_cell(cells: dict[Cell, dict], label: str, epsilon: float) -> str:
    """The cell at ``epsilon`` minus the cell at ε = ∞ of the same seed (:func:`paired_text`)."""
    return paired_text(seeds_of(cells, label, epsilon), seeds_of(cells, label, math.inf), decimals=1, with_n=True) or "*pending*"


def markdown(cells: dict[Cell, dict]) -> str:
    """The page ``docs/results/privacy_utility_fmnist.md``: the tables of ``cells`` (:func:`finished_cells`)."""
    header = " | ".join(f"ε = {epsilon_label(e)}" for e in EPSILONS)
    private = [e for e in EPSILONS if math.isfinite(e)]
    lines = [
        "# Privacy-utility on Fashion-MNIST",
        "",
        f"Written by `python benchmarks/privacy_utility_fmnist.py` (its docstring gives the setting): 100 clients, "
        f"10 per round, {ROUNDS} rounds, central DP emulating N = {POPULATION:,} clients and M = {NOISE_COHORT} per round, "
        f"δ = 1/N. Accuracy after the last round: one seed's value, or mean ± standard deviation (divisor n − 1) over n seeds "
        "(z: the noise multiplier the accountant charges, each of a client's P released parts noised with √P·z); "
        "*pending*: not run yet.",
        "",
        f"| algorithm (metric) | {header} |",
        "|---|" + "---|" * len(EPSILONS),
    ]
    for label, (_, metric) in ALGORITHMS.items():
        lines.append(f"| {label} ({metric}) | {' | '.join(mean_cell(cells, label, e) for e in EPSILONS)} |")
    lines += [
        "",
        "## What DP costs each algorithm, paired by seed",
        "",
        "Accuracy at ε minus accuracy without DP (ε = ∞) of the same seed, in percentage points: the same seed "
        "gives both runs the same data split, cohorts, data order and initial weights, so the difference is DP's "
        "alone. Mean over the n paired seeds [95 % confidence interval, Student's t with n − 1 degrees of "
        "freedom]; **bold**: the interval excludes 0. One seed: its difference, no interval.",
        "",
        "| algorithm | " + " | ".join(f"ε = {epsilon_label(e)}" for e in private) + " |",
        "|---|" + "---|" * len(private),
    ]
    for label in ALGORITHMS:
        lines.append(f"| {label} | {' | '.join(paired_cell(cells, label, e) for e in private)} |")
    return "\n".join(lines) + "\n"


def write_markdown() -> None:
    """Rewrites the page from the CSV."""
    MARKDOWN_PATH.write_text(markdown(finished_cells()))


def planned_cells() -> list[Cell]:
    """Seed 0 a column at a time (no DP and ε = 4 first: a table cut short still compares every
    algorithm); then seeds 1 and 2 of ε ∈ {∞, 4} an algorithm at a time (a cut-short run still pairs
    whole algorithms); then seeds 1 and 2 of ε ∈ {1, 8}."""
    first = [(label, epsilon, 0) for epsilon in (math.inf, 4.0, 1.0, 8.0) for label in ALGORITHMS]
    paired = [(label, epsilon, seed) for label in ALGORITHMS for seed in EXTRA_SEEDS for epsilon in (math.inf, 4.0)]
    rest = [(label, epsilon, seed) for epsilon in (1.0, 8.0) for label in ALGORITHMS for seed in EXTRA_SEEDS]
    return first + paired + rest


def median_norms(label: str, rounds: int = 3) -> dict[str, float]:
    """Median of each part's update norm over ``rounds`` rounds' clients, clipping nothing and adding no noise."""
    settings, _ = ALGORITHMS[label]
    unbounded = [f"{setting.split('=')[0]}=.inf" for setting in CLIPS[label]]
    overrides = [*COMMON, *settings, *DP, *unbounded, "privacy.noise_multiplier=0"]
    return median_update_norms(overrides, rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only", nargs="*", default=None, help="cells as label:epsilon[:seed] (inf for no DP; seed 0 if left out), e.g. fedsc:4:1"
    )
    parser.add_argument("--norms", action="store_true", help="print the median update norms of each algorithm's parts and stop")
    args = parser.parse_args()
    if args.norms:
        for label in ALGORITHMS:
            print(label, {key: round(value, 3) for key, value in median_norms(label).items()}, flush=True)
        return
    cells = planned_cells()
    if args.only is not None:
        wanted = set()
        for cell in args.only:
            label, epsilon, *seed = cell.split(":")
            wanted.add((label, float(epsilon), int(seed[0]) if seed else 0))
        cells = [cell for cell in cells if cell in wanted]
    cells = [cell for cell in cells if cell not in finished_cells()]
    if not cells:
        print("every planned cell is in the CSV")
        return
    RESULTS.mkdir(parents=True, exist_ok=True)
    provenance = machine()  # before the runs: the tree they ran from, not the CSV this appends to
    record_provenance({**provenance, "cells": [f"{label}:{epsilon_label(eps)}:{seed}" for label, eps, seed in cells]})
    for label, epsilon, seed in cells:
        result = run_cell(label, epsilon, seed, provenance["commit"])
        append(result)
        write_markdown()
        print(f"{label} ε={epsilon:g} seed {seed}: {result['metric']} {result['final']:.3f} ({result['seconds']} s)", flush=True)


if __name__ == "__main__":
    main()
