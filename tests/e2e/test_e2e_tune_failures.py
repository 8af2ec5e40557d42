"""``fedray tune`` when trials fail (issue 42, item 5): one real sweep of tiny digits trials that all
fail, in a separate ``fedray tune`` process (its exit code and what reaches its terminal are the
point) joined to the session's Ray with ``--address`` (the user code still ships in the job's
runtime_env).

- a trial that diverges or whose plug-in algorithm raises fails the same way on every attempt: it
  ends at once with its one-line error in ``trials.parquet``, never retried despite ``max_failures``;
- a trial that is killed (the OOM killer, ``kill -9``: its worker process dies by SIGKILL in its first
  client update, past ``resources.max_worker_restarts``, here 0) gives the terminal no Ray traceback (Tune's
  ``Trial task failed`` with the 20 lines of ``ActorDiedError``): its one-line error in the table
  and in ``trials.parquet``, its whole trace in Tune's ``error.txt``;
- with no trial that succeeded, the top-trials table is one line saying so, not pandas' dump of an
  empty frame.

(An interrupted sweep exiting 130 with the resume command is proven by
``test_e2e_tune.py::test_an_interrupted_then_killed_asha_sweep_resumes_with_the_decisions_of_an_uninterrupted_one``.)
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from test_e2e_tune import TINY_BASE, only_sweep_dir, rows_by_trial
from test_user_code import MODULE, USER_CODE

# one sweep for the module's tests: on one process under pytest -n
pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.xdist_group("tune_failing_sweep")]
REPO = Path(__file__).resolve().parents[2]
KILLED_MODULE = "killedlab"
KILLED_CODE = textwrap.dedent("""
    import os
    import signal

    from fedray.algorithms.fedavg import FedAvg


    class KilledInClientUpdate(FedAvg):
        name = "killed_in_client_update"

        def client_update(self, ctx, broadcast):
            os.kill(os.getpid(), signal.SIGKILL)  # the worker's process, each time it is restarted
""")
DIVERGES = "fedavg"
RAISES = f"{MODULE}:RaisesInClientUpdate"
KILLED = f"{KILLED_MODULE}:KilledInClientUpdate"


@pytest.fixture(scope="module")
def failing_sweep(ray_session, tmp_path_factory):
    """``fedray tune`` of three trials, one at a time, that all fail: one diverges, one's plug-in raises,
    one's worker is killed (no replacement: ``max_worker_restarts: 0``, so each attempt starts one
    worker). ``max_failures: 1``: a crash (the killed trial) is retried once; the deterministic
    failures must not be."""
    directory = tmp_path_factory.mktemp("failing")
    (directory / f"{MODULE}.py").write_text(USER_CODE)
    (directory / f"{KILLED_MODULE}.py").write_text(KILLED_CODE)
    base = {
        **TINY_BASE,
        "train": {**TINY_BASE["train"], "rounds": 2},
        "resources": {**TINY_BASE["resources"], "max_worker_restarts": 0},
    }
    sweep = {
        "name": "failing",
        "base": base,
        "max_failures": 1,
        "max_concurrent_trials": 1,
        "space": {"algorithm.name": {"grid": [DIVERGES, RAISES, KILLED]}},
        "per_algorithm": {DIVERGES: ["train.lr=1e6"]},  # every client update of round 1 is non-finite
        "output": {"dir": str(directory / "sweeps")},
    }
    (directory / "sweep.yaml").write_text(yaml.safe_dump(sweep))
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_ADDRESS": "", "FEDRAY_SERVICE_DIR": str(directory / "no-service")}
    address = ray_session.get_runtime_context().gcs_address
    result = subprocess.run(
        [sys.executable, "-m", "fedray.cli.main", "tune", "sweep.yaml", "--address", address],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=500,
    )
    sweep_dir = only_sweep_dir(directory)
    trials = {row["algorithm.name"]: row for row in rows_by_trial(sweep_dir).values()}
    return result, sweep_dir, trials


def test_a_diverging_trial_and_a_failing_plugin_end_at_once_without_a_retry(failing_sweep):
    result, sweep_dir, trials = failing_sweep
    assert result.returncode == 1, (result.stdout[-2000:], result.stderr[-3000:])
    assert "fedray: 3 trial(s) errored" in result.stderr
    assert {name: row["status"] for name, row in trials.items()} == {DIVERGES: "ERROR", RAISES: "ERROR", KILLED: "ERROR"}
    assert trials[DIVERGES]["error"].startswith("round 1: all 4 client updates were non-finite (NaN/inf) and excluded")
    assert trials[RAISES]["error"].startswith(
        f"algorithm {RAISES}: client_update (client 0, round 1) raised ValueError: no batch for client 0"
    )
    for name in (DIVERGES, RAISES):  # one attempt each: Tune saw a normal end, no error file, no retry
        assert not list((sweep_dir / "tune" / sweep_dir.name / trials[name]["trial_id"]).glob("error.*"))
    # the contrast that makes the check above mean something: Tune saw the killed trial crash
    assert list((sweep_dir / "tune" / sweep_dir.name / trials[KILLED]["trial_id"]).glob("error.*"))


def test_a_killed_trial_prints_no_ray_traceback(failing_sweep):
    result, sweep_dir, trials = failing_sweep
    assert "Traceback" not in result.stderr and "Trial task failed" not in result.stderr, result.stderr[-3000:]
    assert "ActorDiedError" not in result.stderr
    assert f"fedray: 3 trial(s) errored: see the table above and the error column of {sweep_dir / 'trials.parquet'}" in result.stderr
    killed = trials[KILLED]  # with its one-line error: the worker's death, not a pointer to error.txt
    assert killed["error"].startswith("fedray.runtime.errors.RunError: worker 0 died"), killed["error"]
    listed = result.stdout.split("errored trials", 1)[1]
    assert all(row["trial_id"] in listed for row in trials.values())


def test_no_trial_succeeded_is_one_line_not_a_pandas_dump(failing_sweep):
    result, _, _ = failing_sweep
    assert "Empty DataFrame" not in result.stdout and "Columns: [" not in result.stdout, result.stdout
    assert "no trial reported a result" in result.stdout
    assert "no trial finished with a value of test_accuracy (3 of 3 errored: see below)" in result.stdout
