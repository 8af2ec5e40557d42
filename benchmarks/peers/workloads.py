"""The two workloads of benchmarks/peers, and what every peer process shares: its command line and
its figures, reported as benchmarks/w1_overhead.py's ``run_plain`` reports them.

- ``w1``: workload W1 (benchmarks/w1_overhead.py): digits, 1000 clients (Dirichlet α = 0.5), 100 per
  round, 20 rounds, ``cnn_small``, 1 local epoch, batch 16, SGD lr 0.05, scored after every round.
- ``pfl``: pfl-research's benchmark shape: CIFAR-shaped synthetic images (3×32×32, 10 classes),
  1000 users × 50 images (IID), cohort 50, batch 10, 1 local epoch, SGD lr 0.05, ``cnn_cifar``,
  10 rounds, scored after rounds 5 and 10 (benchmarks/gpu_check.py's W3 with 10 rounds).

This module is imported inside the peers' virtual environments too: it needs only torch, numpy and
fedray's data and model code (all reused from the system site-packages), never Ray.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

BENCHMARKS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BENCHMARKS))
from gpu_check import w3  # noqa: E402
from w1_overhead import W1, steady  # noqa: E402

WORKLOADS = {"w1": W1, "pfl": w3("cnn_cifar", quick=False) + ["train.rounds=10"]}


def peer_result(started: float, marks: list[float], final_accuracy: float, versions: dict[str, str]) -> dict:
    """A peer's figures; ``started`` = ``time.perf_counter()`` when its run was called (before the
    data's preparation), ``marks`` = the same clock at round 1's start and at the end of every round."""
    seconds = np.diff(marks).tolist()
    return {
        "end_to_end_s": time.perf_counter() - started,
        "steady_round_s": steady(seconds),
        "round_s": seconds,
        "final_accuracy": final_accuracy,
        "versions": versions,
    }


def peer_main(run: Callable[[list[str], int], dict], argv: list[str]) -> int:
    """A peer process: ``run(overrides, workers)`` on ``--workload``, its figures written to ``--out``."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", choices=WORKLOADS, required=True)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.out.write_text(json.dumps(run(WORKLOADS[args.workload], args.workers)))
    return 0
