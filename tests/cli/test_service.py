"""``fedray up`` / ``fedray down``: a real local Ray head and the dashboard, used by ``fedray run`` and
``fedray jobs`` through the real console entry point in subprocesses, each test with its own service
directory (``$FEDRAY_SERVICE_DIR``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from fedray.runtime.processes import is_running, process_start_time, process_tree
from fedray.runtime.service import STATE_FILE, ServiceState, worker_processes
from service_helpers import LOOPBACK, SMALL_RUN, command_of, environment, fedray, head_processes, listening_sockets, wait_until

pytestmark = pytest.mark.xdist_group("ray_heads")  # one worker starts these Ray heads, one at a time (pytest -n)

#: A driver that joins the service of the state file argv[1], waits 3 s, and prints the head's worker processes by state.
JOIN_AND_COUNT_WORKERS = """
import json, sys, time
from pathlib import Path
import ray
from fedray.runtime.service import ServiceState, connect_environment, worker_processes
state = ServiceState.read(Path(sys.argv[1]))
connect_environment(state)
ray.init(address=state.ray_address, logging_level="ERROR")
time.sleep(3)
print(json.dumps(worker_processes(state.head_pid)))
"""


def driver_node_id(run_dir: Path) -> str:
    return json.loads((run_dir / "workers.json").read_text())["driver_node_id"]


def run_dir_of(result: subprocess.CompletedProcess[str], cwd: Path) -> Path:
    return cwd / next(line.split()[-1] for line in result.stdout.splitlines() if line.startswith("run directory"))


@pytest.mark.slow
def test_up_run_uses_the_service_and_down_stops_exactly_it(tmp_path):
    service_dir = tmp_path / "service"
    decoy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    try:
        up = fedray("up", "--detach", "--results", "runs", cwd=tmp_path, service_dir=service_dir)
        assert up.returncode == 0, up.stdout + up.stderr
        state = ServiceState.read(service_dir / STATE_FILE)
        assert state is not None and state.is_running()
        assert f"ray        {state.ray_address}" in up.stdout and state.dashboard_url in up.stdout
        assert state.ray_address.startswith("127.0.0.1:") and state.dashboard_url.startswith("http://127.0.0.1:")
        assert Path(state.results_dir) == (tmp_path / "runs").resolve()
        assert oct(os.stat(state.token_file).st_mode & 0o777) == "0o600"
        with urllib.request.urlopen(state.dashboard_url + "api/overview", timeout=30) as response:  # the dashboard serves the folder
            assert response.status == 200

        again = fedray("up", "--detach", cwd=tmp_path, service_dir=service_dir)  # one service per directory
        assert again.returncode == 2 and f"already starting or running in {service_dir} (pid {state.pid})" in again.stderr

        # it listens on the loopback only; the agents may come up after `up --detach` has returned
        agents = ("ray::DashboardAgent", "ray::RuntimeEnvAgent")

        def agents_up() -> bool:
            commands = " ".join(command for _, _, command in listening_sockets(service_dir, state))
            return all(name in commands for name in agents)

        def names() -> str:  # what listens, and what of the head's runs (a failure's message)
            listening = sorted({command.split()[0].rsplit("/", 1)[-1] for _, _, command in listening_sockets(service_dir, state)})
            running = sorted({" ".join(command_of(pid))[:40].split()[0].rsplit("/", 1)[-1] for pid, _ in head_processes(service_dir)})
            return f"listening: {listening}; running: {running}"

        assert wait_until(agents_up, 300), names()
        for _ in range(5):  # and a few seconds more, for a server that comes late
            listening = listening_sockets(service_dir, state)
            # GCS, raylet (2), Ray's dashboard (2), agents (3 or more), client server, autoscaler metrics, fedray's dashboard
            assert len(listening) >= 10, listening
            assert [entry for entry in listening if entry[0] not in LOOPBACK] == []
            time.sleep(2)
        assert any(port == int(state.ray_address.rsplit(":", 1)[1]) for _, port, _ in listening)  # the GCS is among them

        # No idle cost: a driver that joins makes Ray start no worker beyond the service's warm ones, which
        # its actors take (Ray prestarts a worker per CPU for a head's first driver, unless told not to;
        # booting beside the first run's actors, they took its first rounds' CPU)
        warm = state.num_cpus + 1  # fedray up's default --warm-workers
        assert wait_until(lambda: worker_processes(state.head_pid) == {"booting": 0, "idle": warm, "busy": 0}, 300), (
            worker_processes(state.head_pid),
            names(),
        )
        joined = subprocess.run(
            [sys.executable, "-c", JOIN_AND_COUNT_WORKERS, str(service_dir / STATE_FILE)],
            env=environment(service_dir),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert joined.returncode == 0, joined.stderr[-3000:]
        assert json.loads(joined.stdout) == {"booting": 0, "idle": warm, "busy": 0}

        runs = [fedray("run", *SMALL_RUN, "--set", "resources.num_workers=2", cwd=tmp_path, service_dir=service_dir) for _ in range(2)]
        for result in runs:
            assert result.returncode == 0, result.stderr
            assert f"fedray: using the local service at {state.ray_address}  (fedray down stops it)" in result.stderr
        nodes = {driver_node_id(run_dir_of(result, tmp_path)) for result in runs}
        assert len(nodes) == 1  # both runs on the same Ray: the service's head, no Ray started per run
        assert is_running(state.head_pid, state.head_start)

        # backend auto with one worker runs in the driver's process, without Ray: the service is not used
        local = fedray("run", *SMALL_RUN, "--set", "resources.num_workers=1", cwd=tmp_path, service_dir=service_dir)
        assert local.returncode == 0, local.stderr
        assert "using the local service" not in local.stderr and "local backend, no Ray" in local.stdout

        too_big = fedray("run", *SMALL_RUN, "--set", "resources.num_workers=64", cwd=tmp_path, service_dir=service_dir)
        assert too_big.returncode == 2
        assert "invalid config:\n  resources.num_workers:" in too_big.stderr and "the local service has" in too_big.stderr

        jobs = fedray("jobs", "list", cwd=tmp_path, service_dir=service_dir)  # its job server, with its token
        assert jobs.returncode == 0, jobs.stderr
        assert f"using the local service at {state.job_server_url}" in jobs.stderr

        head = process_tree(state.head_pid)
        assert len(head) > 3  # ray start, GCS, raylet, dashboard, agents, warm workers
        down = fedray("down", cwd=tmp_path, service_dir=service_dir)
        assert down.returncode == 0, down.stderr
        assert f"stopped the local service: Ray at {state.ray_address}" in down.stdout
        assert not any(is_running(pid, start) for pid, start in head)
        assert not is_running(state.pid, state.pid_start)
        assert not (service_dir / STATE_FILE).exists() and not Path(state.token_file).exists()
        assert not Path(state.ray_temp_dir).exists()
        assert decoy.poll() is None  # an unrelated process is left alone

        second = fedray("down", cwd=tmp_path, service_dir=service_dir)
        assert second.returncode == 1
        assert second.stderr.strip().splitlines() == ["fedray: no local service is running (`fedray up` starts one)"]
    finally:
        state = ServiceState.read(service_dir / STATE_FILE)
        if state is not None:  # a failed assertion must not leave the service behind
            fedray("down", cwd=tmp_path, service_dir=service_dir)
        decoy.kill()
        decoy.wait()


def test_a_stale_state_file_is_ignored_with_a_note_and_removed(tmp_path):
    service_dir = tmp_path / "service"
    service_dir.mkdir()
    gone = subprocess.Popen(["sleep", "0"])
    start = process_start_time(gone.pid)
    gone.wait()
    stale = ServiceState(
        pid=gone.pid,
        pid_start=start or 1,
        head_pid=gone.pid,
        head_start=start or 1,
        ray_address="127.0.0.1:1",
        job_server_url="http://127.0.0.1:1",
        dashboard_url="http://127.0.0.1:2/",
        results_dir=str(tmp_path),
        ray_temp_dir=str(tmp_path / "ray"),
        token_file=str(service_dir / "auth_token"),
        num_cpus=1,
        started="2026-01-01T00:00:00+00:00",
    )
    stale.write(service_dir / STATE_FILE)
    state_path = service_dir / STATE_FILE

    jobs = fedray("jobs", "list", cwd=tmp_path, service_dir=service_dir)  # no address, no service: refused (exit 2)
    assert jobs.returncode == 2
    assert jobs.stderr.splitlines()[0] == f"fedray: the local service recorded in {state_path} is no longer running; removed its state file"
    assert not state_path.exists()

    state_path.write_text("{not json")  # a damaged file is stale too
    down = fedray("down", cwd=tmp_path, service_dir=service_dir)
    assert down.returncode == 1
    assert down.stderr.splitlines() == [
        f"fedray: the local service recorded in {state_path} is no longer running; removed its state file",
        "fedray: no local service is running (`fedray up` starts one)",
    ]
    assert not state_path.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--num-cpus", "0"], "--num-cpus: expected at least 1, got 0"),
        (["--warm-workers", "-1"], "--warm-workers: expected 0 or more, got -1"),
        (["--dashboard-port", "70000"], "--dashboard-port: expected 0 to 65535, got 70000"),
    ],
)
def test_up_refuses_bad_options_before_starting_anything(tmp_path, args, message):
    result = fedray("up", *args, cwd=tmp_path, service_dir=tmp_path / "service")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"fedray: {message}"]
    assert not (tmp_path / "service").exists() and not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_up_on_a_busy_dashboard_port_is_one_line_exit_2_and_stops_what_it_started(tmp_path):
    import socket

    service_dir = tmp_path / "service"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = fedray("up", "--dashboard-port", str(port), "--warm-workers", "0", cwd=tmp_path, service_dir=service_dir)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert f"fedray: the dashboard cannot listen on 127.0.0.1:{port} (Address already in use); pick another port" in result.stderr
    assert "fedray: local service stopped" in result.stderr
    assert not (service_dir / STATE_FILE).exists()
