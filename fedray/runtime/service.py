"""The warm local service of ``fedray up`` / ``fedray down`` (docs/guide/running.md, "A warm local
service").

``fedray up`` starts a Ray head on this machine (``ray start --head --block``) and serves the
dashboard (:mod:`fedray.dashboard`) over a results folder; ``fedray run``, ``fedray tune`` and
``fedray submit`` then join that Ray instead of starting one for every command (Ray's start-up is
most of a short run's wall time, benchmarks/w1_overhead.py ``--service``).

The head is isolated like the clusters of :mod:`fedray.testing.cluster`: free ports for every Ray
server, its own temp dir (a plain ``ray.init()`` elsewhere never joins it), its own token (token
authentication, ``RAY_AUTH_MODE=token``; the token file is readable by its owner only), and its
dashboard and job server on 127.0.0.1. Its workers import the actors' module as they boot
(:func:`~fedray.runtime.ray_start.worker_system_config`), and the service keeps a few such workers
booted between runs (:meth:`LocalService.keep_warm`): a run's actors then start in a process that
has torch and fedray imported already.

Every server of the head listens on 127.0.0.1 only (:func:`head_environment`): Ray 2.60 on Linux
replaces ``--node-ip-address 127.0.0.1`` by the machine's address, and binds its GCS, raylet,
agents and client server to all interfaces, unless ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (the
setting that keeps a Mac's or Windows' Ray on the loopback), which the head and every process that
joins it (:func:`connect_environment`) are given.

What it started is recorded in ``service.json`` in the service directory (``$FEDRAY_SERVICE_DIR``,
default ``~/.fedray/service``): the pids (with their start times, so a reused pid is never taken
for them) of the ``fedray up`` process, of the ``ray start`` process every Ray process of the head
descends from and of its GCS and raylet, the addresses, and the service's id, a random value in the
environment of every process of its head (``$FEDRAY_SERVICE_ID``), by which its processes are found
even once orphaned. ``fedray down`` stops exactly those processes, after checking that they are the
ones recorded (start time, command line, the id), never ``ray stop`` (which stops every Ray
instance of the machine); it removes the temp dir only when it is one that ``fedray up`` made.

Only one ``fedray up`` runs per service directory: it holds an exclusive ``flock`` on
``service.lock`` there for its whole life (``--detach`` hands it to the process it starts), which
the kernel releases when the process ends, however it ends.

Exit paths: ``fedray up`` stops its head on Ctrl-C, SIGTERM (``kill``, ``timeout``, ``fedray
down``), SIGHUP (its terminal closed), an error, and when the head dies. SIGKILL (and the OOM
killer) cannot be caught: the head is then told by the kernel (``prctl(PR_SET_PDEATHSIG)``: SIGTERM
to ``ray start``, which stops its node), and whatever is still left, a process orphaned meanwhile or
the whole head when ``ray start`` itself was killed too, is stopped by the next ``fedray down`` (or
``fedray up``), which finds it by the service's id. A state file whose processes are all gone (a
crash, a reboot) is ignored with a one-line note and removed.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

from fedray.config import ConfigError
from fedray.config.schema import ResourcesConfig
from fedray.runtime.errors import RunError
from fedray.runtime.processes import (
    RAY_HEAD_PORT_FLAGS,
    RAY_NODE_PORT_FLAGS,
    command_line,
    die_with_parent,
    free_port,
    has_environment,
    is_running,
    process_start_time,
    process_tree,
    processes_with_environment,
    signal_processes,
    stop_process_tree,
    wait_gone,
    write_private_file,
)

SERVICE_DIR_VARIABLE = "FEDRAY_SERVICE_DIR"
SERVICE_ID_VARIABLE = "FEDRAY_SERVICE_ID"  # in the environment of every process of the head: what `fedray down` finds them by
STATE_FILE = "service.json"
LOCK_FILE = "service.lock"  # flock'ed by the one `fedray up` of the directory, for its whole life
TEMP_DIR_PREFIX = "fedray-ray-"  # the head's temp dir, in the system's (Ray's sockets need a short path)
TOKEN_FILE = "auth_token"
HEAD_LOG = "ray-head.log"
DETACHED_LOG = "service.log"  # `fedray up --detach`: the service's own output
READY_TIMEOUT_S = 180.0  # for the head to come up (a loaded machine takes a minute)
STOP_TIMEOUT_S = 60.0  # for the service to stop its head after SIGTERM, before its processes are killed
WARM_KEEP_ALIVE_S = 24 * 3600  # the raylet does not kill a pre-started idle worker before this
REFILL_PAUSE_S = 5.0  # after asking for warm workers: they are not counted before the raylet has forked them
_RAY_AGENTS = ("ray::DashboardAgent", "ray::RuntimeEnvAgent")  # the raylet's children that are not workers
_CORE = ("gcs_server", "raylet")  # the head's processes without which it is no Ray (`ray start --block` outlives them on SIGTERM)
_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
_CONNECT_TIMEOUT_S = 5.0  # for the service's GCS to accept a connection before a run joins it
# Ray 2.60 on Linux replaces a node address of 127.0.0.1 by the machine's, and binds its servers to all
# interfaces, unless this is off (ray._private.ray_constants.ENABLE_RAY_CLUSTER; services.get_node_ip_address)
LOOPBACK_ONLY = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def service_dir() -> Path:
    """Where the service keeps its state file, token and logs: ``$FEDRAY_SERVICE_DIR`` or ``~/.fedray/service``."""
    return Path(os.environ.get(SERVICE_DIR_VARIABLE) or Path.home() / ".fedray" / "service").expanduser()


@dataclass
class ServiceState:
    """``service.json``: what ``fedray up`` started, for the commands that use it and ``fedray down``."""

    pid: int  # the `fedray up` process (which serves the dashboard)
    pid_start: int  # its start time (clock ticks since boot): with the pid, its identity
    head_pid: int  # `ray start --head --block`: every process of the Ray head descends from it
    head_start: int
    ray_address: str  # the GCS, HOST:PORT: what `fedray run --address` would take
    job_server_url: str  # Ray's dashboard and job server: what `fedray submit --address` would take
    dashboard_url: str  # fedray's dashboard over results_dir
    results_dir: str
    ray_temp_dir: str
    token_file: str
    num_cpus: int
    started: str  # ISO time
    service_id: str = ""  # $FEDRAY_SERVICE_ID of the head's processes ("": a file of an older fedray)
    core: list[list[Any]] = field(default_factory=list)  # [name, pid, start time] of the head's GCS and raylet

    @classmethod
    def read(cls, path: Path) -> "ServiceState | None":
        """The state in ``path``; None when the file is missing, unreadable or not fedray's."""
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def write(self, path: Path) -> None:
        """Write the file whole (0600: it names the token file) and atomically, so a reader never sees half of it."""
        partial = path.with_suffix(".partial")
        write_private_file(partial, json.dumps(asdict(self), indent=2))
        partial.replace(path)

    def up_is_running(self) -> bool:
        """Whether the recorded ``fedray up`` process still runs: the pid with its start time, and a
        ``fedray ... up`` command line (never an unrelated process that a damaged file names)."""
        if not is_running(self.pid, self.pid_start):
            return False
        arguments = command_line(self.pid)
        return "up" in arguments[1:] and any("fedray" in argument for argument in arguments[:3])

    def head_is_running(self) -> bool:
        """Whether the recorded ``ray start`` process still runs and is this service's: its id in its
        environment (a file without one: its ``--temp-dir``)."""
        if not is_running(self.head_pid, self.head_start):
            return False
        if self.service_id:
            return has_environment(self.head_pid, SERVICE_ID_VARIABLE, self.service_id)
        arguments = command_line(self.head_pid)
        return "start" in arguments and any(pair == ("--temp-dir", self.ray_temp_dir) for pair in zip(arguments, arguments[1:]))

    def dead_core(self) -> str | None:
        """The first of the head's GCS and raylet that is gone, as ``"gcs_server (pid N)"``; None if both run."""
        for name, pid, start in self.core:
            if not is_running(pid, start):
                return f"{name} (pid {pid})"
        return None

    def is_running(self) -> bool:
        return self.up_is_running() and self.head_is_running() and self.dead_core() is None

    def ray_processes(self) -> list[tuple[int, int]]:
        """(pid, start time) of the head's processes that still run: the ``ray start`` process's tree
        if it is this service's, and every process with the service's id in its environment (a child
        orphaned by the death of its parent among them)."""
        found = process_tree(self.head_pid) if self.head_is_running() else []
        if self.service_id:
            found += [process for process in processes_with_environment(SERVICE_ID_VARIABLE, self.service_id) if process not in found]
        return [process for process in found if process[0] != os.getpid()]

    def why_not_running(self) -> str:
        """Why :meth:`is_running` is false, for a one-line message."""
        if not self.up_is_running():
            return f"its `fedray up` process, pid {self.pid}, is gone"
        if not self.head_is_running():
            return f"its Ray head, `ray start` pid {self.head_pid}, is gone"
        return f"its Ray head's {self.dead_core()} is gone"

    def token(self) -> str:
        return Path(self.token_file).read_text().strip()


