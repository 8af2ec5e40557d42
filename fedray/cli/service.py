"""``fedray up [--results DIR] [--num-cpus N] [--warm-workers N] [--dashboard-port P] [--detach]`` and
``fedray down``: a warm local Ray and the dashboard, which ``fedray run``, ``tune`` and ``submit`` use
while it is up (see :mod:`fedray.runtime.service` and docs/guide/running.md).

Exit codes: ``up``: 0 when stopped by Ctrl-C, SIGTERM, SIGHUP or ``fedray down`` (with ``--detach``:
once it is up), 1 when its Ray did not come up or stopped, 2 invalid input or a service already
starting or running in the service directory. ``down``: 0 when it stopped the service (or what a
dead one left), 1 when none was running.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from fedray.config import ConfigError
from fedray.runtime.processes import usable_cores

if TYPE_CHECKING:
    from fedray.runtime.service import ServiceState


def register(subparsers: argparse._SubParsersAction) -> None:
    up = subparsers.add_parser(
        "up",
        help="start a warm local Ray and the dashboard, used by run/tune/submit until `fedray down`",
        description="Start a local Ray (free ports on 127.0.0.1, token authentication) and the dashboard over the "
        "results folder, print their addresses and stay up until Ctrl-C or `fedray down`. While it is up, "
        "`fedray run`, `fedray tune` and `fedray submit` without --address use it instead of starting Ray.",
    )
    up.add_argument("--results", default="runs", metavar="DIR", help="folder the dashboard shows (default: runs, output.dir's default)")
    cores = usable_cores()
    up.add_argument("--num-cpus", type=int, default=cores, metavar="N", help=f"CPUs the runs may reserve (default: this machine's {cores})")
    up.add_argument(
        "--warm-workers",
        type=int,
        metavar="N",
        help="Ray workers kept booted (torch imported) between runs; 0: none (default: --num-cpus + 1, a run's workers and server)",
    )
    up.add_argument("--dashboard-port", type=int, default=0, metavar="P", help="the dashboard's port (default: 0, any free port)")
    up.add_argument("--detach", action="store_true", help="run in the background (output in the service directory's service.log)")
    up.add_argument("--lock-fd", type=int, help=argparse.SUPPRESS)  # --detach: the lock it took, inherited by the service's process
    up.set_defaults(handler=up_command)
    down = subparsers.add_parser("down", help="stop the local service of `fedray up`", description="Stop exactly what `fedray up` started.")
    down.set_defaults(handler=down_command)


def up_command(args: argparse.Namespace) -> int:
    from fedray.runtime.service import LocalService, acquire_lock, claim_lock, is_lock_of, lock_holder, service_dir

    results = Path(args.results).expanduser()
    if results.exists() and not results.is_dir():
        raise ConfigError(f"--results {results}", "a file, not a folder", within=None)
    if args.num_cpus < 1:
        raise ConfigError("--num-cpus", f"expected at least 1, got {args.num_cpus}", within=None)
    warm_workers = args.num_cpus + 1 if args.warm_workers is None else args.warm_workers
    if warm_workers < 0:
        raise ConfigError("--warm-workers", f"expected 0 or more, got {warm_workers}", within=None)
    if not 0 <= args.dashboard_port <= 65535:
        raise ConfigError("--dashboard-port", f"expected 0 to 65535, got {args.dashboard_port}", within=None)
    directory = service_dir()
    if args.lock_fd is not None and is_lock_of(args.lock_fd, directory):  # started by `fedray up --detach`, which holds it
        lock = args.lock_fd
        claim_lock(lock)
        os.set_inheritable(lock, False)  # never passed on to Ray's processes, which may outlive this one
    else:
        lock = acquire_lock(directory)
    if lock is None:
        holder = lock_holder(directory, wait=2.0)
        print(
            f"fedray: a local service is already starting or running in {directory}"
            + (f" (pid {holder})" if holder else "")
            + "; `fedray down` stops it",
            file=sys.stderr,
        )
        return 2
    if not _clear_the_way(directory):
        return 2
    if args.detach:
        return _detach(args, lock)
    results.mkdir(parents=True, exist_ok=True)
    service = LocalService(results, args.num_cpus, warm_workers, args.dashboard_port, directory)
    signal.signal(signal.SIGHUP, signal.default_int_handler)  # a closed terminal stops it like Ctrl-C (SIGTERM does already)
    try:
        _say("fedray: starting the local service ...")
        _print_addresses(service.start(), service.state_path)
        service.serve()
    except KeyboardInterrupt:
        pass
    finally:
        for stop_signal in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # a second one must not cut the stop short
            signal.signal(stop_signal, signal.SIG_IGN)
        stopped = service.stop()
        _say(f"fedray: local service stopped ({stopped} Ray processes)")
    return 0


def _clear_the_way(directory: Path) -> bool:
    """With the lock held: refuse when the directory's state file names a running service (one of an
    older fedray, without the lock); stop what a service that died left (its ``fedray up`` killed,
    its head's processes still running), saying so."""
    from fedray.runtime.service import recorded_service, stop_service

    state = recorded_service(directory)
    if state is None:
        return True
    if state.is_running():
        print(
            f"fedray: a local service is already running (Ray at {state.ray_address}, pid {state.pid}); `fedray down` stops it",
            file=sys.stderr,
        )
        return False
    reason = state.why_not_running()
    stopped = stop_service(state, directory)
    _say(f"fedray: the last local service was not running: {reason}; stopped the {stopped} Ray processes it left")
    return True


def _say(line: str) -> None:
    """A line on stderr; a terminal closed meanwhile (SIGHUP) must not stop the service's stop."""
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        pass


def _print_addresses(state: "ServiceState", state_path: Path) -> None:
    print(f"ray        {state.ray_address}  (job server {state.job_server_url})")
    print(f"dashboard  {state.dashboard_url}  over {state.results_dir}")
    print(f"state      {state_path}")
    print("fedray run / tune / submit use it while it is up; Ctrl+C or `fedray down` stops it", flush=True)


def _detach(args: argparse.Namespace, lock: int) -> int:
    """Start ``fedray up`` (the same options) in a new session, its output in ``service.log``, handing
    it the lock ``lock``, and return once it has written its state file."""
    from fedray.runtime.service import DETACHED_LOG, READY_TIMEOUT_S, STATE_FILE, ServiceState, service_dir

    directory = service_dir()
    command = [sys.executable, "-m", "fedray.cli.main", "up", "--results", args.results, "--num-cpus", str(args.num_cpus)]
    command += ["--dashboard-port", str(args.dashboard_port), "--lock-fd", str(lock)]
    if args.warm_workers is not None:
        command += ["--warm-workers", str(args.warm_workers)]
    log_path = directory / DETACHED_LOG
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, pass_fds=(lock,)
        )
    os.close(lock)  # the service's process holds it now
    deadline = time.monotonic() + READY_TIMEOUT_S + 30
    while (state := ServiceState.read(directory / STATE_FILE)) is None or state.pid != process.pid:
        if process.poll() is not None or time.monotonic() > deadline:
            print(f"fedray: the local service did not start; its log: {log_path}", file=sys.stderr)
            print(log_path.read_text()[-2000:], file=sys.stderr, end="")
            if process.poll() is None:
                process.terminate()
            return 1
        time.sleep(0.2)
    _print_addresses(state, directory / STATE_FILE)
    return 0


def down_command(args: argparse.Namespace) -> int:
    from fedray.runtime.service import lock_holder, recorded_service, service_dir, stop_service

    directory = service_dir()
    state = recorded_service(directory)
    if state is None:
        holder = lock_holder(directory)
        if holder is not None:
            print(f"fedray: the local service is still starting (pid {holder}); run `fedray down` again once it is up", file=sys.stderr)
        else:
            print("fedray: no local service is running (`fedray up` starts one)", file=sys.stderr)
        return 1
    if state.is_running():
        stopped = stop_service(state, directory)
        print(f"fedray: stopped the local service: Ray at {state.ray_address} ({stopped} processes), dashboard at {state.dashboard_url}")
        return 0
    reason = state.why_not_running()
    stopped = stop_service(state, directory)
    print(f"fedray: the local service was not running: {reason}; stopped the {stopped} Ray processes it left")
    return 0
