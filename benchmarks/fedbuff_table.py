"""Synchronous FedAvg against FedBuff (``train.mode: async``) at equal simulated time on the digits
data (docs/guide/systems.md, "Asynchronous aggregation").

Every run: ``examples/fedavg_dropout_digits.yaml``'s 50 clients, phone device profiles and Bernoulli
availability 0.8, without dropout or deadline, FedAvg's server rule (η = 1). The synchronous runs
train 10 clients a round, waiting for all of them (or, with 1.3× over-selection, for the first 10 of
13: Bonawitz et al. 2019); T is the simulated time the plain synchronous run takes for ``--rounds``
rounds, and the other runs take enough rounds to pass it. FedBuff keeps 10 clients training at once
(the synchronous cohort) and aggregates every 5 updates, with staleness weights 1/√(1 + τ) (and
without, exponent 0). Each method's row is the mean over ``--seeds``: the client updates aggregated
within T, the simulated time to first reach 80 % and 90 % test accuracy (and the synchronous run's
time over it: the speed-up), and the best accuracy reached within ¼, ½ and all of T (about 18
minutes on two cores).

    nice -n 10 python benchmarks/fedbuff_table.py --rounds 40 --seeds 0 1
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

import fedray

REPO = Path(__file__).resolve().parents[1]
COMMON = ["systems.selection.deadline_seconds=null", "systems.selection.dropout=0", "systems.selection.over_selection=1"]
FEDBUFF = ["train.mode=async", "systems.fedbuff.concurrency=10", "systems.fedbuff.buffer_size=5"]
# each method's overrides, and its rounds as a multiple of --rounds: enough to run past T
METHODS = {
    "FedAvg, sync (all 10 report)": ([], 1),
    "FedAvg, sync, 1.3× over-selection": (["systems.selection.over_selection=1.3"], 2),
    "FedBuff, C = 10, K = 5, 1/√(1+τ)": (FEDBUFF, 8),
    "FedBuff, C = 10, K = 5, no staleness weight": ([*FEDBUFF, "systems.fedbuff.staleness_exponent=0"], 8),
}
TARGETS = (0.8, 0.9)


def run(overrides: list[str], output: str) -> list[dict]:
    config = fedray.load_config(
        REPO / "examples" / "fedavg_dropout_digits.yaml",
        [f"output.dir={output}", "output.plots=false", "output.tensorboard=false", *COMMON, *overrides],
    )
    return fedray.read_metrics(fedray.run_experiment(config, progress=False).run_dir)


def time_to(rows: list[dict], accuracy: float) -> float:
    """Simulated time at which the test accuracy first reaches ``accuracy`` (inf: never)."""
    return next((row["sim_time"] for row in rows if row["test_accuracy"] >= accuracy), float("inf"))


def best_by(rows: list[dict], sim_time: float) -> float:
    return max((row["test_accuracy"] for row in rows if row["sim_time"] <= sim_time), default=float("nan"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=40, help="rounds of the plain synchronous run, which set T")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    args = parser.parse_args()
    results: dict[str, list[list[dict]]] = {method: [] for method in METHODS}
    horizons = []
    with tempfile.TemporaryDirectory() as output:
        for seed in args.seeds:
            for method, (overrides, multiple) in METHODS.items():
                rows = run([f"seed={seed}", f"train.rounds={multiple * args.rounds}", *overrides], output)
                results[method].append(rows)
                print(f"seed {seed}, {method}: {len(rows)} rounds, {rows[-1]['sim_time']:.1f} s simulated", flush=True)
            horizons.append(results["FedAvg, sync (all 10 report)"][-1][-1]["sim_time"])
    lines = [
        f"T = {np.mean(horizons):.1f} s simulated (mean over seeds {', '.join(map(str, args.seeds))})",
        "",
        "| method | updates within T | time to 80 % (s) | time to 90 % (s) | speed-up to 90 % | acc. @ ¼ T | acc. @ ½ T | acc. @ T |",
        "|---|---|---|---|---|---|---|---|",
    ]
    sync_time_to_90 = None
    for method, runs in results.items():
        for rows, horizon in zip(runs, horizons):
            if rows[-1]["sim_time"] < horizon:
                raise SystemExit(f"{method} ends at {rows[-1]['sim_time']:.1f} s, before T = {horizon:.1f} s: raise its rounds in METHODS")
        updates = np.mean([sum(row["aggregated"] for row in rows if row["sim_time"] <= horizon) for rows, horizon in zip(runs, horizons)])
        times = [np.mean([time_to(rows, target) for rows in runs]) for target in TARGETS]
        sync_time_to_90 = sync_time_to_90 or times[1]
        speed_up = sync_time_to_90 / times[1] if np.isfinite(times[1]) else float("nan")
        accuracies = [np.mean([best_by(rows, horizon * share) for rows, horizon in zip(runs, horizons)]) for share in (0.25, 0.5, 1.0)]
        cells = [f"{updates:.0f}", *(f"{t:.1f}" if np.isfinite(t) else "not reached" for t in times), f"{speed_up:.2f}×"]
        lines.append(f"| {method} | {' | '.join(cells)} | {' | '.join(f'{a:.3f}' for a in accuracies)} |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