def recorded_service(directory: Path | None = None, note: Callable[[str], None] | None = None) -> ServiceState | None:
    """The service that ``directory`` (default :func:`service_dir`) records, running or not, as long
    as one of its processes is left; a state file that is damaged or whose processes are all gone is
    removed, and ``note`` (default: a line on stderr) says so."""
    path = (directory or service_dir()) / STATE_FILE
    if not path.exists():
        return None
    state = ServiceState.read(path)
    if state is not None and (state.up_is_running() or state.ray_processes()):
        return state
    path.unlink(missing_ok=True)
    if state is not None:  # what a `fedray up` that died (SIGKILL) could not remove
        (path.parent / TOKEN_FILE).unlink(missing_ok=True)
        if own_temp_dir(state):
            shutil.rmtree(state.ray_temp_dir, ignore_errors=True)
    (note or _stderr_line)(f"fedray: the local service recorded in {path} is no longer running; removed its state file")
    return None


def running_service(directory: Path | None = None, note: Callable[[str], None] | None = None) -> ServiceState | None:
    """The service recorded in ``directory`` (default :func:`service_dir`) if it runs (its ``fedray
    up``, its head, the head's GCS and raylet). A state file left by one that is gone is removed
    (:func:`recorded_service`); one whose processes are only partly gone is kept for ``fedray down``,
    and ``note`` (default: a line on stderr) says what is left."""
    state = recorded_service(directory, note)
    if state is None or state.is_running():
        return state
    path = (directory or service_dir()) / STATE_FILE
    (note or _stderr_line)(
        f"fedray: the local service recorded in {path} is not running: {state.why_not_running()}; `fedray down` stops what it left"
    )
    return None


