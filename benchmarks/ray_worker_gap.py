"""Why one worker on Ray trains more slowly than one worker without it (issue 46, the GPU check's
"1 worker × 1 GPU on Ray: 0.76–0.85× the plain loop", where the local pool's one worker is 1.07–1.10×).

Four sides of workload W3 (benchmarks/gpu_check.py) in one invocation, alternated ``--repeats`` times
so that a drift of the machine's speed shows as a spread rather than as a side's cost:

- the plain single-process loop (benchmarks/w1_overhead.py's ``run_plain``) in this process;
- the same plain loop in a Ray task (``num_cpus=1``, ``num_gpus=1`` on a GPU): Ray's worker process
  without fedray, to separate the process Ray gives a worker from fedray's actor path;
- fedray's local pool, one worker in this process (``resources.backend=local``);
- fedray on Ray, one worker actor (``resources.backend=ray``), with Ray's task timeline breakdown of
  its rounds (benchmarks/parallel_efficiency.py: the worker's own ``run_clients`` time, argument and
  result transfer, the server's serial work);
- the same with ``RAY_worker_niceness=0``: Ray starts its worker processes at niceness 15 (its
  ``worker_niceness`` setting), so that they yield to any busier process, its own daemons included.

Each side's figure is the median seconds per steady round (rounds 3 to the last but one). Also
printed: what a Ray worker process has that this one has not (environment variables, threads, CPU
affinity, ``gc`` and trace hooks), as the worker reports it.

    python benchmarks/ray_worker_gap.py --device cuda --model resnet8
    python benchmarks/ray_worker_gap.py --device cpu --model cnn_cifar --quick     # a CPU dry run
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch

BENCHMARKS = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHMARKS))
from gpu_check import w3  # noqa: E402
from parallel_efficiency import breakdown  # noqa: E402
from w1_overhead import run_fedray, run_plain, steady  # noqa: E402


def process_facts() -> dict[str, Any]:
    """What differs between a driver and a Ray worker process and could slow a training loop."""
    return {
        "pid": os.getpid(),
        "torch_threads": torch.get_num_threads(),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "nice": os.nice(0),
        "python_threads": threading.active_count(),
        "gc_enabled": gc.isenabled(),
        "gc_thresholds": gc.get_threshold(),
        "trace_hook": sys.gettrace() is not None,
        "profile_hook": sys.getprofile() is not None,
        "switch_interval": sys.getswitchinterval(),
        "env": {k: v for k, v in os.environ.items() if k.startswith(("OMP", "MKL", "CUDA", "LD_PRELOAD", "PYTHON", "TORCH"))},
    }


@ray.remote
def plain_in_ray(overrides: list[str], device: str, benchmarks: str, niceness: int | None = None) -> dict[str, Any]:
    """The plain loop in a Ray worker process, at Ray's niceness or at ``niceness`` (lowering it
    needs root)."""
    if niceness is not None:
        os.setpriority(os.PRIO_PROCESS, 0, niceness)
    sys.path.insert(0, benchmarks)
    from w1_overhead import run_plain as plain

    return {**plain(overrides, device), "process": process_facts()}


def fedray_on_ray(overrides: list[str], scratch: str) -> dict[str, Any]:
    since = time.time() * 1e6
    result = run_fedray(overrides + ["resources.backend=ray"], scratch)
    time.sleep(3.0)  # actors flush their timeline events every second
    events = [e for e in ray.timeline() if e.get("ts", 0) >= since and "cat" in e]
    result["breakdown"] = breakdown(events, slice(2, -1))
    return result


def plain_only(args: argparse.Namespace) -> int:
    """The plain loop in this process and in a Ray task at Ray's niceness and at 0, alternated; each
    line printed as it is measured."""
    gpu = 1 if args.device == "cuda" else 0
    overrides = w3(args.model, args.quick) + [f"train.rounds={args.rounds}", "eval.every=1000"]
    ray.init(include_dashboard=False)
    for repeat in range(args.repeats):
        for niceness in (None, 0):
            task = plain_in_ray.options(num_cpus=1, num_gpus=gpu).remote(overrides, args.device, str(BENCHMARKS), niceness)
            remote = ray.get(task)
            print(
                f"repeat {repeat}: plain in a Ray task at nice {remote['process']['nice']}: {steady(remote['round_s']):.3f} s/round",
                flush=True,
            )
        print(f"repeat {repeat}: plain in this process: {steady(run_plain(overrides, args.device)['round_s']):.3f} s/round", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--model", default="resnet8")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="W3's quick size (100 clients, 10 a round)")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--plain-only", action="store_true", help="only the plain loop: here, in a Ray task, in a Ray task at niceness 0")
    args = parser.parse_args(argv)
    if args.plain_only:
        return plain_only(args)

    gpu = 1 if args.device == "cuda" else 0
    overrides = w3(args.model, args.quick) + [f"train.rounds={args.rounds}", "eval.every=1000"]
    fedray_overrides = overrides + ["resources.num_workers=1", "resources.cpus_per_worker=1", f"resources.gpus_per_worker={gpu}"]
    sides: dict[str, list[float]] = {
        "plain, this process": [],
        "plain, in a Ray task": [],
        "fedray, local pool": [],
        "fedray, Ray": [],
        "fedray, Ray, nice 0": [],
    }
    breakdowns, accuracies, facts = [], {}, {"driver": process_facts()}
    with tempfile.TemporaryDirectory() as scratch:
        for _ in range(args.repeats):
            result = fedray_on_ray(fedray_overrides, scratch)  # leaves Ray up, sized with the GPU
            sides["fedray, Ray"].append(result["steady_round_s"])
            breakdowns.append(result["breakdown"])
            accuracies["fedray, Ray"] = result["final_accuracy"]
            remote = ray.get(plain_in_ray.options(num_cpus=1, num_gpus=gpu).remote(overrides, args.device, str(BENCHMARKS)))
            facts["ray task"] = remote.pop("process")
            sides["plain, in a Ray task"].append(steady(remote["round_s"]))
            ray.shutdown()
            os.environ["RAY_worker_niceness"] = "0"  # read by the Ray that the next run starts
            result = fedray_on_ray(fedray_overrides, scratch)
            sides["fedray, Ray, nice 0"].append(result["steady_round_s"])
            ray.shutdown()
            del os.environ["RAY_worker_niceness"]
            result = run_fedray(fedray_overrides + ["resources.backend=local"], scratch)
            sides["fedray, local pool"].append(result["steady_round_s"])
            accuracies["fedray, local pool"] = result["final_accuracy"]
            plain = run_plain(overrides, args.device)
            sides["plain, this process"].append(steady(plain["round_s"]))
            accuracies["plain, this process"] = plain["final_accuracy"]

    plain_s = float(np.median(sides["plain, this process"]))
    print(f"W3 {args.model} on {args.device}, {args.repeats} alternations; s/round per repeat, and the median's ratio to the plain loop")
    for side, seconds in sides.items():
        print(f"  {side:<24} {' '.join(f'{s:.3f}' for s in seconds)}   {plain_s / float(np.median(seconds)):.2f}x")
    print("fedray on Ray, where a round goes (median s, per repeat):")
    for name in breakdowns[0]:
        print(f"  {name:<30} {' '.join(f'{b[name]:.3f}' for b in breakdowns)}")
    print(f"final accuracies: {accuracies}")
    for where, fact in facts.items():
        print(f"{where}: {json.dumps(fact)}")
    if args.json:
        args.json.write_text(
            json.dumps({"args": {**vars(args), "json": str(args.json)}, "sides": sides, "breakdowns": breakdowns, "facts": facts}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
