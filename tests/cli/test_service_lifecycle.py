"""``fedray up`` / ``fedray down`` on the paths that are not the happy one: two ``up`` at once, an
``up`` that dies or is stopped by a signal, a ``down`` that must stop what a dead service left and
nothing else, and a run that joins a service whose head died (what the service listens on:
test_service.py's up-run-down test).

Real processes throughout: the console entry point in subprocesses, a real Ray head, real signals;
a test's processes are found as service_helpers.py says."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from fedray.runtime.processes import is_running
from fedray.runtime.service import STATE_FILE, ServiceState
from service_helpers import (
    SMALL_RUN,
    command_of,
    environment,
    fedray,
    head_processes,
    kill_everything,
    start_ticks,
    start_up,
    started_processes,
    up_detached,
    wait_until,
)

pytestmark = pytest.mark.xdist_group("ray_heads")  # one worker starts these Ray heads, one at a time (pytest -n)


@pytest.mark.slow
def test_two_ups_started_together_run_one_service_which_sigkill_takes_down_with_its_head(tmp_path):
    """Two ``up --detach`` at once: one service runs and the other says so. Then the ``fedray up`` of
    that service dies by SIGKILL (the OOM killer) and takes its Ray head with it; ``down`` removes the
    state file it could not, and nothing either ``up`` started is left."""
    service_dir = tmp_path / "service"
    try:
        ups = [
            subprocess.Popen(
                [sys.executable, "-m", "fedray.cli.main", "up", "--detach", "--warm-workers", "0", "--num-cpus", "2"],
                cwd=tmp_path,
                env=environment(service_dir),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        results = [(up.wait(timeout=400), *up.communicate()) for up in ups]
        codes = sorted(code for code, _, _ in results)
        assert codes == [0, 2], results
        [(_, _, refused)] = [result for result in results if result[0] == 2]
        [line] = refused.strip().splitlines()  # the pid it names: the other `up`, or the service's process it started
        assert line.startswith(f"fedray: a local service is already starting or running in {service_dir} (pid ")
        assert line.endswith("); `fedray down` stops it")
        state = ServiceState.read(service_dir / STATE_FILE)
        assert state is not None and state.is_running()
        heads = [pid for pid, _ in head_processes(service_dir) if command_of(pid)[2:4] == ["start", "--head"]]
        assert heads == [state.head_pid]  # one Ray head, the one the state file records

        head = head_processes(service_dir)
        assert len(head) > 3
        os.kill(state.pid, signal.SIGKILL)
        assert wait_until(lambda: not any(is_running(*p) for p in head), 90), [command_of(p)[:1] for p, _ in head if is_running(p, _)]
        down = fedray("down", cwd=tmp_path, service_dir=service_dir)  # the state file it could not remove
        assert down.returncode == 1
        assert down.stderr.splitlines()[0].endswith("is no longer running; removed its state file")
        assert not (service_dir / STATE_FILE).exists() and not Path(state.token_file).exists() and not Path(state.ray_temp_dir).exists()
        assert wait_until(lambda: not started_processes(service_dir), 30), started_processes(service_dir)  # nothing orphaned
    finally:
        if (service_dir / STATE_FILE).exists():
            fedray("down", cwd=tmp_path, service_dir=service_dir)
        kill_everything(service_dir)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sig", "when"),
    # SIGTERM to a service that is up is what `fedray down` sends (test_service.py's up-run-down test)
    [(signal.SIGTERM, "starting"), (signal.SIGHUP, "up")],
    ids=["sigterm-while-starting", "sighup-when-up"],
)
def test_a_foreground_fedray_up_stopped_by_a_signal_stops_its_head(tmp_path, sig, when):
    """What ``timeout`` (SIGTERM) or a closed terminal (SIGHUP) does to a foreground ``fedray up``."""
    service_dir = tmp_path / "service"
    up = start_up(service_dir, tmp_path)
    try:
        if when == "starting":  # the head's raylet has started, its agents not all yet: before the state file
            assert wait_until(lambda: any("raylet" in " ".join(command_of(pid)[:1]) for pid, _ in head_processes(service_dir)), 300)
        else:
            assert wait_until(lambda: (service_dir / STATE_FILE).exists(), 300), up.stderr.read() if up.poll() is not None else ""
        os.kill(up.pid, sig)
        code = up.wait(timeout=120)
        stderr = up.stderr.read()
        assert code == 0, stderr
        assert "fedray: local service stopped (" in stderr
        assert wait_until(lambda: not head_processes(service_dir), 15), [command_of(p)[:2] for p, _ in head_processes(service_dir)]
        assert not (service_dir / STATE_FILE).exists()
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
        kill_everything(service_dir)


@pytest.mark.slow
def test_down_stops_what_a_service_killed_with_its_head_left(tmp_path):
    """The OOM killer, or ``kill -9`` of both ``fedray up`` and ``ray start``: what ``ray start`` started
    dies with it (Ray sets their parent-death signal), but their children, Ray's agents and dashboard
    modules, outlive it, and some do not exit by themselves."""
    service_dir = tmp_path / "service"
    try:
        state = up_detached(service_dir, tmp_path)
        # `fedray up` frozen first: killed while running, it would have the kernel SIGTERM its head (PDEATHSIG),
        # and the head's clean stop could beat the SIGKILL below; its Ray processes would then all be gone.
        # The head's processes are frozen too: left running, those that outlive `ray start` notice it is
        # gone and exit within seconds, sooner or later depending on the machine's load. Frozen, they outlive
        # it for sure, and `fedray down` must stop processes that ignore its SIGTERM.
        os.kill(state.pid, signal.SIGSTOP)
        for pid, _ in head_processes(service_dir):
            if pid != state.head_pid:
                os.kill(pid, signal.SIGSTOP)
        os.kill(state.head_pid, signal.SIGKILL)
        os.kill(state.pid, signal.SIGKILL)
        time.sleep(1)
        left = head_processes(service_dir)
        assert left, "nothing outlived ray start: the case this test is about did not happen"
        down = fedray("down", cwd=tmp_path, service_dir=service_dir)
        assert down.returncode == 0, down.stderr
        [line] = down.stdout.strip().splitlines()
        assert re.fullmatch(
            rf"fedray: the local service was not running: its `fedray up` process, pid {state.pid}, is gone; "
            r"stopped the [1-9]\d* Ray processes it left",
            line,
        ), line
        assert not any(is_running(*p) for p in left)
        assert not (service_dir / STATE_FILE).exists() and not Path(state.token_file).exists() and not Path(state.ray_temp_dir).exists()
    finally:
        kill_everything(service_dir)


def test_down_acts_only_on_processes_and_a_temp_dir_that_are_the_services(tmp_path):
    """A state file (damaged, or another program's) that names live processes of someone else and a
    folder of the user's: ``fedray down`` signals none of them and removes nothing of theirs."""
    service_dir = tmp_path / "service"
    service_dir.mkdir()
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "thesis.tex").write_text("years of work")
    bystanders = [subprocess.Popen(["sleep", "600"]) for _ in range(2)]
    try:
        ticks = [start_ticks(process.pid) for process in bystanders]
        state = ServiceState(
            pid=bystanders[0].pid,
            pid_start=ticks[0],
            head_pid=bystanders[1].pid,
            head_start=ticks[1],
            ray_address="127.0.0.1:1",
            job_server_url="http://127.0.0.1:1",
            dashboard_url="http://127.0.0.1:2/",
            results_dir=str(tmp_path),
            ray_temp_dir=str(precious),
            token_file=str(service_dir / "auth_token"),
            num_cpus=1,
            started="2026-01-01T00:00:00+00:00",
        )
        state.write(service_dir / STATE_FILE)
        down = fedray("down", cwd=tmp_path, service_dir=service_dir)
        assert down.returncode == 1, down.stdout + down.stderr
        assert down.stderr.splitlines() == [
            f"fedray: the local service recorded in {service_dir / STATE_FILE} is no longer running; removed its state file",
            "fedray: no local service is running (`fedray up` starts one)",
        ]
        time.sleep(1)
        assert all(process.poll() is None for process in bystanders)
        assert (precious / "thesis.tex").read_text() == "years of work"
    finally:
        for process in bystanders:
            process.kill()
            process.wait()