def _stderr_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def connect_environment(state: ServiceState) -> None:
    """Make this process's Ray client send the service's token: ``RAY_AUTH_MODE=token`` and
    ``RAY_AUTH_TOKEN`` (which Ray reads before any token file), and take the head's 127.0.0.1 for
    this node's address (:data:`LOOPBACK_ONLY`; otherwise Ray would look for the GCS and a raylet at
    the machine's address, where the head does not listen). Ray reads these into its config when it
    is imported; if it already is, its config and token cache are reloaded, as Ray itself does when
    it turns token authentication on for a new local instance, and its loopback setting is set."""
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN"] = state.token()
    os.environ.update(LOOPBACK_ONLY)
    if "ray" in sys.modules:
        from ray._private import ray_constants
        from ray._raylet import AuthenticationTokenLoader, Config

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()
        ray_constants.ENABLE_RAY_CLUSTER = False


def _announce(address: str) -> None:
    _stderr_line(f"fedray: using the local service at {address}  (fedray down stops it)")


def joinable_service() -> ServiceState | None:
    """The running service for a command to join, or None when none is recorded (or only what a
    dead one left, with a note). A service whose ``fedray up`` still runs but whose Ray head died
    (or does not answer) is refused in one line (RunError, exit 1), instead of the minutes a Ray
    client would wait for its GCS."""
    state = recorded_service()
    if state is None:
        return None
    if not state.up_is_running():
        return running_service()  # the note on what it left
    if not state.is_running():
        raise RunError(
            f"the local service at {state.ray_address} (`fedray up`, pid {state.pid}) has no Ray any more: "
            f"{state.why_not_running()}; `fedray down` stops what is left, `fedray up` starts a new one"
        )
    host, port = state.ray_address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=_CONNECT_TIMEOUT_S).close()
    except OSError as error:
        raise RunError(
            f"the local service's Ray head at {state.ray_address} (`fedray up`, pid {state.pid}) does not answer "
            f"({error.strerror or type(error).__name__}); `fedray down` stops it, `fedray up` starts a new one"
        ) from None
    return state


