"""Where a worker's round goes: cProfile of fedray's rounds on the local pool (one worker, in this
process, no Ray) beside the plain single-process loop of benchmarks/w1_overhead.py, on workload W3
(benchmarks/gpu_check.py) or W1.

    python benchmarks/profile_round.py --device cuda --model resnet8     # on a GPU
    python benchmarks/profile_round.py --workload w1                      # CPU, W1 (digits, cnn_small)
    python benchmarks/profile_round.py --model cnn_cifar --skip-plain --set train.vectorize=on --set train.clients_per_round=200

Prints the seconds per round of both sides (median over the profiled rounds, fedray's without the
profiler's overhead measured in a separate pass) and fedray's top functions by own time and by
cumulative time. On a GPU, time shows up where the host waits for the device (``.item()``,
``float(tensor)``, copies to the host), so a function high in own time there is a sync point.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check import w3  # noqa: E402
from w1_overhead import W1, run_plain  # noqa: E402

from fedray.testing import Federation  # noqa: E402


def fedray_rounds(overrides: list[str], rounds: int, profile: cProfile.Profile | None) -> list[float]:
    """Seconds of rounds 3..``rounds`` + 2 on the local pool (rounds 1-2 warm up), profiled if asked."""
    with tempfile.TemporaryDirectory() as run_dir:
        federation = Federation(run_dir, overrides, defaults=())
        federation.run(2)
        seconds = []
        for round in range(3, rounds + 3):
            started = time.perf_counter()
            if profile is not None:
                profile.enable()
            federation.run_round(round)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            if profile is not None:
                profile.disable()
            seconds.append(time.perf_counter() - started)
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=["w3", "w1"], default="w3")
    parser.add_argument("--model", default="resnet8", help="W3's model (resnet8, cnn_cifar, ...)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rounds", type=int, default=4, help="profiled rounds (after 2 warm-up rounds)")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override for fedray's side (repeatable)")
    parser.add_argument("--skip-plain", action="store_true", help="profile fedray's side only (no plain loop to compare)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # as the plain loop and a worker with cpus_per_worker=1
    base = w3(args.model, quick=False) if args.workload == "w3" else list(W1)
    rounds = [f"train.rounds={args.rounds + 3}", "eval.every=1000", "resources.num_workers=1", "resources.backend=local"]
    gpu = [f"resources.gpus_per_worker={1 if args.device == 'cuda' else 0}"]
    overrides = base + rounds + gpu + args.set
    timed = fedray_rounds(overrides, args.rounds, None)
    profile = cProfile.Profile()
    fedray_rounds(overrides, args.rounds, profile)
    fedray_s = float(np.median(timed))
    label = f"{args.workload} {args.model if args.workload == 'w3' else ''} {' '.join(args.set)} on {args.device}"
    if args.skip_plain:
        print(f"{label}: s/round fedray local {fedray_s:.3f}")
    else:
        plain = run_plain(base + rounds[:2], args.device)
        plain_s = float(np.median(plain["round_s"][2:-1]))
        print(f"{label}: s/round plain {plain_s:.3f}, fedray local {fedray_s:.3f} ({plain_s / fedray_s:.2f}x)")
    stats = pstats.Stats(profile).strip_dirs()
    stats.sort_stats("tottime").print_stats(args.top)
    stats.sort_stats("cumulative").print_stats(args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
