"""``fedray up`` / ``fedray down`` on the paths that are not the happy one: two ``up`` at once, an
``up`` that dies or is stopped by a signal, a ``down`` that must stop what a dead service left and
nothing else, a run that joins a service whose head died, and what the service listens on.

Real processes throughout: the console entry point in subprocesses, a real Ray head, real signals.
The processes of a test's service are found, independently of fedray's own bookkeeping, by what
their environment holds: every process that a test's ``fedray`` commands start carries its
``FEDRAY_SERVICE_DIR``, and every process of a Ray head that ``fedray up`` starts carries
``RAY_AUTH_TOKEN_PATH=<service dir>/auth_token``. Whatever a failed test leaves is killed by that."""

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
from test_service import SMALL_RUN, fedray

from fedray.runtime.processes import is_running, process_tree
from fedray.runtime.service import STATE_FILE, ServiceState

pytestmark = pytest.mark.xdist_group("ray_heads")  # one worker starts these Ray heads, one at a time (pytest -n)

LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}


def _start_ticks(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


def _with_environment(entry: str) -> list[tuple[int, int]]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if entry.encode() in (proc / "environ").read_bytes().split(b"\0"):
                found.append((int(proc.name), _start_ticks(int(proc.name))))
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


@pytest.mark.slow
def test_two_ups_started_together_run_one_service_and_the_other_says_so(tmp_path):
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

        down = fedray("down", cwd=tmp_path, service_dir=service_dir)
        assert down.returncode == 0, down.stderr
        assert wait_until(lambda: not started_processes(service_dir), 30), started_processes(service_dir)  # nothing orphaned
    finally:
        if (service_dir / STATE_FILE).exists():
            fedray("down", cwd=tmp_path, service_dir=service_dir)
        kill_everything(service_dir)


@pytest.mark.slow
def test_the_service_listens_on_the_loopback_only(tmp_path):
    service_dir = tmp_path / "service"
    try:
        state = up_detached(service_dir, tmp_path)

        def sockets() -> list[tuple[str, int, str]]:
            pids = {pid for pid, _ in head_processes(service_dir)} | {state.pid}
            found = []
            for connection in psutil.net_connections(kind="inet"):
                listening = connection.status == psutil.CONN_LISTEN or (connection.type == 2 and connection.laddr)  # TCP, or bound UDP
                if connection.pid in pids and listening:
                    found.append((connection.laddr.ip, connection.laddr.port, " ".join(command_of(connection.pid))[:80]))
            return found

        agents = ("ray::DashboardAgent", "ray::RuntimeEnvAgent")  # they may come up after `up --detach` has returned

        def agents_up() -> bool:
            commands = " ".join(command for _, _, command in sockets())
            return all(name in commands for name in agents)

        def names() -> list[str]:  # what listens, and what of the head's runs (a failure's message)
            listening = sorted({command.split()[0].rsplit("/", 1)[-1] for _, _, command in sockets()})
            running = sorted({" ".join(command_of(pid))[:40].split()[0].rsplit("/", 1)[-1] for pid, _ in head_processes(service_dir)})
            return [f"listening: {listening}", f"running: {running}"]

        if not wait_until(agents_up, 300):
            pytest.fail("; ".join(names()))
        for _ in range(5):  # and a few seconds more, for a server that comes late
            listening = sockets()
            # GCS, raylet (2), Ray's dashboard (2), agents (3 or more), client server, autoscaler metrics, fedray's dashboard
            assert len(listening) >= 10, listening
            assert [entry for entry in listening if entry[0] not in LOOPBACK] == []
            time.sleep(2)
        assert any(port == int(state.ray_address.rsplit(":", 1)[1]) for _, port, _ in listening)  # the GCS is among them
    finally:
        fedray("down", cwd=tmp_path, service_dir=service_dir)
        kill_everything(service_dir)


@pytest.mark.slow
def test_a_fedray_up_killed_with_sigkill_takes_its_ray_head_with_it(tmp_path):
    service_dir = tmp_path / "service"
    try:
        state = up_detached(service_dir, tmp_path)
        head = head_processes(service_dir)
        assert len(head) > 3
        os.kill(state.pid, signal.SIGKILL)
        assert wait_until(lambda: not any(is_running(*p) for p in head), 90), [command_of(p)[:1] for p, _ in head if is_running(p, _)]
        down = fedray("down", cwd=tmp_path, service_dir=service_dir)  # the state file it could not remove
        assert down.returncode == 1
        assert down.stderr.splitlines()[0].endswith("is no longer running; removed its state file")
        assert not (service_dir / STATE_FILE).exists() and not Path(state.token_file).exists() and not Path(state.ray_temp_dir).exists()
    finally:
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
    """The OOM killer, or ``kill -9`` of both ``fedray up`` and ``ray start``: Ray's agents outlive them."""
    service_dir = tmp_path / "service"
    try:
        state = up_detached(service_dir, tmp_path)
        # `fedray up` frozen first: killed while running, it would have the kernel SIGTERM its head (PDEATHSIG),
        # and the head's clean stop could beat the SIGKILL below; its Ray processes would then all be gone.
        os.kill(state.pid, signal.SIGSTOP)
        os.kill(state.head_pid, signal.SIGKILL)
        os.kill(state.pid, signal.SIGKILL)
        time.sleep(5)
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
        ticks = [_start_ticks(process.pid) for process in bystanders]
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
