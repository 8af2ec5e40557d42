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

Resumable: each finished cell is appended to ``docs/results/privacy_utility_fmnist.csv`` and skipped on
a rerun (a cell of another ``ROUNDS`` is run again); the Markdown table is rewritten from the CSV after
every cell. Sizing: one FedSC cell of 30 rounds at ε = 4 took 307 CPU-seconds (two workers in one
process), so a 20-round cell costs about 3.5 CPU-minutes, FedRCL's more, the table about 1.5 CPU-hours.

    python benchmarks/privacy_utility_fmnist.py                 # the whole table (24 cells, about 1.5 CPU-hours)
    python benchmarks/privacy_utility_fmnist.py --only fedsc:4  # one cell
    python benchmarks/privacy_utility_fmnist.py --norms         # median update norms of each part, no DP
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import tempfile
import time
from pathlib import Path

from fedray.testing import Federation

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results"
CSV_PATH, MARKDOWN_PATH = RESULTS / "privacy_utility_fmnist.csv", RESULTS / "privacy_utility_fmnist.md"
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
FIELDS = ["algorithm", "epsilon", "delta", "population", "noise_cohort", "noise_multiplier", "rounds", "metric", "final", "seconds"]


def run_cell(label: str, epsilon: float) -> dict:
    settings, metric = ALGORITHMS[label]
    privacy = [*DP, *CLIPS[label], f"privacy.target_epsilon={epsilon}"] if math.isfinite(epsilon) else []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as run_dir:
        federation = Federation(run_dir, [*COMMON, f"train.rounds={ROUNDS}", *settings, *privacy], defaults=()).run(ROUNDS)
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
    }


def finished_cells(path: Path = CSV_PATH) -> dict[tuple[str, float], dict]:
    """The cells of this ``ROUNDS`` in the CSV at ``path`` (a cell of another length is run again)."""
    if not path.exists():
        return {}
    with path.open() as file:
        return {(row["algorithm"], float(row["epsilon"])): row for row in csv.DictReader(file) if int(row["rounds"]) == ROUNDS}


def append(result: dict) -> None:
    new = not CSV_PATH.exists()
    with CSV_PATH.open("a", newline="") as file:
        writer = csv.DictWriter(file, FIELDS)
        if new:
            writer.writeheader()
        writer.writerow(result)


def markdown(cells: dict[tuple[str, float], dict]) -> str:
    """The page ``docs/results/privacy_utility_fmnist.md``: the table of ``cells`` (:func:`finished_cells`)."""
    header = " | ".join(f"ε = {'∞' if math.isinf(e) else f'{e:g}'}" for e in EPSILONS)
    lines = [
        "# Privacy-utility on Fashion-MNIST",
        "",
        f"Written by `python benchmarks/privacy_utility_fmnist.py` (its docstring gives the setting): 100 clients, "
        f"10 per round, {ROUNDS} rounds, central DP emulating N = {POPULATION:,} clients and M = {NOISE_COHORT} per round, "
        f"δ = 1/N. Accuracy after the last round (z: the noise multiplier the accountant charges, each of a client's "
        "P released parts noised with √P·z); *pending*: not run yet.",
        "",
        f"| algorithm (metric) | {header} |",
        "|---|" + "---|" * len(EPSILONS),
    ]
    for label, (_, metric) in ALGORITHMS.items():
        entries = []
        for epsilon in EPSILONS:
            row = cells.get((label, epsilon))
            if row is None:
                entries.append("*pending*")
            else:
                z = f" (z = {float(row['noise_multiplier']):.2f})" if row["noise_multiplier"] else ""
                entries.append(f"{float(row['final']):.3f}{z}")
        lines.append(f"| {label} ({metric}) | {' | '.join(entries)} |")
    return "\n".join(lines) + "\n"


def write_markdown() -> None:
    """Rewrites the page from the CSV."""
    MARKDOWN_PATH.write_text(markdown(finished_cells()))


def median_norms(label: str, rounds: int = 3) -> dict[str, float]:
    """Median of each part's update norm over ``rounds`` rounds' clients, clipping nothing and adding no noise."""
    settings, _ = ALGORITHMS[label]
    unbounded = [f"{setting.split('=')[0]}=.inf" for setting in CLIPS[label]]
    overrides = [*COMMON, f"train.rounds={rounds}", *settings, *DP, *unbounded, "privacy.noise_multiplier=0"]
    with tempfile.TemporaryDirectory() as run_dir:
        federation = Federation(run_dir, overrides, defaults=()).run(rounds)
    norms: dict[str, list[float]] = {}
    for results in federation.results:
        for metrics in results.client_metrics.values():
            for key, value in metrics.items():
                if key.startswith("update_norm"):
                    norms.setdefault(key, []).append(value)
    return {key: statistics.median(values) for key, values in norms.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None, help="cells as label:epsilon (inf for no DP), e.g. fedsc:4")
    parser.add_argument("--norms", action="store_true", help="print the median update norms of each algorithm's parts and stop")
    args = parser.parse_args()
    if args.norms:
        for label in ALGORITHMS:
            print(label, {key: round(value, 3) for key, value in median_norms(label).items()}, flush=True)
        return
    # a column at a time, no DP and ε = 4 first: a table cut short still compares every algorithm
    cells = [(label, epsilon) for epsilon in (math.inf, 4.0, 1.0, 8.0) for label in ALGORITHMS]
    if args.only is not None:
        wanted = {(label, float(epsilon)) for label, epsilon in (cell.split(":") for cell in args.only)}
        cells = [cell for cell in cells if cell in wanted]
    RESULTS.mkdir(parents=True, exist_ok=True)
    for label, epsilon in cells:
        if (label, epsilon) in finished_cells():
            continue
        result = run_cell(label, epsilon)
        append(result)
        write_markdown()
        print(f"{label} ε={epsilon:g}: {result['metric']} {result['final']:.3f} ({result['seconds']} s)", flush=True)


if __name__ == "__main__":
    main()
