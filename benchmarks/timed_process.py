"""A benchmark's side timed as a fresh process: the plain loop of W1 (``benchmarks/w1_overhead.py
--plain-child``) or ``fedray run`` with given overrides, each from its spawn to its exit, with the
CPU seconds of its process tree (:class:`TreeCPU`) and its time to the first round.

Used by benchmarks/startup.py and ``benchmarks/w1_overhead.py --service``; it imports neither (it
starts w1_overhead.py as a process), so that those two do not import each other.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIRST_ROUND_LINE = re.compile(r"^first round after\s+([0-9.]+) s", re.MULTILINE)


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
    seconds, cpu, stdout = _run([sys.executable, str(REPO / "benchmarks" / "w1_overhead.py"), "--plain-child"], scratch)
    reported = json.loads(stdout.strip().splitlines()[-1])
    return {
        "first_round": reported["first_round_s"],
        "end_to_end": seconds,
        "cpu_first_round": cpu.at(reported["first_round_s"]),
        "cpu_end_to_end": cpu.at(seconds),
        "final_accuracy": reported["final_accuracy"],
    }


def run_fedray_once(scratch: str, w1: list[str]) -> dict[str, float]:
    from fedray.layout import SUMMARY_FILE

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
