"""Processes fedray starts outside Python's ``subprocess`` bookkeeping (a Ray head, a test cluster's
nodes), found and stopped by pid and start time: a pid alone may have been reused by an unrelated
process since. Linux only (``/proc``), as Ray's local nodes are.

Also the free ports, private files and ``ray start`` port flags that such a head needs.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import time
from pathlib import Path
from typing import Callable

PR_SET_PDEATHSIG = 1  # prctl(2)

# `ray start` flags of every server Ray would otherwise put on a fixed default port (a second Ray on
# the machine, another user's, may hold it): every node's, and the head's besides the GCS (--port)
# and the dashboard (--dashboard-port).
RAY_NODE_PORT_FLAGS = (
    "--node-manager-port",
    "--object-manager-port",
    "--dashboard-agent-listen-port",
    "--dashboard-agent-grpc-port",
    "--metrics-export-port",
    "--runtime-env-agent-port",
)
RAY_HEAD_PORT_FLAGS = ("--ray-client-server-port",)


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity mask, where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def write_private_file(path: Path, text: str) -> None:
    """Create ``path`` readable by its owner only (0600) from the start, so a secret is never
    world-readable, not even between a create and a chmod; an existing file is replaced."""
    path.unlink(missing_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(text)


def process_start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (with the pid, a unique identity); None if gone."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def is_running(pid: int, start_time: int) -> bool:
    """Whether the process ``pid`` that started at ``start_time`` is still there (and not a zombie)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z" and process_start_time(pid) == start_time


def command_line(pid: int) -> list[str]:
    """The arguments of process ``pid`` (``[""]`` if it is gone or has none: a kernel thread, a zombie)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1] or [""]
    except OSError:
        return [""]


def has_environment(pid: int, name: str, value: str) -> bool:
    """Whether process ``pid`` started with ``name=value`` in its environment (False when its
    environment cannot be read: gone, or another user's)."""
    try:
        return f"{name}={value}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def processes_with_environment(name: str, value: str) -> list[tuple[int, int]]:
    """(pid, start time) of every process of this user that started with ``name=value`` in its
    environment, which its children inherit: with a value no other process has (a random token),
    every process descending from the one it was given to, even one orphaned since (reparented to
    init, out of :func:`process_tree`'s reach). The descendants of each are included too: a process
    that sets its title (Ray's agents do) can overwrite the environment that /proc shows of it."""
    return process_tree(
        *(int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit() and has_environment(int(entry.name), name, value))
    )


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None]:
    """A ``preexec_fn`` for :class:`subprocess.Popen`: the child gets ``sig`` when the thread that
    started it ends (``prctl(PR_SET_PDEATHSIG)``), also when its parent is killed with SIGKILL, and
    its signal mask is cleared (a parent that blocks signals around the start passes its mask on).
    If the parent is already gone when the child runs it, the child exits at once."""
    parent = os.getpid()

    def preexec() -> None:
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return preexec


def process_tree(*roots: int) -> list[tuple[int, int]]:
    """(pid, start time) of each of ``roots`` and every process below them, each once."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, seen, stack = [], set(), list(roots)
    while stack:
        pid = stack.pop()
        start = process_start_time(pid) if pid not in seen else None
        seen.add(pid)
        if start is not None:
            found.append((pid, start))
            stack.extend(children.get(pid, []))
    return found


def signal_processes(processes: list[tuple[int, int]], sig: int) -> None:
    """Send ``sig`` to each (pid, start time) that is still that process, not a reused pid."""
    for pid, start in processes:
        if process_start_time(pid) == start:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


def wait_gone(processes: list[tuple[int, int]], timeout: float) -> bool:
    """Wait until none of ``processes`` runs any more; whether that happened within ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while any(is_running(pid, start) for pid, start in processes):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def stop_process_tree(processes: list[tuple[int, int]], timeout: float) -> None:
    """Ask the first of ``processes`` (the root of a tree, e.g. a ``ray start --block``, which stops
    its node's processes on SIGTERM) to stop, wait up to ``timeout`` s, then SIGKILL whatever of the
    tree is left."""
    signal_processes(processes[:1], signal.SIGTERM)
    wait_gone(processes[:1], timeout)
    if not wait_gone(processes, 5):
        signal_processes(processes, signal.SIGKILL)
        wait_gone(processes, 5)
