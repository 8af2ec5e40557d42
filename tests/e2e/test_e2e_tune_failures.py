"""``fedray tune`` when trials fail or the sweep is stopped (issue 42, items 5 and 7): real sweeps of
tiny digits trials, in a separate ``fedray tune`` process.

- a trial that diverges or whose plug-in algorithm raises fails the same way on every attempt: it
  ends at once with its one-line error in ``trials.parquet``, never retried despite ``max_failures``;
- an interrupted sweep exits 130, as an interrupted ``fedray run`` does, with the resume command.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from child_signals import popen_interruptible
from test_e2e_tune import TINY_BASE, only_sweep_dir, rows_by_trial, wait_for
from test_user_code import MODULE, USER_CODE

pytestmark = [pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


def fedray_tune(directory: Path, *args: str, **popen) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_ADDRESS": ""}
    return popen_interruptible([sys.executable, "-m", "fedray.cli.main", "tune", *args], cwd=directory, env=env, text=True, **popen)


def test_a_diverging_trial_and_a_failing_plugin_end_at_once_without_a_retry(tmp_path):
    (tmp_path / f"{MODULE}.py").write_text(USER_CODE)
    base = {**TINY_BASE, "train": {**TINY_BASE["train"], "rounds": 2, "local_epochs": 1}}
    sweep = {
        "name": "failing",
        "base": base,
        "max_failures": 2,
        "max_concurrent_trials": 1,
        "space": {"algorithm.name": {"grid": ["fedavg", f"{MODULE}:RaisesInClientUpdate"]}},
        "per_algorithm": {"fedavg": ["train.lr=1e6"]},  # every client update of round 1 is non-finite
        "output": {"dir": str(tmp_path / "sweeps")},
    }
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(sweep))
    process = fedray_tune(tmp_path, "sweep.yaml", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stdout, stderr = process.communicate(timeout=500)
    assert process.returncode == 1, (stdout[-2000:], stderr[-3000:])
    assert "fedray: 2 trial(s) errored" in stderr
    sweep_dir = only_sweep_dir(tmp_path)
    trials = {row["algorithm.name"]: row for row in rows_by_trial(sweep_dir).values()}
    assert {name: row["status"] for name, row in trials.items()} == {"fedavg": "ERROR", f"{MODULE}:RaisesInClientUpdate": "ERROR"}
    assert trials["fedavg"]["error"].startswith("round 1: all 4 client updates were non-finite (NaN/inf) and excluded")
    assert trials[f"{MODULE}:RaisesInClientUpdate"]["error"].startswith(
        f"algorithm {MODULE}:RaisesInClientUpdate: client_update (client 0, round 1) raised ValueError: no batch for client 0"
    )
    for row in trials.values():  # one attempt each: Tune saw a normal end, no error file, no retry
        assert not list((sweep_dir / "tune" / sweep_dir.name / row["trial_id"]).glob("error.*"))


@pytest.mark.ray
def test_an_interrupted_sweep_exits_130_with_the_resume_command(ray_session, tmp_path):
    base = {**TINY_BASE, "train": {**TINY_BASE["train"], "rounds": 200, "local_epochs": 1}, "checkpoint": {"every": 1}}
    (tmp_path / "sweep.yaml").write_text(
        yaml.safe_dump(
            {"name": "stopped", "base": base, "space": {"train.lr": {"grid": [0.1]}}, "output": {"dir": str(tmp_path / "sweeps")}}
        )
    )
    log = tmp_path / "fedray-tune.log"
    with open(log, "w") as output:
        process = fedray_tune(
            tmp_path, "sweep.yaml", "--address", ray_session.get_runtime_context().gcs_address, stdout=subprocess.DEVNULL, stderr=output
        )
        try:

            def a_round_reported() -> bool:
                assert process.poll() is None, log.read_text()[-3000:]
                sweeps = tmp_path / "sweeps"
                return sweeps.is_dir() and any(sweeps.iterdir()) and (only_sweep_dir(tmp_path) / "rounds.parquet").is_file()

            wait_for(a_round_reported, 240, "the trial's first round")
            process.send_signal(signal.SIGINT)
            process.wait(timeout=120)
        finally:
            if process.poll() is None:
                process.kill()
    stderr = log.read_text()
    assert process.returncode == 130, stderr[-3000:]
    sweep_dir = only_sweep_dir(tmp_path)
    assert f"fedray: interrupted with 1 trial(s) unfinished; continue with `fedray tune --resume {sweep_dir}`" in stderr
    assert pq.read_table(sweep_dir / "trials.parquet").column("status").to_pylist() != ["TERMINATED"]
