"""``fedray submit`` / ``fedray jobs`` without a cluster (a fake job client), and how a run's results
reach a ``output.dir`` URI (pyarrow's local filesystem, ``file://``)."""

from __future__ import annotations

import http.server
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import ray
from ray.job_submission import JobDetails, JobStatus

from child_signals import popen_interruptible
from fedray.cli.main import main
from fedray.cluster import jobs
from fedray.config import ConfigError
from fedray import load_config
from fedray.runtime.checkpoint import save_checkpoint
from fedray.runtime import list_checkpoints
from fedray.runtime.experiment import new_run_dir
from fedray.runtime.resume import SUBMIT_ADDRESS_VARIABLE, resume_command
from fedray.tracking.sync import StorageSync, is_uri, staging_root


REPO = Path(__file__).resolve().parents[2]


class FakeJobClient:
    """Stands in for ``JobSubmissionClient``; records what fedray asked of the job server."""

    instances: list["FakeJobClient"] = []
    final_status = JobStatus.SUCCEEDED

    def __init__(self, address, headers=None, **kwargs):
        self.address, self.headers = address, headers
        self.environment_at_connect = dict(os.environ)
        self.submitted: list[dict] = []
        self.stopped: list[str] = []
        FakeJobClient.instances.append(self)

    def submit_job(self, **kwargs):
        self.submitted.append(kwargs)
        return "raysubmit_fake"

    async def tail_job_logs(self, job_id):
        for chunk in ("round 1\n", "round 2\n"):
            yield chunk

    def get_job_status(self, job_id):
        return self.final_status

    def get_job_logs(self, job_id):
        return "all the logs\n"

    def list_jobs(self):
        return [
            JobDetails(
                type="SUBMISSION", submission_id="raysubmit_old", status=JobStatus.FAILED, entrypoint="fedray run a.yaml", start_time=1
            ),
            JobDetails(
                type="SUBMISSION", submission_id="raysubmit_new", status=JobStatus.RUNNING, entrypoint="fedray run b.yaml", start_time=2
            ),
        ]

    def stop_job(self, job_id):
        self.stopped.append(job_id)
        return True


@pytest.fixture
def fake_cluster(monkeypatch, tmp_path):
    """A fake job server; a working directory holding a valid config; no token anywhere."""
    FakeJobClient.instances = []
    FakeJobClient.final_status = JobStatus.SUCCEEDED
    monkeypatch.setattr(jobs, "JobSubmissionClient", FakeJobClient)
    for name in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    work = tmp_path / "work"
    (work / "configs").mkdir(parents=True)
    (work / "configs" / "run.yaml").write_text("train: {rounds: 2}\n")
    monkeypatch.chdir(tmp_path)
    return work


def submit(*args: str) -> int:
    return main(["submit", "--address", "http://127.0.0.1:8265", "--working-dir", "work", *args])


# ---------------------------------------------------------------- submit


def test_submit_uploads_the_working_dir_and_prints_the_job_id(fake_cluster, capsys):
    assert submit("--", "run", "work/configs/run.yaml", "--set", "output.dir=/shared/runs") == 0
    [client] = FakeJobClient.instances
    assert client.address == "http://127.0.0.1:8265"
    [job] = client.submitted
    assert shlex.split(job["entrypoint"]) == ["fedray", "run", "configs/run.yaml", "--set", "output.dir=/shared/runs"]
    assert job["runtime_env"]["working_dir"] == "work"
    assert {".git", "runs"} <= set(job["runtime_env"]["excludes"])
    assert job["runtime_env"]["env_vars"] == {"PYTHONUNBUFFERED": "1", "FEDRAY_SUBMIT_ADDRESS": "http://127.0.0.1:8265"}
    out = capsys.readouterr().out
    assert "submitted job raysubmit_fake" in out
    assert "follow it with: fedray jobs logs raysubmit_fake --follow --address http://127.0.0.1:8265" in out


def test_submit_passes_a_sweep_through_to_fedray_tune(fake_cluster):
    sweep = fake_cluster / "sweep.yaml"
    sweep.write_text("base: configs/run.yaml\nspace: {data.alpha: {grid: [0.1, 0.5]}}\n")
    assert submit("--", "tune", "work/sweep.yaml") == 0
    assert FakeJobClient.instances[0].submitted[0]["entrypoint"] == "fedray tune sweep.yaml"


def test_follow_streams_the_logs_and_exits_with_the_job_status(fake_cluster, capsys):
    assert submit("--follow", "--", "run", "work/configs/run.yaml") == 0
    assert "round 1\nround 2\n" in capsys.readouterr().out
    FakeJobClient.final_status = JobStatus.FAILED
    assert submit("--follow", "--", "run", "work/configs/run.yaml") == 1
    assert "FAILED" in capsys.readouterr().err


