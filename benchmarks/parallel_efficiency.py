"""Parallel efficiency: 2 worker actors against 1 on one machine, and where a round's time goes.

Workload (issue 18): Fashion-MNIST (60,000 train / 10,000 test images, 28×28), 100 clients (IID: 600
samples each; ``--partition dirichlet``: α = 0.5, 600 on average), 10 per round, FedAvg, ``cnn_small``,
2 local epochs, batch 32, SGD lr 0.05, the global model evaluated on the 10,000 test images every
round (``--eval-every 5``: the protocol of benchmarks/real_table.py). ``--dataset digits`` runs W1 of
benchmarks/w1_overhead.py instead (1000 tiny clients, 100 per round); ``--dataset pfl`` pfl-research's
benchmark shape (W3 of benchmarks/gpu_check.py with ``cnn_cifar``, on CPU workers: CIFAR-shaped
images, 1000 users × 50, cohort 50, batch 10, 1 local epoch).

The same config runs with ``resources.num_workers=1`` and ``=2`` (``cpus_per_worker=1``) in one
invocation, on one local Ray (``resources.backend=ray``, also for the one worker). Steady state = median seconds per round at the driver over rounds
3..N-1 (warm-up and the final checkpoint round left out); with ``--eval-every 5`` compare the mean
over those rounds instead (``--rounds 13``: ten rounds, two of them evaluated). Target: speed-up ≥ 1.8.

The breakdown comes from Ray's task timeline of the same runs (median over the steady rounds):
training (the slowest worker's ``run_clients``) and the gap to the fastest (balance), evaluation (the
slowest shard), the worker's argument/result transfer (the broadcast in, the partial out), the
server's own serial work (cohort, scheduling, merge, aggregation, broadcast put), the driver's
callbacks; and, from /proc, each worker's user/system CPU seconds and page faults.

    python benchmarks/parallel_efficiency.py                              # fmnist, IID, eval every round
    python benchmarks/parallel_efficiency.py --partition dirichlet --eval-every 5
    python benchmarks/parallel_efficiency.py --dataset digits             # W1
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
from gpu_check import w3
from w1_overhead import W1, RoundClock, steady

TARGET = 1.8
TIMELINE_FLUSH_S = 3.0
FMNIST = [
    "data.name=fmnist",
    "data.num_clients=100",
    "train.clients_per_round=10",
    "train.local_epochs=2",
    "train.batch_size=32",
    "train.lr=0.05",
    "model.name=cnn_small",
    "algorithm.name=fedavg",
    "checkpoint.every=1000",  # one checkpoint, after the last round (left out of the steady state)
    "output.tensorboard=false",
    "output.plots=false",
]
PARTITIONS = {"iid": ["data.partition=iid"], "dirichlet": ["data.partition=dirichlet", "data.alpha=0.5"]}


class WorkerClock(RoundClock):
    """Round times at the driver, the server's own ``seconds`` per round, and each worker process's
    CPU use and thread settings at the end of the run (from /proc; Linux)."""

    def __init__(self) -> None:
        super().__init__()
        self.server_seconds: list[float] = []
        self.workers: list[dict[str, Any]] = []

    def on_round_end(self, run, row, client_rows) -> None:
        super().on_round_end(run, row, client_rows)
        self.server_seconds.append(row["seconds"])

    def on_run_end(self, run) -> None:
        # Actors send their timeline events to Ray every second; the run kills them when it ends.
        time.sleep(TIMELINE_FLUSH_S)
        if not Path("/proc/self/stat").exists():
            return
        for worker in run.server.worker_handles():
            self.workers.append(process_stats(ray.get(worker.pid.remote())))


def process_stats(pid: int) -> dict[str, Any]:
    """CPU seconds (user, system), minor page faults, threads and OMP_NUM_THREADS of a process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    environ = dict(entry.split("=", 1) for entry in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in entry)
    threads = next(line.split()[1] for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("Threads:"))
    return {
        "user_s": int(fields[11]) / tick,
        "system_s": int(fields[12]) / tick,
        "minor_faults": int(fields[7]),
        "threads": int(threads),
        "OMP_NUM_THREADS": environ.get("OMP_NUM_THREADS", "unset"),
    }


