"""The GPU check, one command (issue 46, item 2): fedray's CUDA tests and workload W3 on fractional
GPUs against a plain single-process loop on the same GPU, with a JSON and a Markdown report.

    python benchmarks/gpu_check.py --out DIR      # on a CUDA machine: about 3 minutes on an H100
    python benchmarks/gpu_check.py --quick        # a smaller W3 (100 clients, 10 per round, 5 rounds)
    python benchmarks/gpu_check.py --report docs/results/raw/gpu_check_h200.json   # a committed run's tables

1. The test suite's CUDA-marked tests (``pytest -m cuda``).
2. W3: synthetic CIFAR-shaped data (3×32×32, 10 classes), 1,000 clients × 50 images (IID), 50
   clients per round, 12 rounds, ``resnet8`` and ``cnn_cifar``, 1 local epoch, batch 10, SGD lr 0.05,
   FedAvg, evaluation every 5 rounds. fedray runs it with ``resources.gpus_per_worker`` 1, 0.5 and 0.25
   (1, 2 and 4 workers sharing the one GPU, 1 CPU each), the plain loop (benchmarks/w1_overhead.py's
   ``run_plain``, on the GPU) in this process. For each side: client updates per second (clients per
   round / median steady seconds per round, rounds 3 to the last but one), the ratio to the plain
   loop's, the GPU's busy % over those rounds and the peak GPU memory of each worker process (both
   sampled by ``nvidia-smi`` every 100 ms; a process's memory includes its CUDA context), and the final
   test accuracy (the three fedray sides train the same model on the same cohorts: equal accuracies
   mean the worker count changed nothing).

3. Vectorised local training (``train.vectorize``, benchmarks/vectorized.py's ``compare``): one worker
   with the whole GPU (the local backend) training the same rounds as the loop (``off``) and
   vectorised (``on``, the automatic group size), client updates per second each and the ratio, on
   W3 with ``cnn_cifar`` (``resnet8`` has BatchNorm, which trains as the loop) and on W1's shape
   (benchmarks/vectorized.py's ``w1_like``: 1×8×8 images, 100 clients per round, 5 steps of batch 10,
   ``cnn_small``); on a GPU also W3 with cohorts of 200 a round (``--cohorts``). Each side's GPU busy % over the
   steady rounds and the peak memory torch allocated, and W3's vectorised client updates/s against
   the plain loop's of step 2 (target ≥ 5×). ``--skip-vectorized`` leaves it out.

The JSON records the commit (``FEDRAY_COMMIT`` where set: a GPU host's copy of the tree may carry no
``.git`` or a stale one; else git's), torch's and Ray's versions, the machine and the date.

On a machine without a GPU it says so and does a CPU dry run of the same code path (quick W3 on CPU
workers; the CUDA tests are collected and skip), then exits 0. Exit 1 when a CUDA test fails.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
from vectorized import compare as compare_vectorized  # noqa: E402
from vectorized import machine  # noqa: E402
from vectorized import w1_like  # noqa: E402
from w1_overhead import run_fedray, run_plain  # noqa: E402

GPU_FRACTIONS = (1.0, 0.5, 0.25)
MODELS = ("resnet8", "cnn_cifar")
TARGETS = {"one_worker_vs_plain": 1 / 1.1, "four_quarters_vs_one_worker": 2.0, "vectorized_vs_plain": 5.0}


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


class GPUSampler(threading.Thread):
    """``nvidia-smi`` every 100 ms: the GPU's busy % and the memory of each process using it."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.busy: list[tuple[float, float]] = []  # (time.perf_counter(), busy %)
        self.process_memory: list[tuple[float, int, float]] = []  # (time, pid, MiB)
        query = ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms", "100"]
        apps = ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits", "-lms", "100"]
        self.processes = [
            subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) for command in (query, apps)
        ]
        self.apps_reader = threading.Thread(target=self._read_apps, daemon=True)

    def run(self) -> None:
        self.apps_reader.start()
        for line in self.processes[0].stdout:
            if line.strip().isdigit():
                self.busy.append((time.perf_counter(), float(line)))

    def _read_apps(self) -> None:
        for line in self.processes[1].stdout:
            pid, _, used = line.partition(",")
            if pid.strip().isdigit() and used.strip().isdigit():
                self.process_memory.append((time.perf_counter(), int(pid), float(used)))

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
            process.wait()

    def busy_between(self, start: float, end: float) -> float | None:
        inside = [busy for at, busy in self.busy if start <= at <= end]
        return float(np.mean(inside)) if inside else None

    def peak_memory_by_process(self, start: float, end: float) -> dict[int, float]:
        peaks: dict[int, float] = {}
        for at, pid, used in self.process_memory:
            if start <= at <= end:
                peaks[pid] = max(peaks.get(pid, 0.0), used)
        return peaks


