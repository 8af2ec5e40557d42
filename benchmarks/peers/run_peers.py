"""fedray against its peers, side by side in one invocation (issue 46): workload W1 and pfl-research's
benchmark shape (benchmarks/peers/workloads.py) in a plain PyTorch loop, fedray (the local backend
with one worker; Ray with 1 and 2 worker actors), pfl-research (``pfl``, its one-process
``SimulatedBackend``, PyTorch) and Flower's Ray simulation (``flwr[simulation]``, 2 ClientApp actors
of 1 CPU each).

    python benchmarks/peers/run_peers.py --json peers.json           # both workloads
    python benchmarks/peers/run_peers.py --workloads w1 --json w1.json

Every system trains the same thing: fedray's partition of the data, its seeded cohorts
(``fedray.seeding.sample_cohort``), the same initial weights, local epochs, batch size and lr, the
global model scored after the same rounds. The plain loop (benchmarks/w1_overhead.py ``run_plain``),
pfl and Flower also take the same batches in the same order (fedray draws its own), so after a round
their weights agree to float rounding (1e-8); SGD on the CIFAR-shaped data amplifies rounding (a 1e-8
change of the weights grows to 7e-5 in one round), so after 10 rounds their accuracies differ by a
few tenths of a percent.

Each peer runs in its own virtual environment, made at first use under ``--venv-dir``: ``python -m
venv --system-site-packages`` (the installed torch and fedray are reused, not downloaded) and the
peer installed into it by pip with its own pins (Flower pins its own Ray). That needs the package
registry; without it the script stops with the failing command and pip's message. fedray starts its
own Ray for each run (no ``fedray up`` service), as Flower does.

Figures, as benchmarks/w1_overhead.py's: steady state = median seconds per round over rounds 3 to the
last but one; end to end = from the call to its return, data preparation and any Ray start-up
included. A peer's are measured inside its own process after its imports, as the plain loop's and
fedray's are in this one (its whole process, imports included, is in the JSON as ``process_s``).
Ratios are to the plain loop of the same invocation: the machine's load (printed) moves absolute
times far more than ratios. 30 minutes on 2 cores at load average 8-17 (most of it Flower's, whose
actors each prepare the data, and the pfl-shaped workload's 10 rounds); the first time a minute more
to install the peers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

PEERS_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(PEERS_DIR))
from workloads import BENCHMARKS, WORKLOADS  # noqa: E402  (puts benchmarks/ on sys.path)

from w1_overhead import median_run, run_fedray, run_plain  # noqa: E402

#: peer -> (what pip installs into its virtual environment, the module run there, its worker count, its row's label)
PEERS = {
    "pfl": ("pfl[pytorch]==0.6.0", "pfl_peer", 1, "pfl-research, 1 process"),
    "flower": ("flwr[simulation]==1.42.0", "flower_peer", 2, "Flower, Ray, 2 actors"),
}
#: W1's plain loop and local backend run this many times, alternating (the first run in a process
#: pays torch's warm-up), and the median is reported; the pfl-shaped workload's rounds dwarf it.
REPEATS = {"w1": 2, "pfl": 1}


def ensure_venv(path: Path, requirement: str) -> Path:
    """The Python of a virtual environment at ``path`` holding ``requirement``, made here unless an
    earlier install of the same requirement completed; stops the script, naming the failing command,
    when it cannot be made."""
    python, installed = path / "bin" / "python", path / "fedray-peer-requirement.txt"
    if installed.is_file() and installed.read_text() == requirement:
        return python
    commands = [[str(python), "-m", "pip", "install", "--quiet", requirement]]
    if not python.exists():
        commands.insert(0, [sys.executable, "-m", "venv", "--system-site-packages", str(path)])
    for command in commands:
        try:
            done = subprocess.run(command, capture_output=True, text=True)
            failure = None if done.returncode == 0 else f"exit {done.returncode}\n{(done.stderr or done.stdout).strip()[-3000:]}"
        except OSError as error:
            failure = str(error)
        if failure:
            raise SystemExit(
                f"run_peers: cannot create the virtual environment {path} for {requirement}:\n$ {' '.join(command)}\n{failure}"
            )
    installed.write_text(requirement)
    return python


def run_peer(python: Path, module: str, workload: str, workers: int, log_dir: Path) -> dict:
    """One run of a peer in its own process; its output goes to a log file, shown when it fails."""
    out, log = log_dir / f"{module}-{workload}.json", log_dir / f"{module}-{workload}.log"
    # Imported by name, not run as __main__ (see flower_peer's docstring).
    command = [str(python), "-c", f"import sys, {module}; sys.exit({module}.main(sys.argv[1:]))"]
    command += ["--workload", workload, "--workers", str(workers), "--out", str(out)]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PEERS_DIR), str(BENCHMARKS)])}
    environment.pop("RAY_ADDRESS", None)
    started = time.perf_counter()
    with log.open("w") as sink:
        done = subprocess.run(command, stdout=sink, stderr=subprocess.STDOUT, env=environment, cwd=BENCHMARKS.parent)
    if done.returncode != 0:
        raise SystemExit(f"run_peers: {module} failed on {workload} (exit {done.returncode}); the end of {log}:\n{log.read_text()[-3000:]}")
    return {**json.loads(out.read_text()), "process_s": time.perf_counter() - started}


def run_workload(name: str, pythons: dict[str, Path], log_dir: Path) -> dict[str, dict]:
    import ray

    overrides = WORKLOADS[name]
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as scratch:
        plain_runs, local_runs = [], []
        for _ in range(REPEATS[name]):
            plain_runs.append(run_plain(overrides))
            local_runs.append(run_fedray(overrides + ["resources.backend=local", "resources.num_workers=1"], scratch))
        results["plain loop"], results["fedray, local backend"] = median_run(plain_runs), median_run(local_runs)
        for workers in (1, 2):
            results[f"fedray, Ray, {workers} worker{'s' if workers > 1 else ''}"] = run_fedray(
                overrides + ["resources.backend=ray", f"resources.num_workers={workers}"], scratch
            )
            ray.shutdown()  # each run starts its own Ray, as Flower's does
    for peer, python in pythons.items():
        _, module, workers, label = PEERS[peer]
        results[label] = run_peer(python, module, name, workers, log_dir)
    return results


def table(name: str, results: dict[str, dict]) -> list[str]:
    plain = results["plain loop"]
    lines = [
        f"\n{name}:",
        "| system | s/round (steady) | / plain | end to end, s | / plain | final accuracy |",
        "|---|---|---|---|---|---|",
    ]
    for system, result in results.items():
        lines.append(
            f"| {system} | {result['steady_round_s']:.3f} | {result['steady_round_s'] / plain['steady_round_s']:.2f} | "
            f"{result['end_to_end_s']:.1f} | {result['end_to_end_s'] / plain['end_to_end_s']:.2f} | {100 * result['final_accuracy']:.2f} % |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, help="also write the figures (and every round's seconds) to this file")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated, of {', '.join(WORKLOADS)}")
    parser.add_argument("--peers", default=",".join(PEERS), help=f"comma-separated, of {', '.join(PEERS)} (none: '')")
    parser.add_argument("--venv-dir", type=Path, default=Path.home() / ".cache" / "fedray-peers", help="where the peers' environments live")
    args = parser.parse_args(argv)
    workloads = [name for name in args.workloads.split(",") if name]
    peers = [name for name in args.peers.split(",") if name]
    if unknown := [name for name in workloads if name not in WORKLOADS] + [name for name in peers if name not in PEERS]:
        parser.error(f"unknown workload or peer: {', '.join(unknown)}")

    import ray

    started, load_before = time.perf_counter(), os.getloadavg()
    pythons = {peer: ensure_venv(args.venv_dir / peer, PEERS[peer][0]) for peer in peers}
    log_dir = args.venv_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    results = {}
    with tempfile.TemporaryDirectory() as no_service:
        os.environ["FEDRAY_SERVICE_DIR"] = no_service  # no `fedray up` service to join: fedray starts its own Ray
        os.environ.pop("RAY_ADDRESS", None)
        for name in workloads:
            results[name] = run_workload(name, pythons, log_dir)
            print("\n".join(table(name, results[name])), flush=True)
    load_after = os.getloadavg()
    peer_versions = {key: value for runs in results.values() for run in runs.values() for key, value in run.get("versions", {}).items()}
    machine = {
        "date": time.strftime("%Y-%m-%d"),
        "cores": os.cpu_count(),
        "load_average_before": load_before,
        "load_average_after": load_after,
        "seconds": time.perf_counter() - started,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "ray (fedray)": ray.__version__,
        "pfl": peer_versions.get("pfl"),
        "flwr": peer_versions.get("flwr"),
        "ray (flwr)": peer_versions.get("ray"),
    }
    print(
        f"{machine['date']}, {machine['cores']} cores, load average {load_before[0]:.1f} before and {load_after[0]:.1f} after; "
        f"torch {machine['torch']}, Ray {machine['ray (fedray)']} (fedray), pfl {machine['pfl']}, flwr {machine['flwr']} "
        f"with Ray {machine['ray (flwr)']}; {machine['seconds'] / 60:.1f} minutes in all"
    )
    if args.json:
        args.json.write_text(json.dumps({"machine": machine, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