def service_ray_address(resources: ResourcesConfig | None, on_ray: bool) -> str | None:
    """For ``fedray run`` / ``fedray tune`` without ``--address``: the GCS address of the running
    service, after checking that the run fits it, or None (no service, ``$RAY_ADDRESS`` set, or a
    run that needs no Ray, ``on_ray`` false: ``resources.backend: auto`` keeps one worker in the
    driver's process, which is faster than any Ray). Says so in one line on stderr."""
    if not on_ray or os.environ.get("RAY_ADDRESS"):
        return None
    state = joinable_service()
    if state is None:
        return None
    if resources is not None:
        check_fits_service(resources, state)
    connect_environment(state)
    _announce(state.ray_address)
    return state.ray_address


def service_job_server_url() -> str | None:
    """For ``fedray submit`` / ``fedray jobs`` without ``--address`` (nor ``$RAY_API_SERVER_ADDRESS``
    / ``$RAY_ADDRESS``): the running service's job server URL, or None."""
    if any(os.environ.get(name) for name in ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")):
        return None
    state = joinable_service()
    if state is None:
        return None
    connect_environment(state)
    _announce(state.job_server_url)
    return state.job_server_url


def check_fits_service(resources: ResourcesConfig, state: ServiceState) -> None:
    """Refuse a run the service cannot hold before anything starts (exit 2), as for a local Ray
    (:func:`~fedray.runtime.ray_start.check_gpu_available`): a placement group larger than the head
    would wait 120 s and fail."""
    from fedray.runtime.ray_start import check_gpu_available

    check_gpu_available(resources)
    if resources.reserved_cpus > state.num_cpus:
        raise ConfigError(
            "resources.num_workers",
            f"{resources.num_workers} worker(s) × {resources.cpus_per_worker} CPU "
            f"(+ {resources.server_cpus} for the server) need {resources.reserved_cpus:g} CPUs, but the local service has "
            f"{state.num_cpus}; lower them, or restart it with `fedray down && fedray up --num-cpus N`",
        )


class LocalService:
    """The processes of one ``fedray up``: the Ray head and the dashboard (served by this process).

    :meth:`start` brings both up and writes the state file; :meth:`serve` keeps workers warm until
    interrupted or the head dies; :meth:`stop` stops the head's processes, closes the dashboard and
    removes the state, token and temp dir.
    """

    def __init__(self, results_dir: Path, num_cpus: int, warm_workers: int, dashboard_port: int = 0, directory: Path | None = None) -> None:
        self.directory = directory or service_dir()
        self.results_dir = results_dir.resolve()
        self.num_cpus = num_cpus
        self.warm_workers = warm_workers
        self.dashboard_port = dashboard_port
        self.head: subprocess.Popen | None = None
        self.head_processes: list[tuple[int, int]] = []  # snapshot for stop(), taken when the head is up
        self.dashboard: Any = None
        self.state: ServiceState | None = None
        self.temp_dir: Path | None = None
        self.service_id = ""  # $FEDRAY_SERVICE_ID of the head's processes
        self.core: list[list[Any]] = []  # [name, pid, start time] of the head's GCS and raylet
        self.node_manager_port = 0
        self._prestart: Any = None  # the raylet's PrestartWorkers RPC (None: warm workers switched off or unavailable)
        self._channel: Any = None  # its gRPC channel, closed before the head stops
        self._next_refill = 0.0  # time.monotonic() before which keep_warm does not look again

    @property
    def state_path(self) -> Path:
        return self.directory / STATE_FILE

    def start(self) -> ServiceState:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        token_file = self.directory / TOKEN_FILE
        write_private_file(token_file, os.urandom(32).hex())
        # not under the service directory: Ray's Unix sockets, <temp dir>/session_<time>_<pid>/sockets/plasma_store,
        # must stay below 108 bytes
        self.temp_dir = Path(tempfile.mkdtemp(prefix=TEMP_DIR_PREFIX))
        gcs_port, job_server_port, self.node_manager_port = free_port(), free_port(), free_port()
        command = [
            str(Path(sys.executable).with_name("ray")) if Path(sys.executable).with_name("ray").exists() else "ray",
            "start",
            "--head",
            "--block",
            "--disable-usage-stats",
            "--node-ip-address",
            "127.0.0.1",
            "--port",
            str(gcs_port),
            "--temp-dir",
            str(self.temp_dir),
            "--num-cpus",
            str(self.num_cpus),
            "--include-dashboard",
            "true",
            "--dashboard-host",
            "127.0.0.1",
            "--dashboard-port",
            str(job_server_port),
            "--system-config",
            json.dumps(_head_system_config(self.num_cpus, self.warm_workers)),
        ]
        for flag in RAY_HEAD_PORT_FLAGS + RAY_NODE_PORT_FLAGS:
            command += [flag, str(self.node_manager_port if flag == "--node-manager-port" else free_port())]
        self.service_id = os.urandom(16).hex()
        env = head_environment(token_file, self.service_id)
        # Signals are held back from the start of `ray start` until self.head records it (so that a
        # Ctrl-C or SIGTERM then stops it too); it dies with this process (die_with_parent: SIGKILL included).
        held = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        try:
            with open(self.directory / HEAD_LOG, "w") as log:
                self.head = subprocess.Popen(
                    command,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    preexec_fn=die_with_parent(),
                )
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
        job_server_url = f"http://127.0.0.1:{job_server_port}"
        self._wait_until_ready(job_server_url, token_file.read_text())
        self.head_processes = process_tree(self.head.pid)
        self.core = [
            [name, pid, start] for name in _CORE for pid, start in self.head_processes if command_line(pid)[0].endswith(f"/{name}")
        ]
        from fedray.dashboard.app import DashboardServer

        self.dashboard = DashboardServer(self.results_dir, port=self.dashboard_port)
        threading.Thread(target=self.dashboard.serve_forever, name="fedray-dashboard", daemon=True).start()
        self.state = ServiceState(
            pid=os.getpid(),
            pid_start=process_start_time(os.getpid()) or 0,
            head_pid=self.head.pid,
            head_start=process_start_time(self.head.pid) or 0,
            ray_address=f"127.0.0.1:{gcs_port}",
            job_server_url=job_server_url,
            dashboard_url=self.dashboard.url,
            results_dir=str(self.results_dir),
            ray_temp_dir=str(self.temp_dir),
            token_file=str(token_file),
            num_cpus=self.num_cpus,
            started=datetime.now().astimezone().isoformat(timespec="seconds"),
            service_id=self.service_id,
            core=self.core,
        )
        self.state.write(self.state_path)
        self._prestart = self._prestart_rpc(token_file.read_text()) if self.warm_workers > 0 else None
        self.keep_warm()
        return self.state

    def _wait_until_ready(self, job_server_url: str, token: str) -> None:
        """Until Ray's job server answers (it comes up after the GCS and the raylet)."""
        request = urllib.request.Request(f"{job_server_url}/api/jobs/", headers={"Authorization": f"Bearer {token}"})
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            try:
                with urllib.request.urlopen(request, timeout=5):
                    return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if self.head.poll() is not None or time.monotonic() > deadline:
                log = (self.directory / HEAD_LOG).read_text()[-3000:]
                raise RunError(
                    f"the local service's Ray did not come up within {READY_TIMEOUT_S:g} s; its log ({self.directory / HEAD_LOG}):\n{log}"
                )
            time.sleep(0.5)

    def _prestart_rpc(self, token: str) -> Any:
        """The raylet's ``PrestartWorkers`` call, with the token; None if this Ray lacks it (then
        runs boot their workers themselves, as on any Ray)."""
        try:
            import grpc
            from ray.core.generated import common_pb2, node_manager_pb2, node_manager_pb2_grpc
        except ImportError:
            return None
        self._channel = grpc.insecure_channel(f"127.0.0.1:{self.node_manager_port}")
        stub = node_manager_pb2_grpc.NodeManagerServiceStub(self._channel)
        metadata = (("authorization", f"Bearer {token.strip()}"),)

        def prestart(count: int) -> None:
            request = node_manager_pb2.PrestartWorkersRequest(
                language=common_pb2.Language.PYTHON, num_workers=count, keep_alive_duration_secs=WARM_KEEP_ALIVE_S
            )
            stub.PrestartWorkers(request, metadata=metadata, timeout=10)

        return prestart

    def keep_warm(self) -> None:
        """Keep ``warm_workers`` idle Ray workers booted (with torch and fedray imported) while no
        run uses the head. Ray ties a worker to the first job that uses it and ends it with that
        job, so the next run would boot its own; the raylet's ``PrestartWorkers`` call (what Ray's
        own prestarting uses) boots ones that any job may take. Refilled only when no run is on the
        head, so booting workers never competes with a run for the cores."""
        if self._prestart is None or time.monotonic() < self._next_refill:
            return
        workers = worker_processes(self.head.pid)
        booted = workers["booting"] + workers["idle"]
        if workers["busy"] == 0 and booted < self.warm_workers:
            try:
                self._prestart(self.warm_workers - booted)
            except Exception as error:  # a Ray whose raylet lacks the call: runs boot their own workers
                if not _raylet_not_ready(error):  # a raylet still starting: asked again after the pause
                    self._prestart = None
            self._next_refill = time.monotonic() + REFILL_PAUSE_S  # until the raylet has forked them

    def serve(self, poll_seconds: float = 1.0) -> None:
        """Keep workers warm until interrupted (KeyboardInterrupt: Ctrl-C, or SIGTERM from ``fedray down``)
        or until the head dies (RunError)."""
        while True:
            if self.head.poll() is not None:
                raise RunError(f"the local service's Ray stopped (exit code {self.head.returncode}); its log: {self.directory / HEAD_LOG}")
            for name, pid, start in self.core:  # `ray start --block` outlives a GCS or raylet stopped by SIGTERM
                if not is_running(pid, start):
                    raise RunError(f"the local service's Ray stopped: its {name} (pid {pid}) exited; its log: {self.directory / HEAD_LOG}")
            self.keep_warm()
            time.sleep(poll_seconds)

    def stop(self) -> int:
        """Stop what :meth:`start` started; returns the number of Ray processes stopped."""
        if self.dashboard is not None:
            self.dashboard.shutdown()
            self.dashboard.server_close()
        if self._channel is not None:
            self._channel.close()
        stopped = 0
        if self.head is not None:
            head = (self.head.pid, process_start_time(self.head.pid) or 0)
            processes = self.head_processes + [p for p in process_tree(self.head.pid) if p not in self.head_processes]
            core_lost = any(not is_running(pid, start) for _, pid, start in self.core)  # nothing to drain: no waiting
            stopped = stop_head(head if self.head.poll() is None else None, processes, self.service_id, 5 if core_lost else STOP_TIMEOUT_S)
            if self.head.poll() is None:
                self.head.wait(timeout=10)
        state = ServiceState.read(self.state_path)
        if state is not None and state.pid == os.getpid():  # never another service's file
            self.state_path.unlink(missing_ok=True)
        (self.directory / TOKEN_FILE).unlink(missing_ok=True)
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
        return stopped


def _raylet_not_ready(error: Exception) -> bool:
    """Whether a ``PrestartWorkers`` call failed only because the raylet does not answer yet: its
    node manager port opens after the job server that :meth:`LocalService.start` waits for, and on
    a loaded machine the first call came too early about one ``fedray up`` in two, which then kept no
    worker warm for the service's whole life."""
    import grpc

    return isinstance(error, grpc.RpcError) and error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def _head_system_config(num_cpus: int, warm_workers: int) -> dict[str, Any]:
    """:func:`~fedray.runtime.ray_start.worker_system_config`, and no workers prestarted for the head's
    first driver: Ray would boot one per CPU when the first run joins, beside the warm workers its
    actors take, and their imports took the CPU of that run's first rounds (benchmarks/service_idle_cost.py)."""
    from fedray.runtime.ray_start import worker_system_config

    return {**worker_system_config(max(num_cpus, warm_workers) + 1), "prestart_worker_first_driver": False}


def worker_processes(head_pid: int) -> dict[str, int]:
    """The Ray worker processes of the head whose ``ray start`` process is ``head_pid``, by state:
    ``booting`` (importing, not yet registered), ``idle`` and ``busy`` (running a task or an actor),
    told apart by the title Ray gives a worker process (``ray::IDLE``, ``ray::<actor class>``)."""
    counts = {"booting": 0, "idle": 0, "busy": 0}
    raylet = next((pid for pid, _ in process_tree(head_pid) if command_line(pid)[0].endswith("/raylet")), None)
    if raylet is None:
        return counts
    for pid, _ in process_tree(raylet)[1:]:
        arguments = command_line(pid)
        if arguments[0].startswith("ray::IDLE"):
            counts["idle"] += 1
        elif arguments[0].startswith("ray::"):
            counts["busy"] += not arguments[0].startswith(_RAY_AGENTS)
        elif any(argument.endswith(("setup_worker.py", "default_worker.py")) for argument in arguments[1:3]):
            counts["booting"] += 1
    return counts


def head_environment(token_file: Path, service_id: str) -> dict[str, str]:
    """The environment of the service's ``ray start`` (and so of every process of its head): this
    process's without a Ray address or token, token authentication with the service's token file,
    the service's id, :data:`LOOPBACK_ONLY`, and free ports for the autoscaler's and the dashboard's
    metrics, which Ray otherwise puts on fixed ports (44217, 44227) that another Ray may hold."""
    env = {key: value for key, value in os.environ.items() if key not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN")}
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token_file), **LOOPBACK_ONLY)
    env.update(AUTOSCALER_METRIC_PORT=str(free_port()), DASHBOARD_METRIC_PORT=str(free_port()))
    env[SERVICE_ID_VARIABLE] = service_id
    return env


