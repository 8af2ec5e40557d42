"""Helpers of the ``fedray up`` / ``fedray down`` tests (test_service.py, test_service_lifecycle.py).

The processes of a test's service are found, independently of fedray's own bookkeeping, by what
their environment holds: every process that a test's ``fedray`` commands start carries its
``FEDRAY_SERVICE_DIR``, and every process of a Ray head that ``fedray up`` starts carries
``RAY_AUTH_TOKEN_PATH=<service dir>/auth_token``. Whatever a failed test leaves is killed by that."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from fedray.runtime.processes import is_running, process_tree
from fedray.runtime.service import STATE_FILE, ServiceState

SMALL_RUN = [
    "--quiet",
    "--set",
    "train.rounds=1",
    "--set",
    "data.num_clients=4",
    "--set",
    "train.clients_per_round=2",
    "--set",
    "output.tensorboard=false",
    "--set",
    "output.plots=false",
]
LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}


def environment(service_dir: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")}
    env["FEDRAY_SERVICE_DIR"] = str(service_dir)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path.cwd()), os.environ.get("PYTHONPATH")]))
    return env


def fedray(*args: str, cwd: Path, service_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fedray.cli.main", *args], cwd=cwd, env=environment(service_dir), capture_output=True, text=True, timeout=400
    )


def start_ticks(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


def _with_environment(entry: str) -> list[tuple[int, int]]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if entry.encode() in (proc / "environ").read_bytes().split(b"\0"):
                found.append((int(proc.name), start_ticks(int(proc.name))))
        except (OSError, IndexError, ValueError):
            continue
    # and their descendants: a process that sets its title (Ray's agents do) may overwrite the environment /proc shows
    return [process for process in process_tree(*(pid for pid, _ in found)) if process[0] != os.getpid()]


def head_processes(service_dir: Path) -> list[tuple[int, int]]:
    """The running processes of every Ray head started for ``service_dir``."""
    return [p for p in _with_environment(f"RAY_AUTH_TOKEN_PATH={service_dir / 'auth_token'}") if is_running(*p)]


def started_processes(service_dir: Path) -> list[tuple[int, int]]:
    """Every running process that a test's fedray commands for ``service_dir`` started, or their descendants."""
    return [p for p in _with_environment(f"FEDRAY_SERVICE_DIR={service_dir}") if is_running(*p)]


def command_of(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def listening_sockets(service_dir: Path, state: ServiceState) -> list[tuple[str, int, str]]:
    """(address, port, command) of every socket that ``fedray up`` or its Ray head listens on."""
    pids = {pid for pid, _ in head_processes(service_dir)} | {state.pid}
    found = []
    for connection in psutil.net_connections(kind="inet"):
        listening = connection.status == psutil.CONN_LISTEN or (connection.type == 2 and connection.laddr)  # TCP, or bound UDP
        if connection.pid in pids and listening:
            found.append((connection.laddr.ip, connection.laddr.port, " ".join(command_of(connection.pid))[:80]))
    return found


def wait_until(condition, timeout: float, step: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(step)
    return True


def kill_everything(service_dir: Path) -> None:
    """A failed test must not leave its processes behind."""
    for pid, _ in started_processes(service_dir):
        try:
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def start_up(service_dir: Path, cwd: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "fedray.cli.main", "up", "--warm-workers", "0", "--num-cpus", "2", *args],
        cwd=cwd,
        env=environment(service_dir),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )


def up_detached(service_dir: Path, cwd: Path) -> ServiceState:
    up = fedray("up", "--detach", "--warm-workers", "0", "--num-cpus", "2", cwd=cwd, service_dir=service_dir)
    assert up.returncode == 0, up.stdout + up.stderr
    state = ServiceState.read(service_dir / STATE_FILE)
    assert state is not None
    return state
