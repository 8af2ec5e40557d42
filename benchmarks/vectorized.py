"""Vectorised local training (``train.vectorize``) against the loop, side by side in one invocation:
client updates per second of one fedray worker (the local backend, one worker in this process, one
torch thread: ``resources.cpus_per_worker=1``) training the same rounds both ways.

Workloads (``--workloads``):

- ``w1_like``: W1's shape with W1's tiny clients made even, so that every client does the issue's
  5 steps of batch 10: synthetic digits-shaped images (1×8×8, 10 classes), 1,000 clients × 50
  samples (IID), 100 clients per round, 1 local epoch, batch 10, SGD lr 0.05, FedAvg;
- ``w1``: W1 itself (benchmarks/w1_overhead.py: digits, 1,000 clients, Dirichlet α = 0.5, 100 per
  round, batch 16): ragged clients of 1 to a few samples, mostly one (partial) batch each.

Each workload runs with ``cnn_small`` and with ``mlp`` (``--models``), the loop
(``train.vectorize=off``) and the vectorised path (``on``, ``resources.vectorize_group`` unset: the
automatic size) alternating ``--repeats`` times. A side's figure is the median over its repeats of
the median seconds per round over the steady rounds (rounds 3 to the last but one:
w1_overhead's ``steady``; the first rounds pay torch's and ``torch.func``'s one-time warm-up, the last
evaluates and checkpoints); updates/s = clients per round / that. The global model is evaluated only
after the last round, so that the rounds measured are client training. Both wall-clock seconds and
this process's CPU seconds per round are measured: on a machine shared with other jobs the wall
clock measures the contention too, while the CPU seconds (one torch thread, the worker in this
process) are what a round cost.

    python benchmarks/vectorized.py                      # ~2-3 minutes on 2 CPU cores
    python benchmarks/vectorized.py --json docs/results/raw/vectorized_cpu.json

The raw JSON records the commit, torch's version, the machine (platform, processor, CPU count) and the
date with every round's seconds. Target (issue "A cohort as one computation"): ≥ 2× the loop's client
updates per second on CPU for W1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
# machine() lives in raw_output.py, which w1_overhead.py (imported below) can import too; the benchmarks
# that take it from this module get it from there.
from raw_output import machine  # noqa: E402
from w1_overhead import W1, RoundClock, steady  # noqa: E402

from fedray import load_config  # noqa: E402

DEFAULT_JSON = REPO / "docs" / "results" / "raw" / "vectorized_cpu.json"
MODELS = ("cnn_small", "mlp")
TARGET = 2.0
COMMON = [
    "resources.backend=local",
    "resources.num_workers=1",
    "resources.cpus_per_worker=1",
    "checkpoint.every=1000",
    "output.tensorboard=false",
    "output.plots=false",
]


def w1_like(rounds: int, clients: int = 1000, per_round: int = 100, samples: int = 50) -> list[str]:
    return [
        "data.name=synthetic",
        "data.synthetic.channels=1",
        "data.synthetic.image_size=8",
        "data.synthetic.num_classes=10",
        f"data.synthetic.num_train={clients * samples}",
        "data.synthetic.num_test=1000",
        f"data.num_clients={clients}",
        "data.partition=iid",
        "algorithm.name=fedavg",
        f"train.rounds={rounds}",
        f"train.clients_per_round={per_round}",
        "train.local_epochs=1",
        "train.batch_size=10",
        "train.lr=0.05",
        f"eval.every={rounds}",
    ]


def w1(rounds: int) -> list[str]:
    keep = [item for item in W1 if not item.startswith(("train.rounds=", "eval.every=", "model.name="))]
    return keep + [f"train.rounds={rounds}", f"eval.every={rounds}"]


WORKLOADS = {"w1_like": w1_like, "w1": w1}


class CPUClock(RoundClock):
    """:class:`RoundClock`'s wall seconds per round, and this process's CPU seconds per round (the
    local backend trains in this process): what the round cost, whatever other jobs on the machine
    took from it."""

    def __init__(self) -> None:
        super().__init__()
        self.cpu_seconds: list[float] = []
        self._last_cpu = 0.0

    def on_run_start(self, run) -> None:
        super().on_run_start(run)
        self._last_cpu = time.process_time()

    def on_round_end(self, run, row, client_rows) -> None:
        super().on_round_end(run, row, client_rows)
        now = time.process_time()
        self.cpu_seconds.append(now - self._last_cpu)
        self._last_cpu = now


def run_timed(overrides: list[str], out_dir: str) -> dict:
    """w1_overhead's ``run_fedray`` on the local backend, with CPU seconds per round too."""
    from fedray.runtime import run_experiment

    config = load_config(None, overrides + [f"output.dir={out_dir}"])
    clock = CPUClock()
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    summary = run_experiment(config, progress=False, extra_callbacks=[clock])
    return {
        "peak_gpu_allocated_mib": torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None,
        "end_to_end_s": time.perf_counter() - started,
        "steady_round_s": steady(clock.seconds),
        "steady_round_cpu_s": steady(clock.cpu_seconds),
        "round_s": clock.seconds,
        "round_cpu_s": clock.cpu_seconds,
        "round_ends": clock.ends,
        "final_accuracy": summary.final_test_accuracy,
    }