def breakdown(events: list[dict[str, Any]], rounds: slice) -> dict[str, float]:
    """Median seconds per phase over ``rounds`` of the one run whose server's ``run_round`` events
    are in ``events`` (Ray's timeline: ``ts``/``dur`` in µs, ``tid`` = worker process)."""

    def spans(category: str) -> list[dict[str, Any]]:
        return sorted((e for e in events if e["cat"] == category), key=lambda e: e["ts"])

    phases: dict[str, list[float]] = {}
    worker_tids = {e["tid"] for e in events if e["cat"].startswith("task::ClientWorker.")}
    for round_event in spans("task::Server.run_round")[rounds]:
        start, end = round_event["ts"], round_event["ts"] + round_event["dur"]
        inside = [e for e in events if start <= e["ts"] < end and e["tid"] in worker_tids]

        def per_worker(category: str) -> dict[str, float]:
            seconds: dict[str, float] = {}
            for e in inside:
                if e["cat"] == category:
                    seconds[e["tid"]] = seconds.get(e["tid"], 0.0) + e["dur"] / 1e6
            return seconds

        train, evaluate = per_worker("task::ClientWorker.run_clients"), per_worker("task::ClientWorker.evaluate_global")
        moved = per_worker("task:deserialize_arguments")
        stored = per_worker("task:store_outputs")
        train_phase = [e for e in inside if e["cat"] == "task::ClientWorker.run_clients"]
        eval_phase = [e for e in inside if e["cat"] == "task::ClientWorker.evaluate_global"]
        phase_span = sum(
            (max(e["ts"] + e["dur"] for e in phase) - min(e["ts"] for e in phase)) / 1e6 for phase in (train_phase, eval_phase) if phase
        )
        values = {
            "server_round_s": round_event["dur"] / 1e6,
            "train_slowest_worker_s": max(train.values()),
            "train_balance_gap_s": max(train.values()) - min(train.values()) if len(train) > 1 else 0.0,
            "eval_slowest_worker_s": max(evaluate.values(), default=0.0),
            "transfer_in_out_max_worker_s": max((moved.get(t, 0.0) + stored.get(t, 0.0) for t in worker_tids), default=0.0),
            "server_serial_s": round_event["dur"] / 1e6 - phase_span,
        }
        for name, value in values.items():
            phases.setdefault(name, []).append(value)
    return {name: float(np.median(values)) for name, values in phases.items()}


def run(overrides: list[str], workers: int, cpus_per_worker: int, out_dir: str) -> dict[str, Any]:
    resources = ["resources.backend=ray", f"resources.num_workers={workers}", f"resources.cpus_per_worker={cpus_per_worker}"]
    config = load_config(None, overrides + resources + [f"output.dir={out_dir}"])
    clock = WorkerClock()
    started_us = time.time() * 1e6  # Ray's timeline stamps events in µs since the epoch
    summary = run_experiment(config, progress=False, extra_callbacks=[clock])
    skip = slice(2, -1)
    events = [e for e in ray.timeline() if e.get("ts", 0) >= started_us and "cat" in e]
    figures = {
        "steady_round_s": steady(clock.seconds),
        "mean_round_s": float(np.mean(clock.seconds[skip])),  # evaluation amortised, for --eval-every > 1
        "driver_callbacks_s": float(np.median(np.subtract(clock.seconds, clock.server_seconds)[skip])),
        **breakdown(events, skip),
    }
    return {
        "figures": figures,
        "round_s": clock.seconds,
        "workers": clock.workers,
        "final_metrics": {k: summary.final_metrics.get(k) for k in ("test_accuracy", "test_loss", "train_loss")},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", choices=["fmnist", "digits", "pfl"], default="fmnist")
    parser.add_argument("--partition", choices=sorted(PARTITIONS), default="iid", help="fmnist only")
    parser.add_argument("--eval-every", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=8, help="per run; rounds 3..N-1 are the steady state")
    parser.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE", help="more overrides")
    parser.add_argument("--threads", action="store_true", help="also run 1 worker with 2 CPUs (2 torch threads)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)
    if args.rounds < 4:
        parser.error("--rounds must be at least 4 (two warm-up rounds, the checkpoint round, one measured)")

    base = {"digits": W1, "pfl": w3("cnn_cifar", quick=False)}.get(args.dataset) or FMNIST + PARTITIONS[args.partition]
    overrides = base + [f"train.rounds={args.rounds}", f"eval.every={args.eval_every}"] + args.extra
    shapes = [(1, 1), (2, 1)] + ([(1, 2)] if args.threads else [])  # (workers, CPUs per worker)
    with tempfile.TemporaryDirectory() as scratch:
        runs = {f"{w}x{c}": run(overrides, w, c, scratch) for w, c in shapes}
    ray.shutdown()

    measure = "steady_round_s" if args.eval_every == 1 else "mean_round_s"
    speed_up = runs["1x1"]["figures"][measure] / runs["2x1"]["figures"][measure]
    names = list(runs["1x1"]["figures"])
    width = max(map(len, names))
    print(
        f"{args.dataset} {args.partition if args.dataset == 'fmnist' else ''}, eval every {args.eval_every}, {args.rounds} rounds per run"
    )
    print(f"{'seconds per round (median)':<{width}}" + "".join(f"  {w} worker(s) x {c} CPU" for w, c in shapes))
    for name in names:
        print(f"{name:<{width}}" + "".join(f"  {runs[label]['figures'][name]:16.3f}" for label in runs))
    for label, result in runs.items():
        for index, stats in enumerate(result["workers"]):
            print(
                f"{label} worker {index}: user {stats['user_s']:.1f} s, system {stats['system_s']:.1f} s, "
                f"{stats['minor_faults']} minor faults, {stats['threads']} threads, OMP_NUM_THREADS={stats['OMP_NUM_THREADS']}"
            )
    for label, result in runs.items():
        print(f"final metrics {label}: {result['final_metrics']}")
    if args.threads:
        print(f"1 worker x 2 CPUs over 2 workers x 1 CPU: {runs['1x2']['figures'][measure] / runs['2x1']['figures'][measure]:.2f}")
    print(f"speed-up 2 workers over 1 ({measure}): {speed_up:.2f} (target >= {TARGET} -> {'met' if speed_up >= TARGET else 'NOT met'})")
    if args.json:
        args.json.write_text(json.dumps({"speed_up": speed_up, "args": {**vars(args), "json": str(args.json)}, "runs": runs}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
