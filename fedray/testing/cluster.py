"""A real multi-node Ray cluster on this machine, for tests of what only a cluster shows: job
submission, a worker pool spread over nodes, a node lost mid-run.

Each node is one ``ray start --block`` process started in a new session; everything the node runs
(GCS, raylet, agents, workers, job drivers) descends from it. The cluster is isolated from any other
Ray on the machine (a test session's, other users'):

- explicit free ports for every server Ray would otherwise put on a fixed default port;
- its own ``--temp-dir`` (sessions, sockets, logs), given per node as Ray allows; ``ray start``
  records the cluster's address there, so a plain ``ray.init()`` elsewhere on the machine, which
  looks in ``/tmp/ray``, never joins this cluster;
- its own token: ``RAY_AUTH_MODE=token`` with ``RAY_AUTH_TOKEN_PATH`` pointing into the temp dir, so
  neither ``~/.ray/auth_token`` nor another cluster's token is read or written;
- it only ever signals the processes it started and their descendants, identified by pid and start
  time (never ``ray stop``, which stops every Ray instance of the machine).

Binding: the dashboard and job server listen on 127.0.0.1 only. Ray 2.60 on Linux replaces
``--node-ip-address 127.0.0.1`` by the machine's address (``services.resolve_ip_for_localhost``) and
its core gRPC servers listen on all interfaces; the token protects those.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from fedray.runtime.processes import (
    RAY_HEAD_PORT_FLAGS,
    RAY_NODE_PORT_FLAGS,
    free_port,
    process_tree,
    signal_processes,
    stop_process_tree,
    write_private_file,
)

# Ray settings of every node. A killed node fails its health checks at once (connection refused) and
# is declared dead after 10 checks 1 s apart (Ray's default period: 3 s). A live node on a busy machine
# has 10 s to answer each check, so only about 110 s without an answer declares it dead: with 5 s and
# 5 checks, a busy 2-core CI machine lost a live second node mid-test (stop 49). A node may take 2
# minutes to register on a busy machine.
NODE_SETTINGS = {
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "10000",
    "RAY_health_check_failure_threshold": "10",
    "RAY_raylet_start_wait_time_s": "120",
}
MAX_TEMP_DIR_LENGTH = 43  # + "/session_2026-01-01_00-00-00_000000_<pid>/sockets/plasma_store" <= 107


@dataclass
class LocalNode:
    process: subprocess.Popen  # `ray start --block`: every process of the node descends from it
    log: Path

    def kill(self) -> None:
        """Lose the node abruptly: SIGKILL its ``ray start`` process and everything below it."""
        signal_processes(process_tree(self.process.pid), signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self, timeout: float = 30) -> None:
        """Ray's graceful shutdown of the node (SIGTERM), then SIGKILL for whatever is left."""
        stop_process_tree(process_tree(self.process.pid), timeout)
        if self.process.poll() is None:
            self.process.wait(timeout=10)


