"""Config errors: how long `fedray run` takes to refuse each bad input that used to wait for a local
Ray's start (issue 45), each as a fresh CLI process in a fresh directory, with the default resources
(2 workers: a run that would start Ray).

For each case: the median wall seconds from spawning the process to its exit, the median CPU seconds
of its process tree (Ray's daemons and workers included, sampled from ``/proc`` by
:class:`startup.TreeCPU`: a lower bound, and far less sensitive than wall time to other jobs on the
machine), the exit code and the error line. Two reference rows bound them from below: a value the
schema refuses (before torch is imported) and a bare ``import torch``, which every check that needs
an algorithm's code, the model or the data pays. Target (issue 45): under 2 s each.

    python benchmarks/config_errors.py --repeats 5          # --json FILE to save the figures
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FEDRAY = [sys.executable, "-m", "fedray.cli.main"]
FINISHED_RUN = "finished"  # the run directory the --resume case resumes, made by finish_a_run

# (id, command, files to create {relative path: text}); "{finished}" stands for the finished run's path
CASES = [
    ("unknown-algorithm", [*FEDRAY, "run", "--set", "algorithm.name=nope"], {}),
    ("mu-on-fedavg", [*FEDRAY, "run", "--set", "algorithm.mu=0.1"], {}),
    ("moon-without-projection-dim", [*FEDRAY, "run", "--set", "algorithm.name=moon"], {}),
    ("run-dir-exists", [*FEDRAY, "run", "--set", "output.name=taken"], {"runs/taken/config.yaml": "seed: 0\n"}),
    ("missing-dataset-files", [*FEDRAY, "run", "--set", "data.name=cifar10", "--set", "data.root=nowhere"], {}),
    ("clients-above-samples", [*FEDRAY, "run", "--set", "data.num_clients=2000", "--set", "data.partition=iid"], {}),
    ("resume-finished-run", [*FEDRAY, "run", "--resume", "{finished}"], {}),
]
REFERENCES = [
    ("(schema error, no torch)", [*FEDRAY, "run", "--set", "seed=-1"], {}),
    ("(import torch alone)", [sys.executable, "-c", "import torch"], {}),
]


def environment() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])), "RAY_ADDRESS": ""}


def finish_a_run(scratch: Path) -> Path:
    """A run of one round on the local backend (no Ray), to be resumed."""
    overrides = [
        "train.rounds=1",
        "resources.num_workers=1",
        "data.num_clients=4",
        "train.clients_per_round=2",
        "output.tensorboard=false",
        "output.plots=false",
        f"output.dir={scratch}",
        f"output.name={FINISHED_RUN}",
    ]
    subprocess.run(
        [*FEDRAY, "run", "--quiet", *[arg for item in overrides for arg in ("--set", item)]],
        cwd=scratch,
        env=environment(),
        check=True,
        capture_output=True,
        timeout=600,
    )
    return scratch / FINISHED_RUN


def time_case(command: list[str], files: dict[str, str], finished: Path) -> dict[str, object]:
    """Wall and CPU seconds, exit code and stderr of ``command`` run in a fresh directory."""
    from startup import TreeCPU

    with tempfile.TemporaryDirectory(prefix="fedray-config-error-") as directory:
        for name, text in files.items():
            path = Path(directory) / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        command = [arg.replace("{finished}", str(finished)) for arg in command]
        started = time.perf_counter()
        process = subprocess.Popen(command, cwd=directory, env=environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        cpu = TreeCPU(process.pid)
        cpu.start()
        _, stderr = process.communicate(timeout=600)
        seconds = time.perf_counter() - started
        cpu.done.set()
        cpu.join()
    return {"seconds": seconds, "cpu_seconds": cpu.at(seconds), "exit_code": process.returncode, "stderr": stderr}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each case (median reported; default 3)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO / "benchmarks"))

    with tempfile.TemporaryDirectory(prefix="fedray-finished-") as scratch:
        finished = finish_a_run(Path(scratch))
        outcomes: dict[str, list[dict[str, object]]] = {case_id: [] for case_id, _, _ in CASES + REFERENCES}
        for _ in range(args.repeats):  # case after case, round after round: a load spike hits every case alike
            for case_id, command, files in CASES + REFERENCES:
                outcomes[case_id].append(time_case(command, files, finished))

    figures = {}
    print(f"{'case':32} {'wall s':>7} {'CPU s':>6}  exit  error")
    for case_id, runs in outcomes.items():
        error_lines = [line for line in runs[-1]["stderr"].splitlines() if line.strip()]
        figures[case_id] = {
            "median_seconds": statistics.median(run["seconds"] for run in runs),
            "median_cpu_seconds": statistics.median(run["cpu_seconds"] for run in runs),
            "seconds": [run["seconds"] for run in runs],
            "exit_codes": sorted({run["exit_code"] for run in runs}),
            "error": error_lines[-1] if error_lines else "",
        }
        row = figures[case_id]
        codes = ",".join(map(str, row["exit_codes"]))
        print(f"{case_id:32} {row['median_seconds']:7.2f} {row['median_cpu_seconds']:6.2f}  {codes:>4}  {row['error'][:90]}")
    print(f"\n{args.repeats} run(s) each on {os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f} at the end")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