def measure(side: str, run, per_round: int, sampler: GPUSampler | None, workers: int) -> dict:
    started = time.perf_counter()
    result = run()
    first, last = result["round_ends"][1], result["round_ends"][-2]  # the steady rounds (as w1_overhead's)
    row = {
        "side": side,
        "workers": workers,
        "steady_round_s": result["steady_round_s"],
        "updates_per_s": per_round / result["steady_round_s"],
        "final_accuracy": result["final_accuracy"],
        "gpu_busy_percent": None,
        "peak_gpu_mib_per_worker": None,
    }
    if sampler is not None:
        row["gpu_busy_percent"] = sampler.busy_between(first, last)
        peaks = sampler.peak_memory_by_process(started, time.perf_counter())
        if workers == 0:  # the plain loop: this process
            peaks = {os.getpid(): peaks[os.getpid()]} if os.getpid() in peaks else {}
        else:
            peaks.pop(os.getpid(), None)
        row["peak_gpu_mib_per_worker"] = max(peaks.values()) if peaks else None
        row["gpu_processes_seen"] = len(peaks)
    if workers == 0 and torch.cuda.is_available():
        row["plain_loop_max_allocated_mib"] = torch.cuda.max_memory_allocated() / 2**20
    return row


def run_cuda_tests(report: dict) -> bool:
    """``pytest -m cuda`` over the test files that carry the marker (other files need the test extras)."""
    files = sorted(str(path.relative_to(REPO)) for path in (REPO / "tests").rglob("test_*.py") if "mark.cuda" in path.read_text())
    command = [sys.executable, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider", *files]
    print("+", " ".join(command), flush=True)
    started = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr.strip()[-300:]
    print(done.stdout[-4000:], done.stderr[-2000:], sep="\n", flush=True)
    report["cuda_tests"] = {"files": files, "exit_code": done.returncode, "summary": summary, "seconds": time.perf_counter() - started}
    return done.returncode in (0, 5)  # 5: none collected


def run_w3(model: str, quick: bool, device: str, sampler: GPUSampler | None) -> list[dict]:
    import ray

    overrides = w3(model, quick)
    _, per_round, _ = w3_size(quick)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for fraction in GPU_FRACTIONS:
            workers = round(1 / fraction)
            resources = ["resources.backend=ray", f"resources.num_workers={workers}", "resources.cpus_per_worker=1"]
            resources.append(f"resources.gpus_per_worker={fraction if device == 'cuda' else 0}")
            label = f"fedray, {workers} worker(s) × {fraction:g} GPU" if device == "cuda" else f"fedray, {workers} CPU worker(s)"
            rows.append(measure(label, lambda: run_fedray(overrides + resources, scratch), per_round, sampler, workers))
            ray.shutdown()  # the next setting starts a Ray sized for its workers
            print(json.dumps(rows[-1]), flush=True)
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        rows.append(measure(f"plain loop, one process ({device})", lambda: run_plain(overrides, device), per_round, sampler, 0))
        print(json.dumps(rows[-1]), flush=True)
    plain = rows[-1]["updates_per_s"]
    for row in rows:
        row["vs_plain"] = row["updates_per_s"] / plain
    return rows


def run_vectorized(quick: bool, device: str, sampler: GPUSampler | None, cohorts: list[int]) -> dict[str, dict]:
    """The loop against vectorised training on one worker with the whole GPU (the local backend),
    on W3 with cnn_cifar (and, on a GPU, W3 with each of ``cohorts`` clients a round) and on W1's shape with
    cnn_small (see the module's docstring). On a GPU each side also gets its GPU busy % over the
    steady rounds and the peak memory torch allocated."""
    gpu = [f"resources.gpus_per_worker={1 if device == 'cuda' else 0}"]
    local = ["resources.backend=local", "resources.num_workers=1", "resources.cpus_per_worker=1"]
    _, _, rounds = w3_size(quick)
    w3_cnn = [item for item in w3("cnn_cifar", quick) if not item.startswith("eval.every=")] + [f"eval.every={rounds}"]
    workloads = {
        "w3/cnn_cifar": w3_cnn,
        "w1_like/cnn_small": w1_like(rounds, clients=200 if quick else 1000) + ["model.name=cnn_small", "checkpoint.every=1000"],
    }
    for cohort in [] if quick else cohorts:
        workloads[f"w3_cohort{cohort}/cnn_cifar"] = [item for item in w3_cnn if not item.startswith("train.clients_per_round=")] + [
            f"train.clients_per_round={cohort}"
        ]
    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        for name, overrides in workloads.items():
            overrides = overrides + local + gpu + ["output.tensorboard=false", "output.plots=false"]
            results[name] = compare_vectorized(overrides, 1, scratch, name)
            for side in ("loop", "vectorized"):
                row = results[name][side]
                row["peak_gpu_allocated_mib"] = max(row["peak_gpu_allocated_mib"]) if row["peak_gpu_allocated_mib"][0] is not None else None
                busy = [sampler.busy_between(ends[1], ends[-2]) for ends in row["round_ends"]] if sampler is not None else []
                row["gpu_busy_percent"] = float(np.mean(busy)) if busy and None not in busy else None
            print(json.dumps({name: {side: results[name][side]["updates_per_s"] for side in ("loop", "vectorized")}}), flush=True)
    return results


def markdown(report: dict) -> str:
    lines = [
        f"# GPU check, {report['date']}",
        "",
        f"Device: {report['device']}; torch {report['torch']}, Ray {report['ray']}, Python {report['python']}; "
        f"W3{' (quick)' if report['quick'] else ''}; `python benchmarks/gpu_check.py`.",
        "",
    ]
    tests = report.get("cuda_tests")
    if tests:
        lines += [f"CUDA tests (`pytest -m cuda`, {len(tests['files'])} files): {tests['summary']} (exit {tests['exit_code']}).", ""]
    for model, rows in report["w3"].items():
        lines += [
            f"## W3, {model}",
            "",
            "| side | s/round | updates/s | vs plain | GPU busy | peak GPU MiB per worker | final accuracy |",
            "|---|---|---|---|---|---|---|",
        ]
        for row in rows:
            busy = "n/a" if row["gpu_busy_percent"] is None else f"{row['gpu_busy_percent']:.0f} %"
            memory = "n/a" if row["peak_gpu_mib_per_worker"] is None else f"{row['peak_gpu_mib_per_worker']:.0f}"
            lines.append(
                f"| {row['side']} | {row['steady_round_s']:.3f} | {row['updates_per_s']:.1f} | {row['vs_plain']:.2f}× | {busy} | "
                f"{memory} | {row['final_accuracy']:.4f} |"
            )
        checks = report["targets"][model]
        lines += [
            "",
            f"- 1 worker × 1 GPU vs the plain loop: {checks['one_worker_vs_plain']:.2f}× (target ≥ {TARGETS['one_worker_vs_plain']:.2f}×: "
            f"within 1.1× of the plain loop) — {'met' if checks['one_worker_met'] else 'not met'}",
            f"- 4 workers × 0.25 GPU vs 1 worker × 1 GPU: {checks['four_quarters_vs_one_worker']:.2f}× (target ≥ 2×) — "
            f"{'met' if checks['four_quarters_met'] else 'not met'}",
            f"- final accuracy the same for 1, 2 and 4 workers: {'yes' if checks['same_accuracy'] else 'no'}",
            "",
        ]
    if report.get("vectorized"):
        lines += [
            "## Vectorised local training (`train.vectorize`), one worker",
            "",
            "| workload | loop s/round | loop updates/s | loop GPU busy | vectorised s/round | vectorised updates/s | "
            "vectorised GPU busy | vectorised peak MiB | ratio |",
            "|---|---|---|---|---|---|---|---|---|",
        ]

        def percent(value: float | None) -> str:
            return "n/a" if value is None else f"{value:.0f} %"

        for name, row in report["vectorized"].items():
            loop, vectorized = row["loop"], row["vectorized"]
            memory = "n/a" if vectorized["peak_gpu_allocated_mib"] is None else f"{vectorized['peak_gpu_allocated_mib']:.0f}"
            lines.append(
                f"| {name} | {loop['steady_round_s']:.3f} | {loop['updates_per_s']:.1f} | {percent(loop['gpu_busy_percent'])} | "
                f"{vectorized['steady_round_s']:.3f} | {vectorized['updates_per_s']:.1f} | {percent(vectorized['gpu_busy_percent'])} | "
                f"{memory} | {row['ratio']:.2f}× |"
            )
        against_plain = report["vectorized"].get("w3/cnn_cifar", {}).get("vectorized_vs_plain")
        if against_plain is not None:
            lines += [
                "",
                f"- W3 with cnn_cifar, vectorised against the plain loop: {against_plain:.2f}× "
                f"(target ≥ {TARGETS['vectorized_vs_plain']:.0f}×) — {'met' if against_plain >= TARGETS['vectorized_vs_plain'] else 'not met'}",
            ]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("gpu_check"), help="folder for gpu_check.json and gpu_check.md")
    parser.add_argument("--quick", action="store_true", help="a small W3 (100 clients, 10 per round, 5 rounds)")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated (default {','.join(MODELS)})")
    parser.add_argument("--skip-tests", action="store_true", help="leave out the CUDA tests")
    parser.add_argument("--cohorts", default="200", help="W3's larger cohorts for the vectorised comparison, on a GPU (default 200)")
    parser.add_argument("--skip-vectorized", action="store_true", help="leave out the loop vs vectorised training comparison")
    parser.add_argument("--report", type=Path, help="print the Markdown report of a gpu_check.json (a committed run's) and exit")
    args = parser.parse_args(argv)
    if args.report is not None:
        print(markdown(json.loads(args.report.read_text())))
        return 0
    import ray

    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    quick = args.quick or not cuda
    if not cuda:
        print("gpu_check: no CUDA device here: a CPU dry run of the same code path (quick W3 on CPU workers)", flush=True)
    report: dict = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "device": torch.cuda.get_device_name(0)
        if cuda
        else f"CPU only ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)",
        "torch": torch.__version__,
        "ray": ray.__version__,
        "python": platform.python_version(),
        **{key: value for key, value in machine().items() if key in ("commit", "working_tree_modified", "platform", "cpu_count")},
        "quick": quick,
        "w3": {},
        "targets": {},
    }
    started = time.perf_counter()
    tests_passed = True if args.skip_tests else run_cuda_tests(report)
    sampler = GPUSampler() if cuda and shutil.which("nvidia-smi") else None
    if sampler is not None:
        sampler.start()
    for model in [name.strip() for name in args.models.split(",") if name.strip()]:
        rows = run_w3(model, quick, device, sampler)
        one, four = rows[0], rows[2]
        report["w3"][model] = rows
        report["targets"][model] = {
            "one_worker_vs_plain": one["vs_plain"],
            "one_worker_met": one["vs_plain"] >= TARGETS["one_worker_vs_plain"],
            "four_quarters_vs_one_worker": four["updates_per_s"] / one["updates_per_s"],
            "four_quarters_met": four["updates_per_s"] / one["updates_per_s"] >= TARGETS["four_quarters_vs_one_worker"],
            "same_accuracy": len({row["final_accuracy"] for row in rows[:3]}) == 1,
        }
    if not args.skip_vectorized:
        report["vectorized"] = run_vectorized(quick, device, sampler, [int(size) for size in args.cohorts.split(",") if size.strip()])
        plain = next((row for row in report["w3"].get("cnn_cifar", []) if row["workers"] == 0), None)
        if plain is not None:  # the plain loop of W3 with cnn_cifar, in this invocation
            row = report["vectorized"]["w3/cnn_cifar"]
            row["vectorized_vs_plain"] = row["vectorized"]["updates_per_s"] / plain["updates_per_s"]
    if sampler is not None:
        sampler.stop()
    report["seconds"] = time.perf_counter() - started
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=2))
    (args.out / "gpu_check.md").write_text(markdown(report))
    print(markdown(report))
    print(f"gpu_check: {report['seconds']:.0f} s; report in {args.out / 'gpu_check.md'} and gpu_check.json", flush=True)
    return 0 if tests_passed else 1


if __name__ == "__main__":
    sys.exit(main())
