"""``fedray up`` / ``fedray down`` beyond the happy path: what the service listens on.

Real processes throughout: the console entry point in subprocesses, a real Ray head, real signals.
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
from test_service import fedray

from fedray.runtime.processes import is_running
from fedray.runtime.service import STATE_FILE, ServiceState

LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}


def _with_environment(entry: str) -> list[tuple[int, int]]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if entry.encode() in (proc / "environ").read_bytes().split(b"\0"):
                found.append((int(proc.name), int((proc / "stat").read_text().rsplit(")", 1)[1].split()[19])))
        except (OSError, IndexError, ValueError):
            continue
    return [process for process in found if process[0] != os.getpid()]


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


def environment(service_dir: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")}
    env["FEDRAY_SERVICE_DIR"] = str(service_dir)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path.cwd()), os.environ.get("PYTHONPATH")]))
    return env


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


def test_the_service_listens_on_the_loopback_only(tmp_path):
    service_dir = tmp_path / "service"
    try:
        up = fedray("up", "--detach", "--warm-workers", "1", "--num-cpus", "2", cwd=tmp_path, service_dir=service_dir)
        assert up.returncode == 0, up.stdout + up.stderr
        state = ServiceState.read(service_dir / STATE_FILE)

        def sockets() -> list[tuple[str, int, str]]:
            pids = {pid for pid, _ in head_processes(service_dir)} | {state.pid}
            found = []
            for connection in psutil.net_connections(kind="inet"):
                listening = connection.status == psutil.CONN_LISTEN or (connection.type == 2 and connection.laddr)  # TCP, or bound UDP
                if connection.pid in pids and listening:
                    found.append((connection.laddr.ip, connection.laddr.port, " ".join(command_of(connection.pid))[:80]))
            return found

        # every Ray server is up once the warm worker has booted (it listens too), the agents before it
        assert wait_until(lambda: any("ray::IDLE" in command for _, _, command in sockets()), 120), sockets()
        for _ in range(5):  # and a few seconds more, for a server that comes late
            listening = sockets()
            assert len(listening) >= 10, (
                listening
            )  # GCS, raylet (2), dashboard (2), agents (4), client server, the worker, fedray's dashboard
            assert [entry for entry in listening if entry[0] not in LOOPBACK] == []
            time.sleep(2)
        assert any(port == int(state.ray_address.rsplit(":", 1)[1]) for _, port, _ in listening)  # the GCS is among them
    finally:
        fedray("down", cwd=tmp_path, service_dir=service_dir)
        kill_everything(service_dir)
