"""No idle cost: a run that joins the service of ``fedray up`` against the same run on its own Ray
(issue "A cohort as one computation", item 4; target: steady round under the service <= 1.05x).

Workload W1 (benchmarks/w1_overhead.py) on Ray with ``--workers`` worker actors. Each pass runs, as
fresh ``fedray run`` processes, one after the other: the run on its own Ray (no service up), then
the run joining the service, which is started once before the first pass (``fedray up --detach``,
its default warm workers) and stopped after the last. Before each service run the script waits
until the service's warm workers have booted and are idle, the state a user's next run finds.
Steady round = median of the run's round seconds over rounds 3..R-1 (``metrics.parquet``'s round
rows; the first rounds and the final checkpoint round left out); the CPU seconds of the service's
processes (its Ray head and ``fedray up``) during each service run are summed from /proc, and the
ones that are not the run's actors are what the service costs a run.

    python benchmarks/service_idle_cost.py --passes 3       # about 6 minutes on 2 cores
    python benchmarks/service_idle_cost.py --table          # the Markdown table from the committed JSON

Raw output (commit, torch, machine, load, date) goes to ``docs/results/raw/service_idle_cost.json``.
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

import pandas as pd

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

from vectorized import machine  # noqa: E402
from w1_overhead import W1  # noqa: E402

from fedray.runtime.processes import process_tree  # noqa: E402
from fedray.runtime.service import STATE_FILE, ServiceState, worker_processes  # noqa: E402

RAW = REPO / "docs" / "results" / "raw" / "service_idle_cost.json"
START = "<!-- service_idle_cost.py --table: start -->"
END = "<!-- service_idle_cost.py --table: end -->"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: list[int]) -> dict[int, tuple[str, float]]:
    """user + system CPU seconds and the title of each of ``pids`` still running."""
    out = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        out[pid] = (title, (int(fields[11]) + int(fields[12])) / CLOCK_TICKS)
    return out


def steady_round(run_dir: Path) -> tuple[float, list[float]]:
    rounds = pd.read_parquet(run_dir / "metrics.parquet").query("scope == 'round'").sort_values("round")
    seconds = rounds["seconds"].tolist()
    return statistics.median(seconds[2:-1]), seconds


def fedray(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fedray.cli.main", *args], env=env, cwd=cwd, capture_output=True, text=True)


def run_w1(scratch: Path, name: str, workers: int, env: dict[str, str]) -> Path:
    overrides = [*W1, f"resources.num_workers={workers}", "resources.backend=ray", f"output.dir={scratch}", f"output.name={name}"]
    result = fedray(["run", "--quiet", *[arg for item in overrides for arg in ("--set", item)]], env, scratch)
    if result.returncode != 0:
        raise SystemExit(f"fedray run failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
    return scratch / name


def wait_warm(state: ServiceState, warm: int, timeout: float = 180) -> None:
    """Until the service has ``warm`` idle workers and none booting (or ``timeout`` s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        workers = worker_processes(state.head_pid)
        if workers["idle"] >= warm and workers["booting"] == 0 and workers["busy"] == 0:
            return
        time.sleep(1)
    raise SystemExit(f"the service's {warm} warm workers did not boot within {timeout:g} s: {worker_processes(state.head_pid)}")


def measure(passes: int, workers: int, warm: int | None) -> dict:
    scratch = Path(tempfile.mkdtemp(prefix="service-idle-"))
    own_env = {**os.environ, "FEDRAY_SERVICE_DIR": str(scratch / "no-service"), "RAY_ADDRESS": ""}
    service_dir = scratch / "service"
    service_env = {**own_env, "FEDRAY_SERVICE_DIR": str(service_dir)}
    up_args = ["up", "--detach", "--results", str(scratch)] + (["--warm-workers", str(warm)] if warm is not None else [])
    up = fedray(up_args, service_env, scratch)
    if up.returncode != 0:
        raise SystemExit(f"fedray up failed:\n{up.stdout}\n{up.stderr}")
    state = ServiceState.read(service_dir / STATE_FILE)
    assert state is not None
    warm_workers = warm if warm is not None else state.num_cpus + 1
    passes_out = []
    try:
        for index in range(passes):
            own_dir = run_w1(scratch, f"own-{index}", workers, own_env)
            wait_warm(state, warm_workers)
            service_pids = [state.pid, *[pid for pid, _ in process_tree(state.head_pid)]]
            before = cpu_seconds(service_pids)
            started = time.monotonic()
            service_dir_run = run_w1(scratch, f"service-{index}", workers, service_env)
            elapsed = time.monotonic() - started
            after = cpu_seconds([state.pid, *[pid for pid, _ in process_tree(state.head_pid)]])
            service_cpu = {  # processes of the service that existed before the run: not the run's actors
                title: round(after[pid][1] - before[pid][1], 2) for pid, (title, _) in before.items() if pid in after
            }
            own, own_rounds = steady_round(own_dir)
            joined, joined_rounds = steady_round(service_dir_run)
            passes_out.append(
                {
                    "own_ray_steady_round_s": own,
                    "service_steady_round_s": joined,
                    "ratio": joined / own,
                    "own_ray_round_seconds": own_rounds,
                    "service_round_seconds": joined_rounds,
                    "service_run_wall_s": round(elapsed, 2),
                    "service_processes_cpu_s_during_run": service_cpu,
                }
            )
            print(f"pass {index + 1}: own Ray {own:.3f} s/round, joining the service {joined:.3f} s/round: {joined / own:.2f}x", flush=True)
    finally:
        fedray(["down"], service_env, scratch)
    return {"machine": machine(), "args": {"passes": passes, "workers": workers, "warm_workers": warm_workers}, "passes": passes_out}


def table(report: dict) -> str:
    passes = report["passes"]
    ratios = [p["ratio"] for p in passes]
    lines = [
        "| pass | own Ray, s / round | joining `fedray up`, s / round | ratio | CPU s of the service's idle processes during the run |",
        "|---|---|---|---|---|",
    ]
    for index, p in enumerate(passes, 1):
        idle = sum(p["service_processes_cpu_s_during_run"].values())
        lines.append(f"| {index} | {p['own_ray_steady_round_s']:.3f} | {p['service_steady_round_s']:.3f} | {p['ratio']:.2f} | {idle:.1f} |")
    lines.append(f"| median | | | **{statistics.median(ratios):.2f}** | |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2, help="the runs' Ray worker actors (default 2)")
    parser.add_argument("--warm-workers", type=int, default=None, help="fedray up --warm-workers (default: its own)")
    parser.add_argument("--json", type=Path, default=RAW, help=f"raw output (default {RAW.relative_to(REPO)})")
    parser.add_argument("--table", action="store_true", help="print the Markdown table of the --json file and exit")
    args = parser.parse_args()
    if args.table:
        print(table(json.loads(args.json.read_text())))
        return
    report = measure(args.passes, args.workers, args.warm_workers)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    print(table(report))


if __name__ == "__main__":
    main()