@pytest.mark.slow
def test_a_run_on_a_service_whose_ray_head_died_says_so_in_one_line(tmp_path):
    service_dir = tmp_path / "service"
    try:
        state = up_detached(service_dir, tmp_path)
        os.kill(state.pid, signal.SIGSTOP)  # `fedray up` has not noticed yet (it would stop the service)
        [gcs] = [pid for pid, _ in head_processes(service_dir) if command_of(pid)[0].endswith("/gcs_server")]
        os.kill(gcs, signal.SIGTERM)  # `ray start --block` takes a SIGTERM'd GCS for a graceful exit and keeps running
        assert wait_until(lambda: not psutil.pid_exists(gcs) or psutil.Process(gcs).status() == psutil.STATUS_ZOMBIE, 30)
        env = environment(service_dir)
        try:
            run = subprocess.run(
                [sys.executable, "-m", "fedray.cli.main", "run", *SMALL_RUN, "--set", "resources.num_workers=2"],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=150,
            )
        except subprocess.TimeoutExpired as error:
            pytest.fail(f"the run waited for the dead head for minutes: {str(error.stderr)[-500:]}")
        assert run.returncode == 1, run.stderr
        assert run.stderr.strip().splitlines() == [
            f"fedray: the local service at {state.ray_address} (`fedray up`, pid {state.pid}) has no Ray any more: "
            f"its Ray head's gcs_server (pid {gcs}) is gone; `fedray down` stops what is left, `fedray up` starts a new one"
        ]
        os.kill(state.pid, signal.SIGCONT)  # now it notices, and stops what is left of its head
        assert wait_until(lambda: not is_running(state.pid, state.pid_start), 120)
        assert wait_until(lambda: not head_processes(service_dir), 15)
        assert f"its gcs_server (pid {gcs}) exited" in (service_dir / "service.log").read_text()
        assert not (service_dir / STATE_FILE).exists()
    finally:
        kill_everything(service_dir)


@pytest.mark.parametrize(("raylet", "kept"), [("starting", True), ("without the call", False)])
def test_a_raylet_that_does_not_answer_yet_is_asked_again_for_warm_workers(tmp_path, raylet, kept):
    """The first ``PrestartWorkers`` call can come before the raylet's port opens (about one ``fedray up``
    in two on a loaded machine): the service asks again after the pause instead of keeping no worker
    warm for its whole life. A raylet that answers but lacks the call switches warm workers off. Real
    gRPC: a port nothing listens on, and a gRPC server with no services."""
    from concurrent import futures

    import grpc

    from fedray.runtime.processes import free_port
    from fedray.runtime.service import LocalService

    service = LocalService(tmp_path / "runs", num_cpus=2, warm_workers=3, directory=tmp_path / "service")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    service.node_manager_port = free_port() if raylet == "starting" else server.add_insecure_port("127.0.0.1:0")
    server.start()
    service.head = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # no raylet under it: 0 workers
    try:
        service._prestart = service._prestart_rpc("token")
        service.keep_warm()
        assert (service._prestart is not None) == kept
        assert service._next_refill > time.monotonic()  # looked at again after the pause, not at once
    finally:
        service.head.kill()
        service._channel.close()
        server.stop(None)