def per_round(overrides: list[str]) -> int:
    return int(next(item.split("=", 1)[1] for item in overrides if item.startswith("train.clients_per_round=")))


def compare(overrides: list[str], repeats: int, scratch: str, label: str = "") -> dict:
    """The loop and the vectorised path on ``overrides`` (alternating ``repeats`` times): each side's
    median steady seconds per round, updates/s, and the ratio."""
    runs: dict[str, list[dict]] = {"loop": [], "vectorized": []}
    for _ in range(repeats):
        for side, value in (("loop", "off"), ("vectorized", "on")):
            result = run_timed(overrides + [f"train.vectorize={value}"], scratch)
            runs[side].append(result)
            print(
                f"{label} {side}: {result['steady_round_s']:.3f} s/round, {result['steady_round_cpu_s']:.3f} CPU s/round, "
                f"final accuracy {result['final_accuracy']:.4f}",
                flush=True,
            )
    clients = per_round(overrides)
    sides = {}
    for side, results in runs.items():
        wall = float(np.median([result["steady_round_s"] for result in results]))
        cpu = float(np.median([result["steady_round_cpu_s"] for result in results]))
        sides[side] = {
            "steady_round_s": wall,
            "updates_per_s": clients / wall,
            "steady_round_cpu_s": cpu,
            "updates_per_cpu_s": clients / cpu,
            "final_accuracy": [result["final_accuracy"] for result in results],
            "round_s": [result["round_s"] for result in results],
            "round_cpu_s": [result["round_cpu_s"] for result in results],
            "round_ends": [result["round_ends"] for result in results],
            "peak_gpu_allocated_mib": [result["peak_gpu_allocated_mib"] for result in results],
            "end_to_end_s": [result["end_to_end_s"] for result in results],
        }
    return {
        "overrides": overrides,
        "clients_per_round": clients,
        **sides,
        "ratio": sides["vectorized"]["updates_per_s"] / sides["loop"]["updates_per_s"],
        "ratio_cpu": sides["vectorized"]["updates_per_cpu_s"] / sides["loop"]["updates_per_cpu_s"],
    }


def table(report: dict) -> str:
    lines = [
        "| workload | model | loop updates/s (wall) | vectorised updates/s (wall) | ratio (wall) | loop updates/CPU-s | "
        "vectorised updates/CPU-s | ratio (CPU) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, row in report["results"].items():
        workload, model = key.split("/")
        loop, vectorized = row["loop"], row["vectorized"]
        lines.append(
            f"| {workload} | {model} | {loop['updates_per_s']:.0f} | {vectorized['updates_per_s']:.0f} | {row['ratio']:.2f}× | "
            f"{loop['updates_per_cpu_s']:.0f} | {vectorized['updates_per_cpu_s']:.0f} | {row['ratio_cpu']:.2f}× |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help=f"raw results (default {DEFAULT_JSON.relative_to(REPO)})")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated of {', '.join(WORKLOADS)}")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated (default {','.join(MODELS)})")
    parser.add_argument("--rounds", type=int, default=8, help="rounds per run (steady: 3 to the last but one)")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each side, alternating")
    args = parser.parse_args(argv)
    report: dict = {**machine(), "rounds": args.rounds, "repeats": args.repeats, "target_ratio": TARGET, "results": {}}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        for workload in [name.strip() for name in args.workloads.split(",") if name.strip()]:
            for model in [name.strip() for name in args.models.split(",") if name.strip()]:
                overrides = WORKLOADS[workload](args.rounds) + [f"model.name={model}"] + COMMON
                report["results"][f"{workload}/{model}"] = compare(overrides, args.repeats, scratch, f"{workload}/{model}")
    report["seconds"] = time.perf_counter() - started
    report["load_average_at_end"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    print(table(report))
    for key, row in report["results"].items():
        print(
            f"target {key}: vectorised / loop updates/s = {row['ratio']:.2f} (≥ {TARGET:g}: {'met' if row['ratio'] >= TARGET else 'not met'})"
        )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{report['seconds']:.0f} s; raw results in {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