def test_an_invalid_config_fails_locally_before_any_connection(fake_cluster, capsys):
    assert submit("--", "run", "work/configs/run.yaml", "--set", "train.rounds=0") == 2
    assert "train.rounds" in capsys.readouterr().err
    assert FakeJobClient.instances == []


@pytest.mark.parametrize(
    "command, message",
    [
        ([], "nothing to submit"),
        (["--", "jobs", "list"], "runs on your machine"),
        (["--", "run", "outside.yaml"], "outside the working directory"),
    ],
)
def test_bad_commands_are_input_errors(fake_cluster, capsys, command, message):
    (fake_cluster.parent / "outside.yaml").write_text("seed: 1\n")
    assert submit(*command) == 2
    assert message in capsys.readouterr().err
    assert FakeJobClient.instances == []


def test_an_unknown_fedray_command_is_an_argument_error(fake_cluster):
    with pytest.raises(SystemExit) as exit_info:
        submit("--", "train", "work/configs/run.yaml")
    assert exit_info.value.code == 2
    assert FakeJobClient.instances == []


def test_a_relative_output_dir_draws_a_warning(fake_cluster, capsys):
    assert submit("--", "run", "work/configs/run.yaml") == 0
    assert "output.dir" in capsys.readouterr().err


@pytest.mark.slow
def test_a_submitted_run_that_stops_suggests_resubmitting_its_resume(tmp_path):
    """A run in a submitted job (``fedray submit`` sets FEDRAY_SUBMIT_ADDRESS) that is interrupted after
    a checkpoint suggests continuing it with `fedray submit --address ... -- run --resume` and the run
    directory's absolute path on the head node, not a `fedray run --resume` on the user's machine."""
    overrides = [
        "train.rounds=1000",
        "checkpoint.every=1",
        "resources.num_workers=1",
        "data.num_clients=4",
        "train.clients_per_round=2",
        "output.tensorboard=false",
        "output.plots=false",
        "output.name=run",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_ADDRESS": "", "FEDRAY_SUBMIT_ADDRESS": "http://head:8265"}
    process = popen_interruptible(  # stopped with SIGINT below
        [sys.executable, "-m", "fedray.cli.main", "run", "--quiet", *[a for o in overrides for a in ("--set", o)]],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 300
    while not list_checkpoints(tmp_path / "runs" / "run") and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr[-3000:]
    run_dir = (tmp_path / "runs" / "run").absolute()
    assert re.search(rf"with `fedray submit --address http://head:8265 -- run --resume {re.escape(str(run_dir))}`$", stderr.strip()), stderr


def test_outside_a_submitted_job_the_resume_is_a_local_command(monkeypatch):
    monkeypatch.delenv(SUBMIT_ADDRESS_VARIABLE, raising=False)
    assert resume_command("runs/my run") == "fedray run --resume 'runs/my run'"


# ---------------------------------------------------------------- address and authentication


def test_address_comes_from_the_environment_and_must_be_a_url(fake_cluster, monkeypatch, capsys):
    assert main(["jobs", "list"]) == 2
    assert "no cluster address" in capsys.readouterr().err
    monkeypatch.setenv("RAY_API_SERVER_ADDRESS", "http://head:8265")
    assert main(["jobs", "list"]) == 0
    assert FakeJobClient.instances[-1].address == "http://head:8265"
    assert main(["jobs", "list", "--address", "head:6379"]) == 2
    assert "dashboard's URL" in capsys.readouterr().err


def test_an_explicit_address_wins_over_ray_address(fake_cluster, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "http://other:8265")  # Ray's client would let this win
    assert main(["jobs", "list", "--address", "http://mine:8265"]) == 0
    [client] = FakeJobClient.instances
    assert client.address == "http://mine:8265"
    assert "RAY_ADDRESS" not in client.environment_at_connect
    assert os.environ["RAY_ADDRESS"] == "http://other:8265"  # restored


def test_the_token_is_read_like_ray_reads_it(fake_cluster, monkeypatch, tmp_path):
    assert jobs.auth_headers() == {}
    home_token = tmp_path / "home" / ".ray" / "auth_token"
    home_token.parent.mkdir(parents=True)
    home_token.write_text("from-home\n")
    assert jobs.auth_headers() == {"Authorization": "Bearer from-home"}
    path_token = tmp_path / "token"
    path_token.write_text("from-path")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(path_token))
    assert jobs.auth_headers() == {"Authorization": "Bearer from-path"}
    monkeypatch.setenv("RAY_AUTH_TOKEN", "from-env")
    assert jobs.auth_headers() == {"Authorization": "Bearer from-env"}
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    assert jobs.auth_headers() == {}


def test_token_mode_without_a_token_is_an_input_error(fake_cluster, monkeypatch, capsys):
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    assert main(["jobs", "list", "--address", "http://head:8265"]) == 2
    assert "ray get-auth-token" in capsys.readouterr().err


def test_the_token_reaches_the_job_server(fake_cluster, monkeypatch):
    monkeypatch.setenv("RAY_AUTH_TOKEN", "secret")
    assert main(["jobs", "list", "--address", "http://head:8265"]) == 0
    assert FakeJobClient.instances[0].headers == {"Authorization": "Bearer secret"}


def test_a_token_over_plain_http_to_another_machine_draws_a_warning(fake_cluster, monkeypatch, capsys):
    monkeypatch.setenv("RAY_AUTH_TOKEN", "secret")
    warned_for = {
        "http://head:8265": True,
        "http://10.0.0.5:8265": True,
        "http://127.0.0.1:8265": False,
        "http://localhost:8265": False,
        "https://head:8265": False,
    }
    for address, warned in warned_for.items():
        assert main(["jobs", "list", "--address", address]) == 0
        assert ("token is sent unencrypted over plain http://" in capsys.readouterr().err) == warned, address
    monkeypatch.delenv("RAY_AUTH_TOKEN")
    assert main(["jobs", "list", "--address", "http://head:8265"]) == 0
    assert "unencrypted" not in capsys.readouterr().err  # no token, nothing to warn about


# ---------------------------------------------------------------- jobs


def test_jobs_list_logs_stop(fake_cluster, capsys):
    assert main(["jobs", "list", "--address", "http://head:8265"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[:2] == ["raysubmit_new", "RUNNING"]  # newest first
    assert lines[2].split()[:2] == ["raysubmit_old", "FAILED"]
    assert main(["jobs", "logs", "raysubmit_new", "--address", "http://head:8265"]) == 0
    assert capsys.readouterr().out == "all the logs\n"
    assert main(["jobs", "stop", "raysubmit_new", "--address", "http://head:8265"]) == 0
    assert FakeJobClient.instances[-1].stopped == ["raysubmit_new"]


def test_an_unreachable_cluster_is_a_runtime_error(monkeypatch, capsys):
    def refuse(*args, **kwargs):
        raise ConnectionError("connection refused")

    monkeypatch.setattr(jobs, "JobSubmissionClient", refuse)
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    assert main(["jobs", "list", "--address", "http://127.0.0.1:9"]) == 1
    assert "cannot reach the Ray job server at http://127.0.0.1:9" in capsys.readouterr().err


class AgentlessJobServer(http.server.BaseHTTPRequestHandler):
    """Answers as Ray's job server does when its head's dashboard agent never started: the version
    check and the working directory's upload succeed, the submission is HTTP 500 with the text of
    ray/dashboard/modules/job/job_head.py (``JobHead.submit_job``)."""

    def do_GET(self):
        if self.path == "/api/version":
            self._answer(200, json.dumps({"version": "4", "ray_version": ray.__version__, "ray_commit": ray.__commit__}))
        else:  # /api/packages/gcs/<package>: not uploaded yet
            self._answer(404, "")

    def do_PUT(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self._answer(200, "")

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self._answer(500, "No available agent to submit job, please try again later.")

    def _answer(self, status: int, body: str) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args):
        pass


class DroppingJobServer(AgentlessJobServer):
    """A job server that closes the connection when the job is submitted (its head went away)."""

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.close_connection = True


def submit_to(server_class: type, monkeypatch, tmp_path) -> tuple[int, str]:
    """``fedray submit`` of a small run to a job server answering as ``server_class``: (exit code, address)."""
    for name in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "run.yaml").write_text("train: {rounds: 2}\n")
    monkeypatch.chdir(tmp_path)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), server_class)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    address = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        return main(
            ["submit", "--address", address, "--working-dir", "work", "--", "run", "work/run.yaml", "--set", "output.dir=/shared"]
        ), address
    finally:
        server.shutdown()
        server.server_close()


