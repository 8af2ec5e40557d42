"""Sweep throughput: cold trials (every trial starts its own process, server and workers) against warm
trials (``reuse_workers``: a trial process keeps them for the next trial), in one invocation.

The sweep: FedProx on digits (examples/fedprox_digits.yaml: 20 clients, α=0.1, 10 clients per round,
2 local epochs), 5 rounds, grid train.lr × algorithm.mu (4 × 4 = 16 trials), 1 worker per trial
(driver + worker = 2 CPUs reserved), 2 trials at a time on one local Ray with 4 logical CPUs, no
plots or TensorBoard. Both sweeps run on the same Ray, cold first.

For each: wall seconds of ``run_sweep``, the sum of its trials' round times (the engine's ``seconds``
column in rounds.parquet), the ratio wall / (sum of round times + one Ray start-up) (target <= 2,
issue 18) and trials per hour; and whether the two sweeps' metrics are identical.

    python benchmarks/sweep_throughput.py            # 16 trials x 5 rounds (a few minutes on 2 cores)
    python benchmarks/sweep_throughput.py --quick    # 8 trials x 3 rounds
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import ray

from fedray.layout import ROUNDS_FILE, TRIALS_FILE
from fedray.tune import parse_sweep, run_sweep

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TARGET_RATIO = 2.0
RAY_CPUS = 4  # two trials of 2 CPUs each (driver + 1 worker) at a time


def sweep_spec(out_dir: Path, reuse_workers: bool, quick: bool) -> dict:
    return {
        "name": "warm" if reuse_workers else "cold",
        "base": str(EXAMPLES / "fedprox_digits.yaml"),
        "overrides": [
            f"train.rounds={3 if quick else 5}",
            "resources.num_workers=1",
            "output.tensorboard=false",
            "output.plots=false",
        ],
        "space": {
            "train.lr": {"grid": [0.02, 0.05, 0.1, 0.2]},
            "algorithm.mu": {"grid": [0.01, 0.1] if quick else [0.001, 0.01, 0.1, 1.0]},
        },
        "max_concurrent_trials": 2,
        "max_failures": 0,
        "reuse_workers": reuse_workers,
        "output": {"dir": str(out_dir)},
    }


def run(out_dir: Path, reuse_workers: bool, quick: bool, ray_startup_s: float) -> tuple[dict, pd.DataFrame]:
    raw = sweep_spec(out_dir, reuse_workers, quick)
    spec = parse_sweep(raw, out_dir / f"{raw['name']}.yaml", out_dir)
    started = time.perf_counter()
    outcome = run_sweep(spec)
    wall = time.perf_counter() - started
    if outcome.status != "finished" or outcome.num_errors:
        raise SystemExit(f"the {raw['name']} sweep did not finish cleanly ({outcome.status}, {outcome.num_errors} errors)")
    trials = pd.read_parquet(outcome.sweep_dir / TRIALS_FILE)
    rounds = pd.read_parquet(outcome.sweep_dir / ROUNDS_FILE).merge(trials[["trial_id", "train.lr", "algorithm.mu"]], on="trial_id")
    round_sum = float(rounds["seconds"].sum())
    figures = {
        "trials": len(trials),
        "wall_s": wall,
        "sum_round_s": round_sum,
        "ray_startup_s": ray_startup_s,
        "ratio": wall / (round_sum + ray_startup_s),
        "trials_per_hour": len(trials) / wall * 3600,
    }
    return figures, rounds


def same_results(cold: pd.DataFrame, warm: pd.DataFrame) -> bool:
    """Every trial's rounds have the same metrics (timing aside) in both sweeps."""
    keys = ["train.lr", "algorithm.mu", "round"]
    columns = [c for c in cold.columns if c not in ("trial_id", "seconds")]
    return cold[columns].sort_values(keys).reset_index(drop=True).equals(warm[columns].sort_values(keys).reset_index(drop=True))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="8 trials x 3 rounds")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    ray.init(address="local", num_cpus=RAY_CPUS, include_dashboard=False, log_to_driver=False)
    ray_startup_s = time.perf_counter() - started
    try:
        with tempfile.TemporaryDirectory() as scratch:
            cold, cold_rounds = run(Path(scratch), reuse_workers=False, quick=args.quick, ray_startup_s=ray_startup_s)
            warm, warm_rounds = run(Path(scratch), reuse_workers=True, quick=args.quick, ray_startup_s=ray_startup_s)
    finally:
        ray.shutdown()

    print(f"\n{'':<18}{'cold (old path)':>18}{'warm (reuse_workers)':>22}")
    for name in ("trials", "wall_s", "sum_round_s", "ray_startup_s", "ratio", "trials_per_hour"):
        print(f"{name:<18}{cold[name]:>18.2f}{warm[name]:>22.2f}")
    identical = same_results(cold_rounds, warm_rounds)
    print(f"warm over cold trials/hour: {warm['trials_per_hour'] / cold['trials_per_hour']:.2f}x")
    print(f"metrics identical in both sweeps: {'yes' if identical else 'NO'}")
    print(
        f"target: warm wall / (sum of round times + Ray start-up) <= {TARGET_RATIO:g} -> {'met' if warm['ratio'] <= TARGET_RATIO else 'NOT met'}"
    )
    if args.json:
        args.json.write_text(json.dumps({"cold": cold, "warm": warm, "identical": identical}, indent=2))
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
