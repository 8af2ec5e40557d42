"""Scale in registered clients: the same per-round work (``--per-round`` clients of 2 samples each)
with ``--registered`` clients (default 1,000,000) against ``--baseline`` registered (default 10,000),
in one invocation.

Workload: ``synthetic`` 1×8×8 data, 10 classes, 2 samples per registered client (IID), ``cnn_small``,
1 local epoch, global evaluation on 500 test images every round, ``--rounds`` rounds, the default
checkpoint cadence (every 5 rounds; a checkpoint holds one int64 per registered client), 2 worker
actors of 1 CPU. Measured for each side:

- seconds per round: the median of rounds 2..R at the driver (callbacks included), and the mean;
- start-up: from ``run_experiment`` to the first round (data generation and partition, checks,
  the dataset put into the object store, the server and workers started);
- peak RSS of the driver, and of the server and worker actors (their ``VmHWM``; pages of the
  object store they read count in it, so the dataset appears in each).

Targets: seconds per round ≤ 1.2× the baseline's; driver peak RSS < 2 GB.

    python benchmarks/scale.py                        # 1,000,000 vs 10,000 registered, 1,000 per round
    python benchmarks/scale.py --registered 100000 --baseline 100 --per-round 10 --rounds 30
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

sys.path.insert(0, str(Path(__file__).parent))
from w1_overhead import RoundClock  # noqa: E402

from fedray import load_config  # noqa: E402
from fedray.runtime import run_experiment  # noqa: E402
from fedray.tracking import Callback, RunContext  # noqa: E402


def workload(registered: int, per_round: int, rounds: int) -> list[str]:
    """Synthetic 1×8×8 clients of 2 samples each, ``cnn_small``, evaluated every round; the other
    benchmarks of registered-client scale (client_state_scale.py, long_run.py) append their changes."""
    return [
        "data.name=synthetic",
        f"data.synthetic.num_train={2 * registered}",
        "data.synthetic.num_test=500",
        f"data.num_clients={registered}",
        "data.partition=iid",
        "model.name=cnn_small",
        f"train.clients_per_round={per_round}",
        f"train.rounds={rounds}",
        "train.local_epochs=1",
        "eval.every=1",
        "resources.num_workers=2",
        "resources.cpus_per_worker=1",
        "output.tensorboard=false",
        "output.plots=false",
    ]


def peak_rss(pid: int | str = "self") -> int:
    """Peak resident set size (``VmHWM``) of a process, in bytes (Linux)."""
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def reset_peak_rss() -> None:
    """Start this process's ``VmHWM`` again from its current RSS (Linux ``clear_refs``)."""
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (a local Ray's GCS, raylet and worker processes are below the driver)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(parent, []).append(int(entry))
    found, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


class ActorMemory(Callback):
    """Peak RSS of the run's server and worker actors, read at the end of the run (before they are killed)."""

    def __init__(self) -> None:
        self.peaks: dict[str, int] = {}

    def on_run_end(self, run: RunContext) -> None:
        workers = ray.get([worker.pid.remote() for worker in run.server.worker_handles()])
        for index, pid in enumerate(workers):
            self.peaks[f"worker_{index}"] = peak_rss(pid)
        for pid in descendants(os.getpid()):
            try:
                with open(f"/proc/{pid}/cmdline") as cmdline:
                    if cmdline.read().startswith("ray::Server"):
                        self.peaks["server"] = peak_rss(pid)
            except OSError:  # ended meanwhile
                continue


class FirstRound(Callback):
    """The time the first round starts (after every callback's ``on_run_start``)."""

    def __init__(self) -> None:
        self.at = 0.0

    def on_run_start(self, run: RunContext) -> None:
        self.at = time.perf_counter()


def measure(registered: int, per_round: int, rounds: int, out_dir: str) -> dict[str, Any]:
    config = load_config(None, workload(registered, per_round, rounds) + [f"output.dir={out_dir}"])
    clock, first, actors = RoundClock(), FirstRound(), ActorMemory()
    reset_peak_rss()
    started = time.perf_counter()
    summary = run_experiment(config, progress=False, extra_callbacks=[first, clock, actors])
    return {
        "registered": registered,
        "round_s": float(np.median(clock.seconds[1:])),
        "round_s_mean": float(np.mean(clock.seconds[1:])),
        "startup_s": first.at - started - summary.ray_startup_seconds,
        "ray_startup_s": summary.ray_startup_seconds,
        "driver_peak_rss_gb": peak_rss() / 1e9,
        **{f"{name}_peak_rss_gb": value / 1e9 for name, value in sorted(actors.peaks.items())},
        "round_seconds": clock.seconds,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--registered", type=int, default=1_000_000)
    parser.add_argument("--baseline", type=int, default=10_000, help="registered clients of the baseline")
    parser.add_argument("--per-round", type=int, default=1000, help="clients per round")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as scratch:
        ray.init(address="local", include_dashboard=False)  # once for both sides, outside their start-up
        baseline = measure(args.baseline, args.per_round, args.rounds, scratch)
        large = measure(args.registered, args.per_round, args.rounds, scratch)
    ray.shutdown()

    print(f"{'figure':<24}{args.baseline:>14,}{args.registered:>14,}")
    for key in [k for k in large if k not in ("registered", "round_seconds")]:
        print(f"{key:<24}{baseline.get(key, float('nan')):>14.3f}{large[key]:>14.3f}")
    ratio = large["round_s"] / baseline["round_s"]
    print(f"ratio round_s {args.registered:,} / {args.baseline:,} registered: {ratio:.3f}")
    print(f"target: ratio <= 1.2 -> {'met' if ratio <= 1.2 else 'NOT met'}")
    print(f"target: driver_peak_rss_gb < 2 -> {'met' if large['driver_peak_rss_gb'] < 2 else 'NOT met'}")
    if args.json:
        args.json.write_text(json.dumps({"baseline": baseline, "large": large, "ratio_round_s": ratio}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