def test_a_job_server_without_an_agent_is_one_line_naming_the_cause_and_the_log(monkeypatch, tmp_path, capsys):
    """Ray's JobSubmissionClient turns the 500 into ``RuntimeError("Request failed with status code 500:
    No available agent to submit job, please try again later..")``; fedray says why that happens (the
    agent's port taken by another Ray) and which log shows it."""
    code, address = submit_to(AgentlessJobServer, monkeypatch, tmp_path)
    assert code == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"fedray: the job server at {address} has no job agent to run the job on"), line
    assert "another Ray on the head's machine holds the dashboard agent's port (52365" in line
    assert "dashboard_agent.log" in line and "session_latest/logs/" in line


def test_a_job_server_that_drops_the_submission_is_one_line(monkeypatch, tmp_path, capsys):
    code, address = submit_to(DroppingJobServer, monkeypatch, tmp_path)
    assert code == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"fedray: the job server at {address} broke off the request (") and "submit again" in line, line


# ---------------------------------------------------------------- results at a URI


def test_uri_output_dirs_are_recognised():
    assert is_uri("s3://bucket/runs") and is_uri("file:///tmp/runs") and is_uri("gs://b/x")
    assert not is_uri("runs") and not is_uri("/abs/runs") and not is_uri("C:/runs")