def stop_head(head: tuple[int, int] | None, processes: list[tuple[int, int]], service_id: str, timeout: float = STOP_TIMEOUT_S) -> int:
    """Stop a head: SIGTERM to its ``ray start`` process ``head`` (None: gone), which stops its node's
    processes, up to ``timeout`` s (its drain waits that long for a GCS that is gone); then SIGTERM,
    and SIGKILL after 5 s, to what is left of ``processes`` and of the processes with the service's id
    in their environment (a process that a dead ``ray start`` left, or one forked after ``processes``
    was listed). Returns the number of them that were running."""

    def head_processes() -> list[tuple[int, int]]:
        marked = processes_with_environment(SERVICE_ID_VARIABLE, service_id) if service_id else []
        listed = dict.fromkeys([*([head] if head else []), *processes, *marked])
        return [process for process in listed if process[0] != os.getpid() and is_running(*process)]

    running = head_processes()
    if head is not None and is_running(*head):
        stop_process_tree([head], timeout)
    left = head_processes()
    if not wait_gone(left, 2):
        signal_processes(left, signal.SIGTERM)
        if not wait_gone(left, 5):
            signal_processes(left, signal.SIGKILL)
            wait_gone(left, 5)
    return len(running)


def own_temp_dir(state: ServiceState) -> bool:
    """Whether ``state.ray_temp_dir`` is the temp dir that ``fedray up`` made for its head (so
    ``fedray down`` may remove it): a directory (not a link) of this user named ``fedray-ray-*``,
    holding nothing but Ray's session folders of that head (``session_<time>_<head pid>``) and the
    links Ray puts next to them."""
    path = Path(state.ray_temp_dir)
    try:
        if path.is_symlink() or not path.is_dir() or path.stat().st_uid != os.getuid() or not path.name.startswith(TEMP_DIR_PREFIX):
            return False
        entries = list(path.iterdir())
    except OSError:
        return False
    for entry in entries:
        if entry.name in ("session_latest", "prom_metrics_service_discovery.json") and entry.is_symlink():
            continue
        if not (entry.name.startswith("session_") and entry.name.endswith(f"_{state.head_pid}")):
            return False
    return True


