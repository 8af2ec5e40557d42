"""Processes fedray starts outside Python's ``subprocess`` bookkeeping (a Ray head, a test cluster's
nodes), found and stopped by pid and start time: a pid alone may have been reused by an unrelated
process since. Linux only (``/proc``), as Ray's local nodes are.

Also the free ports, private files and ``ray start`` port flags that such a head needs.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

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


def process_tree(root: int) -> list[tuple[int, int]]:
    """(pid, start time) of ``root`` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        start = process_start_time(pid)
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