class LocalCluster:
    """A head node (with dashboard and job server) plus any number of worker nodes, on this machine.

    Use as a context manager; :meth:`shutdown` stops exactly this cluster's processes.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        if len(str(self._temp_dir(0))) > MAX_TEMP_DIR_LENGTH:
            raise ValueError(
                f"{self._temp_dir(0)} is too long for Ray's temp dir: its Unix sockets, "
                f"<temp dir>/session_<time>_<pid>/sockets/plasma_store, must stay below 108 bytes"
            )
        self.token_file = self.directory / "auth_token"
        self.directory.mkdir(parents=True, exist_ok=True)
        write_private_file(self.token_file, secrets.token_hex(32))
        self.gcs_port = free_port()
        self.dashboard_port = free_port()
        self.nodes: list[LocalNode] = []

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    @property
    def client_env(self) -> dict[str, str]:
        """Environment variables a client (``fedray submit``, ``ray``) needs to talk to this cluster."""
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(self.token_file), "RAY_API_SERVER_ADDRESS": self.dashboard_url}

    def _temp_dir(self, node_index: int) -> Path:
        """One temp dir per node, as on separate machines: nodes sharing one would also share the
        runtime-env cache, and one node's clean-up would delete a job's working directory under the
        other node's driver."""
        return self.directory / f"ray{node_index}"

    def _start(
        self, role_args: list[str], port_flags: tuple[str, ...], num_cpus: int, resources: dict[str, float], wrapper: tuple[str, ...] = ()
    ) -> LocalNode:
        command = [*wrapper, "ray", "start", "--block", "--disable-usage-stats", *role_args]
        command += ["--node-ip-address", "127.0.0.1", "--temp-dir", str(self._temp_dir(len(self.nodes))), "--num-cpus", str(num_cpus)]
        for flag in port_flags:
            command += [flag, str(free_port())]
        if resources:
            command += ["--resources", json.dumps(resources)]
        env = {key: value for key, value in os.environ.items() if key not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN")}
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(self.token_file), **NODE_SETTINGS)
        log = self.directory / f"node{len(self.nodes)}.log"
        with open(log, "w") as output:
            process = subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
        node = LocalNode(process, log)
        self.nodes.append(node)
        return node

    def start_head(self, num_cpus: int, resources: dict[str, float] | None = None, timeout: float = 180) -> LocalNode:
        head = self._start(
            [
                "--head",
                "--port",
                str(self.gcs_port),
                "--include-dashboard",
                "true",
                "--dashboard-host",
                "127.0.0.1",
                "--dashboard-port",
                str(self.dashboard_port),
            ],
            RAY_HEAD_PORT_FLAGS + RAY_NODE_PORT_FLAGS,
            num_cpus,
            resources or {},
        )
        self._wait_for(lambda: self.request("/api/jobs/") is not None and len(self.alive_nodes()) == 1, timeout, head)
        return head

    def add_node(
        self, num_cpus: int, resources: dict[str, float] | None = None, timeout: float = 180, wrapper: tuple[str, ...] = ()
    ) -> LocalNode:
        """A worker node; ``wrapper`` is a command that execs the node's ``ray start`` command given as
        its arguments (e.g. ``unshare`` to give the node its own view of a directory)."""
        expected = len(self.alive_nodes()) + 1
        node = self._start(["--address", f"127.0.0.1:{self.gcs_port}"], RAY_NODE_PORT_FLAGS, num_cpus, resources or {}, wrapper)
        self._wait_for(lambda: len(self.alive_nodes()) == expected, timeout, node)
        return node

    def _wait_for(self, ready: Callable[[], bool], timeout: float, node: LocalNode) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if node.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Ray node did not come up; its log:\n{node.log.read_text()[-4000:]}")
            time.sleep(0.5)

    def request(self, path: str) -> Any:
        """GET ``path`` of the dashboard's REST API with the token; its JSON, or None if unreachable."""
        request = urllib.request.Request(self.dashboard_url + path, headers={"Authorization": f"Bearer {self.token_file.read_text()}"})
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return json.loads(response.read())
        except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError):
            return None

    def state(self, resource: str, **filters: str) -> list[dict[str, Any]]:
        """Ray's state API (``nodes``, ``actors``, ...) with equality filters, e.g. ``class_name="Server"``."""
        query = "&".join(f"filter_keys={k}&filter_predicates=%3D&filter_values={v}" for k, v in filters.items())
        answer = self.request(f"/api/v0/{resource}?limit=10000&detail=1&{query}")
        return [] if answer is None else answer["data"]["result"]["result"]

    def alive_nodes(self) -> list[dict[str, Any]]:
        return self.state("nodes", state="ALIVE")

    def shutdown(self) -> None:
        """Stop the worker nodes, then the head, then delete the cluster's directory."""
        for node in reversed(self.nodes):
            node.stop()
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> "LocalCluster":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.shutdown()