def stop_service(state: ServiceState, directory: Path | None = None, note: Callable[[str], None] | None = None) -> int:
    """``fedray down``: SIGTERM to the ``fedray up`` process, which stops its head (:meth:`LocalService.stop`);
    then whatever of the head is left (:func:`stop_head`: all of it when ``fedray up`` is gone, a
    SIGKILL, the OOM killer) is stopped here, by pid, after checking each is the service's (its start
    time, its command line, the service's id). Removes the state file, the token and the temp dir
    (only one that :func:`own_temp_dir` recognises; ``note``, default a line on stderr, says when it
    is not). Returns the number of the head's processes that were running."""
    directory = directory or service_dir()
    head = (state.head_pid, state.head_start) if state.head_is_running() else None
    processes = state.ray_processes()
    if state.up_is_running():
        stop_process_tree([(state.pid, state.pid_start)], STOP_TIMEOUT_S)
    stop_head(head, processes, state.service_id)
    (directory / STATE_FILE).unlink(missing_ok=True)
    (directory / TOKEN_FILE).unlink(missing_ok=True)
    if own_temp_dir(state):
        shutil.rmtree(state.ray_temp_dir, ignore_errors=True)
    elif Path(state.ray_temp_dir).exists():
        (note or _stderr_line)(f"fedray: left {state.ray_temp_dir} in place: not a temp dir of the service's Ray head")
    return len(processes)