def test_a_uri_run_writes_to_the_staging_dir(tmp_path):
    config = load_config(None, ["output.dir=s3://bucket/runs", f"output.staging_dir={tmp_path}", "output.name=r"])
    assert new_run_dir(config) == tmp_path / "r"
    config.output.staging_dir = "s3://bucket/staging"
    with pytest.raises(ConfigError, match="output.staging_dir: must be a local path"):
        staging_root(config.output)


def test_an_unknown_filesystem_is_a_config_error():
    with pytest.raises(ConfigError, match="output.dir: 'nosuchfs://x/runs'"):
        StorageSync("nosuchfs://x/runs")


def test_sync_mirrors_the_run_dir_to_the_uri(tmp_path):
    run_dir = tmp_path / "staging" / "run"
    (run_dir / "client_state" / "0000001").mkdir(parents=True)
    (run_dir / "config.yaml").write_text("seed: 0\n")
    (run_dir / "metrics.parquet").write_bytes(b"rows of round 1")
    (run_dir / "client_state" / "0000001" / "r000001.pt").write_bytes(b"state 1")
    (run_dir / "half-written.pt.tmp").write_bytes(b"...")
    destination = tmp_path / "bucket" / "runs"
    sync = StorageSync(f"file://{destination}")
    sync.sync(run_dir)
    copied = destination / "run"
    assert (copied / "metrics.parquet").read_bytes() == b"rows of round 1"
    assert (copied / "client_state" / "0000001" / "r000001.pt").read_bytes() == b"state 1"
    assert not (copied / "half-written.pt.tmp").exists()

    (copied / "config.yaml").write_text("not copied again")  # unchanged locally since the last sync
    (run_dir / "client_state" / "0000001" / "r000001.pt").unlink()  # superseded state
    (run_dir / "client_state" / "0000001" / "r000002.pt").write_bytes(b"state 2")
    (run_dir / "metrics.parquet").write_bytes(b"rows of rounds 1-2")
    os.utime(run_dir / "metrics.parquet", ns=(1, 1))  # a changed mtime, whatever the clock resolution
    sync.sync(run_dir)
    assert (copied / "metrics.parquet").read_bytes() == b"rows of rounds 1-2"
    assert (copied / "client_state" / "0000001" / "r000002.pt").read_bytes() == b"state 2"
    assert not (copied / "client_state" / "0000001" / "r000001.pt").exists()
    assert (copied / "config.yaml").read_text() == "not copied again"


def test_sync_runs_after_each_checkpoint(tmp_path):
    from fedray.tracking import RunContext

    run_dir = tmp_path / "staging" / "run"
    run_dir.mkdir(parents=True)
    config = load_config()
    run = RunContext(config=config, run_dir=run_dir, data=None, server=None, start_round=0)
    sync = StorageSync(f"file://{tmp_path}/bucket")
    (run_dir / "metrics.parquet").write_bytes(b"round 1")
    sync.on_round_end(run, {"round": 1}, [])  # no checkpoint in round 1: nothing is copied
    assert not (tmp_path / "bucket" / "run").exists()
    save_checkpoint(run_dir, 2, {"server_state": {}, "state_versions": None}, keep=1)
    sync.on_round_end(run, {"round": 2}, [])
    assert (tmp_path / "bucket" / "run" / "checkpoints" / "round_000002.pt").is_file()
    assert (tmp_path / "bucket" / "run" / "metrics.parquet").read_bytes() == b"round 1"
    summary = {"rounds": 2}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    sync.sync(run_dir)
    assert json.loads((tmp_path / "bucket" / "run" / "summary.json").read_text()) == summary
