"""Long runs: the cost of writing metrics (one round row and one row per client every round) and the
driver's memory over many rounds, in one invocation.

Workload: ``synthetic`` 1×8×8 data with ``--registered`` clients of 2 samples each (IID), ``--per-round``
clients per round for ``--rounds`` rounds, ``cnn_small``, 1 local epoch, evaluation on 200 test images
every 10 rounds, a checkpoint every ``--checkpoint-every`` rounds (by default only at the end: one
segment of metric parts, the hardest case for memory), 2 worker actors of 1 CPU: the
federated work per client is tiny, so the per-client rows weigh as much as they can.

Measured at the driver:

- metric writing: the time spent in the ``MetricsParquet`` callback (its parts every round or
  second, the part of each checkpoint interval, and the final compaction into ``metrics.parquet``),
  by a timing wrapper around it, and its share of the round loop (target < 5 %);
- O(rows): the writing time of each window of ``--window`` rounds (every window writes as many rows,
  so a flat series is O(rows) in total; the ratio last / first window is printed);
- memory: the driver's RSS every ``--rss-every`` rounds (first, last, max).

    nice -n 10 python benchmarks/long_run.py --rounds 1000 --per-round 1000 --json benchmarks/results/long_run.json
    python benchmarks/long_run.py --rounds 100   # a shorter run of the same shape
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import ray

from fedray import load_config
from fedray.runtime import run_experiment
from fedray.runtime.experiment import default_callbacks
from fedray.tracking import Callback, MetricsParquet, RunContext
from scale import workload as scale_workload  # benchmarks/ is on sys.path when a script here runs


def workload(rounds: int, per_round: int, registered: int, checkpoint_every: int) -> list[str]:
    return scale_workload(registered, per_round, rounds) + [
        "data.synthetic.num_test=200",
        "eval.every=10",
        f"checkpoint.every={checkpoint_every}",
    ]


def resident_bytes() -> int:
    """This process's resident set size now (Linux)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class TimedCallback(Callback):
    """Runs ``inner``'s hooks and records the seconds each took: per round, and at the start and end."""

    def __init__(self, inner: Callback) -> None:
        self.inner = inner
        self.start_seconds = 0.0
        self.round_seconds: list[float] = []
        self.end_seconds = 0.0

    def on_run_start(self, run: RunContext) -> None:
        started = time.perf_counter()
        self.inner.on_run_start(run)
        self.start_seconds = time.perf_counter() - started

    def on_round_end(self, run: RunContext, row: dict[str, Any], client_rows: list[dict[str, Any]]) -> None:
        started = time.perf_counter()
        self.inner.on_round_end(run, row, client_rows)
        self.round_seconds.append(time.perf_counter() - started)

    def on_run_end(self, run: RunContext) -> None:
        started = time.perf_counter()
        self.inner.on_run_end(run)
        self.end_seconds = time.perf_counter() - started


class LoopProbe(Callback):
    """The round loop's wall time, the driver's RSS every ``every`` rounds, and a progress line."""

    def __init__(self, every: int) -> None:
        self.every = every
        self.rss: list[tuple[int, int]] = []  # (round, bytes)
        self.loop_started = 0.0
        self.loop_seconds = 0.0

    def on_run_start(self, run: RunContext) -> None:
        self.rss.append((0, resident_bytes()))
        self.loop_started = time.perf_counter()

    def on_round_end(self, run: RunContext, row: dict[str, Any], client_rows: list[dict[str, Any]]) -> None:
        round = row["round"]
        if round % self.every == 0 or round == run.config.train.rounds:
            self.rss.append((round, resident_bytes()))
            elapsed = time.perf_counter() - self.loop_started
            print(
                f"round {round}/{run.config.train.rounds}  {elapsed:.0f} s  rss {self.rss[-1][1] / 2**20:.0f} MiB",
                file=sys.stderr,
                flush=True,
            )

    def on_run_end(self, run: RunContext) -> None:
        self.loop_seconds = time.perf_counter() - self.loop_started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--per-round", type=int, default=1000, help="clients per round")
    parser.add_argument("--registered", type=int, default=10_000, help="registered clients")
    parser.add_argument("--checkpoint-every", type=int, default=1000)
    parser.add_argument("--window", type=int, default=100, help="rounds per window of the write-time series")
    parser.add_argument("--rss-every", type=int, default=50, help="sample the driver's RSS every this many rounds")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as scratch:
        config = load_config(
            None, workload(args.rounds, args.per_round, args.registered, args.checkpoint_every) + [f"output.dir={scratch}"]
        )
        callbacks = default_callbacks(config, progress=False)
        metrics = next(c for c in callbacks if isinstance(c, MetricsParquet))
        timed = TimedCallback(metrics)
        probe = LoopProbe(args.rss_every)
        callbacks = [probe] + [timed if c is metrics else c for c in callbacks]
        started = time.perf_counter()
        summary = run_experiment(config, progress=False, callbacks=callbacks)
        run_seconds = time.perf_counter() - started
        metrics_bytes = (Path(summary.run_dir) / "metrics.parquet").stat().st_size
    ray.shutdown()

    write_seconds = timed.start_seconds + sum(timed.round_seconds) + timed.end_seconds
    windows = [float(np.sum(timed.round_seconds[i : i + args.window])) for i in range(0, len(timed.round_seconds), args.window)]
    rss_mib = [rss / 2**20 for _, rss in probe.rss]
    figures = {
        "rounds": args.rounds,
        "clients_per_round": args.per_round,
        "metric_rows": args.rounds * (1 + args.per_round),
        "run_s": run_seconds,
        "round_loop_s": probe.loop_seconds,
        "metrics_write_s": write_seconds,
        "metrics_compaction_s": timed.end_seconds,
        "metrics_share_of_round_loop": write_seconds / probe.loop_seconds,
        "metrics_share_of_run": write_seconds / run_seconds,
        "write_s_first_window": windows[0],
        "write_s_last_full_window": windows[-1] if len(timed.round_seconds) % args.window == 0 else windows[max(0, len(windows) - 2)],
        "driver_rss_mib_first": rss_mib[0],
        "driver_rss_mib_last": rss_mib[-1],
        "driver_rss_mib_max": max(rss_mib),
        "metrics_parquet_mib": metrics_bytes / 2**20,
    }
    figures["write_ratio_last_over_first_window"] = figures["write_s_last_full_window"] / figures["write_s_first_window"]
    figures["driver_rss_ratio_last_over_first"] = rss_mib[-1] / rss_mib[0]
    width = max(map(len, figures))
    for name, value in figures.items():
        print(f"{name:<{width}}  {value:.4f}" if isinstance(value, float) else f"{name:<{width}}  {value}")
    print(f"write seconds per {args.window}-round window: " + " ".join(f"{w:.2f}" for w in windows))
    print(f"driver RSS (MiB) every {args.rss_every} rounds: " + " ".join(f"{r:.0f}" for r in rss_mib))
    share = figures["metrics_share_of_round_loop"]
    print(f"target: metrics_share_of_round_loop < 0.05 -> {'met' if share < 0.05 else 'NOT met'}")
    if args.json:
        args.json.write_text(json.dumps({**figures, "write_s_windows": windows, "driver_rss_mib": rss_mib}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