def acquire_lock(directory: Path) -> int | None:
    """Take the exclusive lock of ``directory`` (``flock`` on its ``service.lock``) for this process,
    writing its pid and start time there; the lock's file descriptor, or None when another process
    holds it (a ``fedray up`` starting or running). The kernel releases it when the process ends."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    descriptor = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        return None
    claim_lock(descriptor)
    return descriptor


def claim_lock(descriptor: int) -> None:
    """Record this process as the holder of the lock ``descriptor`` (inherited from ``fedray up
    --detach``, or just taken)."""
    os.ftruncate(descriptor, 0)
    os.pwrite(descriptor, f"{os.getpid()} {process_start_time(os.getpid()) or 0}\n".encode(), 0)


def is_lock_of(descriptor: int, directory: Path) -> bool:
    """Whether ``descriptor`` is the lock file of ``directory``, locked by this process (an inherited lock)."""
    try:
        same = os.path.samestat(os.fstat(descriptor), os.stat(directory / LOCK_FILE))
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held already through this open file: succeeds
    except OSError:
        return False
    return same


def lock_holder(directory: Path, wait: float = 0.0) -> int | None:
    """The pid of the ``fedray up`` that holds the lock of ``directory`` per its lock file, if it
    runs; looked for up to ``wait`` s (a holder writes its pid just after it takes the lock, and the
    service's process again when ``--detach`` hands the lock over)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            pid, start = map(int, (directory / LOCK_FILE).read_text().split())
            if is_running(pid, start):
                return pid
        except (OSError, ValueError):
            pass
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)
