"""cluster/README.md's "Trying job submission on one machine", run as written on a machine where
another Ray already holds Ray's default ports: a decoy head on 6379 (GCS), 8265 (dashboard) and
52365 (its dashboard agent) is started first, and must still be running after the walkthrough has
submitted its jobs and stopped its own head."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from fedray.runtime.processes import process_start_time, signal_processes
from fedray.testing.cluster import LocalNode

pytestmark = pytest.mark.xdist_group("clusters")  # one worker starts these clusters, one at a time (pytest -n)

REPO = Path(__file__).resolve().parents[2]
DECOY_PORTS = {"--port": 6379, "--dashboard-port": 8265}  # Ray's defaults; its agent takes 52365, also the default
CLIENT_VARIABLES = ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


def walkthrough_script() -> str:
    """The README section's bash block."""
    readme = (REPO / "cluster" / "README.md").read_text()
    section = readme.split("## Trying job submission on one machine", 1)[1].split("\n## ", 1)[0]
    [script] = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    return script


def adapted(script: str, temp_dir: Path, work: Path) -> str:
    """The walkthrough with only what a test must change: no install, its files under ``temp_dir``
    and ``work`` instead of /tmp and the repository, 2 rounds."""
    replacements = {
        "/tmp/ray-$(id -u)": str(temp_dir),
        "/tmp/ray-head-$(id -u).log": str(work / "head.log"),
        "train.rounds=5": "train.rounds=2",
        "$PWD/runs": str(work / "runs"),
        "ls runs/": f"ls {work / 'runs'}/",
    }
    for old, new in replacements.items():
        assert old in script, f"the walkthrough no longer has {old!r}: update this test"
        script = script.replace(old, new)
    lines = [line for line in script.splitlines() if not line.startswith("pip install")]
    return "set -euo pipefail\n" + "\n".join(lines) + "\n"


def port_is_free(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def processes_using(temp_dir: Path) -> list[tuple[int, int]]:
    """(pid, start time) of every process whose command line names ``temp_dir``: one Ray node's
    GCS, raylet, agents and workers all carry its temp or session dir."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and str(temp_dir).encode() in (entry / "cmdline").read_bytes():
                found.append((int(entry.name), process_start_time(int(entry.name))))
        except OSError:  # gone meanwhile
            continue
    return [(pid, start) for pid, start in found if start is not None]


def wait_until(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(1)
    return True


def dashboard_answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/version", timeout=5) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


@pytest.fixture
def decoy_ray(tmp_path):
    """Another user's Ray on Ray's default ports, with its own temp dir; stopped by its own pid."""
    taken = [port for port in DECOY_PORTS.values() if not port_is_free(port)]
    if taken:
        pytest.skip(f"Ray's default port(s) {taken} are already in use on this machine, so no decoy Ray can take them")
    temp_dir = Path(tempfile.mkdtemp(prefix="decoy-", dir="/tmp"))  # short: Ray's socket paths must stay < 108 bytes
    env = {key: value for key, value in os.environ.items() if key not in CLIENT_VARIABLES}
    env["HOME"] = str(tmp_path / "decoy-home")  # no ~/.ray/auth_token: the decoy runs without a token
    command = ["ray", "start", "--head", "--block", "--disable-usage-stats", "--num-cpus", "1", "--temp-dir", str(temp_dir)]
    for flag, port in DECOY_PORTS.items():
        command += [flag, str(port)]
    log = tmp_path / "decoy.log"
    with open(log, "w") as output:
        process = subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
    decoy = LocalNode(process, log)
    try:
        if not wait_until(lambda: process.poll() is not None or dashboard_answers(DECOY_PORTS["--dashboard-port"]), 180):
            pytest.fail(f"the decoy Ray did not come up; its log:\n{log.read_text()[-4000:]}")
        assert process.poll() is None, log.read_text()[-4000:]
        yield decoy, temp_dir
    finally:
        decoy.stop()
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.mark.slow
def test_the_walkthrough_works_beside_a_ray_on_the_default_ports(decoy_ray, tmp_path):
    decoy, decoy_temp_dir = decoy_ray
    decoy_core = [
        (pid, start) for pid, start in processes_using(decoy_temp_dir) if b"gcs_server" in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]
    assert decoy_core, "the decoy's GCS server is not running"
    work = tmp_path / "work"
    work.mkdir()
    temp_dir = Path(tempfile.mkdtemp(prefix="walk-", dir="/tmp"))
    env = {key: value for key, value in os.environ.items() if key not in CLIENT_VARIABLES}
    env["HOME"] = str(tmp_path / "home")  # `ray get-auth-token --generate` writes ~/.ray/auth_token
    try:
        result = subprocess.run(
            ["bash", "-c", adapted(walkthrough_script(), temp_dir, work)],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=1200,
            start_new_session=True,
        )
        transcript = f"stdout:\n{result.stdout[-6000:]}\nstderr:\n{result.stderr[-6000:]}"
        assert result.returncode == 0, transcript
        assert len(re.findall(r"^job raysubmit_\w+: SUCCEEDED$", result.stderr, flags=re.M)) == 2, transcript
        assert "no job agent" not in result.stderr, transcript
        listing = result.stdout.split("SUBMISSION ID", 1)[1]
        assert listing.count("SUCCEEDED") == 2 and "fedprox_digits.yaml" in listing and "moon_digits.yaml" in listing, transcript
        runs = sorted(path.name for path in (work / "runs").iterdir())
        assert len(runs) == 2 and all((work / "runs" / run / "metrics.parquet").exists() for run in runs), runs
        # `kill $HEAD_PID` stopped that head and everything it ran, and nothing of the decoy
        assert wait_until(lambda: not processes_using(temp_dir), 60), processes_using(temp_dir)
        assert decoy.process.poll() is None and all(process_start_time(pid) == start for pid, start in decoy_core)
        assert dashboard_answers(DECOY_PORTS["--dashboard-port"])
    finally:
        signal_processes(processes_using(temp_dir), signal.SIGKILL)  # what a failed script left behind, by pid
        shutil.rmtree(temp_dir, ignore_errors=True)
