"""Start-up: `fedray run` of workload W1 against the plain single-process PyTorch loop of
benchmarks/w1_overhead.py, each as a fresh process, in the same invocation.

For each side: the time to its first round, from the process's start (interpreter, imports, data,
Ray and the actors included), and its end to end (from spawning the process to its exit, teardown
included). fedray's first round is the one the CLI prints ("first round after X s"); the plain loop
reports the same figure with the same clock. Both run with the real interpreter (not a shim), the
sides alternate, and each figure is the median of --repeats runs. Each side's CPU seconds (its
process tree sampled from ``/proc``, see :class:`TreeCPU`: a lower bound) up to its first round and
to its end, divided by the machine's cores, bound fedray's times from below whatever overlaps:
``ratio_first_round_cpu_floor`` and ``ratio_end_to_end_cpu_floor`` are those bounds over the plain
loop's times.

Targets (issue 18): first round <= 2x the plain loop's, end to end <= 1.5x.

    python benchmarks/startup.py --repeats 3          # --json FILE to save the figures
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIRST_ROUND_LINE = re.compile(r"^first round after\s+([0-9.]+) s", re.MULTILINE)
TARGETS = {"first_round": 2.0, "end_to_end": 1.5}


def plain_child() -> None:
    """The plain loop's process: W1 end to end, then its time to the first round on stdout."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from w1_overhead import W1, run_plain  # torch and fedray's data code, not Ray

    from fedray.cli.run import seconds_since_process_start

    result = run_plain(W1)
    # The rounds run back to back and nothing follows the last: round 1 ended when the others began.
    first_round = seconds_since_process_start() - sum(result["round_s"][1:])
    print(json.dumps({"first_round_s": first_round, "final_accuracy": result["final_accuracy"]}))


class TreeCPU(threading.Thread):
    """Samples every 50 ms the CPU seconds used so far by process ``root`` and its descendants (Ray's
    daemons and worker processes are the driver's) from ``/proc``. A process that lives less than
    one sample is missed, so the figures are lower bounds."""

    def __init__(self, root: int) -> None:
        super().__init__(daemon=True)
        self.root, self.started = root, time.perf_counter()
        self.samples: list[tuple[float, float]] = []  # (seconds since start, CPU seconds of the tree)
        self.per_process: dict[int, float] = {}
        self.done = threading.Event()

    def run(self) -> None:
        tick = os.sysconf("SC_CLK_TCK")
        while not self.done.wait(0.05):
            parents, cpu = {}, {}
            for stat in Path("/proc").glob("[0-9]*/stat"):
                try:
                    fields = stat.read_text().rpartition(")")[2].split()
                except OSError:  # the process ended meanwhile
                    continue
                pid = int(stat.parent.name)
                parents[pid], cpu[pid] = int(fields[1]), (int(fields[11]) + int(fields[12])) / tick
            for pid in cpu:
                ancestor = pid
                while ancestor not in (self.root, 0, 1) and ancestor in parents:
                    ancestor = parents[ancestor]
                if ancestor == self.root:
                    self.per_process[pid] = cpu[pid]
            self.samples.append((time.perf_counter() - self.started, sum(self.per_process.values())))

    def at(self, seconds: float) -> float:
        """CPU seconds of the tree ``seconds`` after the process started (the last sample before)."""
        return max((cpu for at, cpu in self.samples if at <= seconds), default=0.0)


def _run(command: list[str], cwd: str) -> tuple[float, TreeCPU, str]:
    """Wall seconds, the CPU samples and stdout of ``command``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])), "RAY_ADDRESS": ""}
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    cpu = TreeCPU(process.pid)
    cpu.start()
    stdout, stderr = process.communicate(timeout=600)
    seconds = time.perf_counter() - started
    cpu.done.set()
    cpu.join()
    if process.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:4])} ... failed ({process.returncode}):\n{stderr[-3000:]}")
    return seconds, cpu, stdout


def run_plain_once(scratch: str) -> dict[str, float]:
    seconds, cpu, stdout = _run([sys.executable, __file__, "--plain-child"], scratch)
    reported = json.loads(stdout.strip().splitlines()[-1])
    return {
        "first_round": reported["first_round_s"],
        "end_to_end": seconds,
        "cpu_first_round": cpu.at(reported["first_round_s"]),
        "cpu_end_to_end": cpu.at(seconds),
        "final_accuracy": reported["final_accuracy"],
    }


def run_fedray_once(scratch: str, w1: list[str]) -> dict[str, float]:
    from fedray.layout import SUMMARY_FILE  # here, not at the top: the timed child processes import this file

    overrides = [arg for item in [*w1, f"output.dir={scratch}"] for arg in ("--set", item)]
    seconds, cpu, stdout = _run([sys.executable, "-m", "fedray.cli.main", "run", *overrides, "--quiet"], scratch)
    match = FIRST_ROUND_LINE.search(stdout)
    if match is None:
        raise RuntimeError(f"no 'first round after' line in the output of fedray run:\n{stdout[-2000:]}")
    [run_dir] = [path for path in Path(scratch).iterdir() if path.is_dir() and (path / SUMMARY_FILE).is_file()]
    summary = json.loads((run_dir / SUMMARY_FILE).read_text())
    return {
        "first_round": float(match.group(1)),
        "end_to_end": seconds,
        "cpu_first_round": cpu.at(float(match.group(1))),
        "cpu_end_to_end": cpu.at(seconds),
        "final_accuracy": summary["final_test_accuracy"],
        "ray_startup": summary["ray_startup_seconds"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each side (median reported; default 3)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument("--plain-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.plain_child:
        plain_child()
        return 0

    sys.path.insert(0, str(REPO / "benchmarks"))
    from w1_overhead import W1

    runs: dict[str, list[dict[str, float]]] = {"plain": [], "fedray": []}
    for _ in range(args.repeats):  # alternating, so that a slower spell of the machine hits both sides
        with tempfile.TemporaryDirectory() as scratch:
            runs["plain"].append(run_plain_once(scratch))
        with tempfile.TemporaryDirectory() as scratch:
            runs["fedray"].append(run_fedray_once(scratch, W1))

    figures: dict[str, float] = {}
    for side, results in runs.items():
        for name in results[0]:
            figures[f"{side}_{name}{'' if name == 'final_accuracy' else '_s'}"] = statistics.median(r[name] for r in results)
    for name in TARGETS:
        figures[f"ratio_{name}"] = figures[f"fedray_{name}_s"] / figures[f"plain_{name}_s"]
    cores = len(os.sched_getaffinity(0))
    for name in TARGETS:
        # No schedule of fedray's processes on these cores gets there before its CPU seconds / cores.
        figures[f"ratio_{name}_cpu_floor"] = figures[f"fedray_cpu_{name}_s"] / cores / figures[f"plain_{name}_s"]
    width = max(map(len, figures))
    for name, value in figures.items():
        print(f"{name:<{width}}  {value:.3f}")
    for name, target in TARGETS.items():
        ratio = figures[f"ratio_{name}"]
        print(
            f"target: ratio_{name} <= {target} -> {'met' if ratio <= target else 'NOT met'} (CPU floor on "
            f"{cores} cores: {figures[f'ratio_{name}_cpu_floor']:.2f})"
        )
    if args.json:
        args.json.write_text(json.dumps({**figures, "runs": runs}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
