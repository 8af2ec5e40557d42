"""Workload W3 on a GPU: fedray's fractional-GPU workers against a plain single-process loop on the
same GPU (issue 18, item 6).

W3: synthetic CIFAR-shaped data (3×32×32, 10 classes), 1,000 clients × 50 images (IID), 50 clients
per round, ResNet-8 or ResNet-18, 1 local epoch, batch 10, SGD lr 0.05, evaluation every 5 rounds.
fedray runs it with ``resources.gpus_per_worker`` 1, 0.5 and 0.25 (1, 2 and 4 workers sharing the
one GPU, 1 CPU each); the plain loop (benchmarks/w1_overhead.py's ``run_plain``, on the GPU) runs it
in this process. For each: client updates per second (clients per round / median steady seconds per
round, rounds 3 to the last but one) and the GPU's busy % over those rounds (``nvidia-smi`` sampled
every 100 ms), and fedray's updates per second over the plain loop's.

    python benchmarks/gpu_w3.py --model resnet8          # and --model resnet18; --json FILE saves it
    python benchmarks/gpu_w3.py --device cpu --quick     # checks the script where there is no GPU

On a machine without a GPU, ``--device cpu`` runs the same sides on CPU workers (no GPU fraction,
no busy %); ``--quick`` shrinks the workload (100 clients, 10 per round, 5 rounds).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from w1_overhead import run_fedray, run_plain  # noqa: E402

GPU_FRACTIONS = (1.0, 0.5, 0.25)


def w3_size(quick: bool) -> tuple[int, int, int]:
    """(clients, clients per round, rounds)."""
    return (100, 10, 5) if quick else (1000, 50, 12)


def w3(model: str, quick: bool) -> list[str]:
    clients, per_round, rounds = w3_size(quick)
    return [
        "data.name=synthetic",
        "data.synthetic.channels=3",
        "data.synthetic.image_size=32",
        "data.synthetic.num_classes=10",
        f"data.synthetic.num_train={clients * 50}",
        "data.synthetic.num_test=2000",
        f"data.num_clients={clients}",
        "data.partition=iid",
        f"model.name={model}",
        "algorithm.name=fedavg",
        f"train.rounds={rounds}",
        f"train.clients_per_round={per_round}",
        "train.local_epochs=1",
        "train.batch_size=10",
        "train.lr=0.05",
        "eval.every=5",
        "checkpoint.every=1000",
        "output.tensorboard=false",
        "output.plots=false",
    ]


class GPUBusy(threading.Thread):
    """The GPU's utilisation (%), sampled every 100 ms by ``nvidia-smi``, with the time of each sample."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[tuple[float, float]] = []  # (time.perf_counter(), busy %)
        self.process = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms", "100"],
            stdout=subprocess.PIPE,
            text=True,
        )

    def run(self) -> None:
        for line in self.process.stdout:
            if line.strip().isdigit():
                self.samples.append((time.perf_counter(), float(line)))

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait()

    def busy_between(self, start: float, end: float) -> float | None:
        inside = [busy for at, busy in self.samples if start <= at <= end]
        return float(np.mean(inside)) if inside else None


def steady_window(round_ends: list[float]) -> tuple[float, float]:
    """From the end of round 2 to the end of the last round but one (as ``steady`` in w1_overhead)."""
    return round_ends[1], round_ends[-2]


def measure(side: str, run, per_round: int, gpu: GPUBusy | None) -> dict:
    result = run()
    start, end = steady_window(result["round_ends"])
    return {
        "side": side,
        "steady_round_s": result["steady_round_s"],
        "updates_per_s": per_round / result["steady_round_s"],
        "gpu_busy_percent": gpu.busy_between(start, end) if gpu is not None else None,
        "final_accuracy": result["final_accuracy"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["resnet8", "resnet18"], default="resnet8")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--quick", action="store_true", help="a small W3 (100 clients, 10 per round, 5 rounds)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)
    import ray
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device here; use --device cpu to check the script")
    gpu = GPUBusy() if args.device == "cuda" and shutil.which("nvidia-smi") else None
    if gpu is not None:
        gpu.start()
    overrides = w3(args.model, args.quick)
    _, per_round, _ = w3_size(args.quick)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for fraction in GPU_FRACTIONS:
            workers = round(1 / fraction)
            resources = [f"resources.num_workers={workers}", "resources.cpus_per_worker=1"]
            resources.append(f"resources.gpus_per_worker={fraction if args.device == 'cuda' else 0}")
            label = f"fedray, {workers} worker(s) × {fraction:g} GPU" if args.device == "cuda" else f"fedray, {workers} CPU worker(s)"
            rows.append(measure(label, lambda: run_fedray(overrides + resources, scratch), per_round, gpu))
            ray.shutdown()  # the next setting starts a Ray sized for its workers
            print(json.dumps(rows[-1]), flush=True)
        rows.append(measure(f"plain loop, one process ({args.device})", lambda: run_plain(overrides, args.device), per_round, gpu))
        print(json.dumps(rows[-1]), flush=True)
    if gpu is not None:
        gpu.stop()

    plain = rows[-1]["updates_per_s"]
    print(f"\nW3, {args.model}{' (quick)' if args.quick else ''}, {args.device}:")
    print(f"{'side':<40} {'s/round':>8} {'updates/s':>10} {'vs plain':>9} {'GPU busy':>9}")
    for row in rows:
        busy = "n/a" if row["gpu_busy_percent"] is None else f"{row['gpu_busy_percent']:.0f} %"
        print(
            f"{row['side']:<40} {row['steady_round_s']:>8.3f} {row['updates_per_s']:>10.1f} {row['updates_per_s'] / plain:>8.2f}× {busy:>9}"
        )
    if args.json:
        args.json.write_text(json.dumps({"model": args.model, "device": args.device, "quick": args.quick, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
