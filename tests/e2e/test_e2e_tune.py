"""``fedray tune`` end to end on the session's real local Ray (4 logical CPUs): tiny digits trials of
1 worker each (2 CPUs with the driver's bundle), so two trials run side by side; the helpers and the
tiny base config the other ``test_e2e_tune_*`` modules share.

An interrupted sweep, stopped once with Ctrl+C (``fedray tune`` exits 130 with the resume command) and
once with SIGKILL, resumes twice without running a finished trial again, continues its unfinished
trial from its checkpoint and makes the ASHA decisions of an uninterrupted sweep
(``test_an_interrupted_then_killed_asha_sweep_resumes_with_the_decisions_of_an_uninterrupted_one``).

A sweep's directory (``meta.json``, ``sweep.yaml``, ``trials.parquet``, ``rounds.parquet``, one run
directory per trial in its own placement group, the best trial printed) is checked on the privacy
sweep (``test_e2e_tune_privacy_systems.py::test_a_sweep_writes_its_directory_and_prints_its_best_trial``),
and on the interrupted ASHA sweep here, stopped trials without ``summary.json`` and finished ones with it."""

from __future__ import annotations

import functools
import json
import operator
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace
from typing import TextIO

import pyarrow.parquet as pq
import pytest
import yaml

from child_signals import popen_interruptible
from fedray import load_config
from fedray.runtime import list_checkpoints
from fedray.tracking import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.ray]

REPO = Path(__file__).resolve().parents[2]

TINY_BASE = {
    "data": {"num_clients": 4, "alpha": 1.0},
    "train": {"rounds": 4, "clients_per_round": 4, "local_epochs": 1, "lr": 0.1},
    "checkpoint": {"every": 2},
    "resources": {"num_workers": 1, "cpus_per_worker": 1},
    "output": {"tensorboard": False, "plots": False},
}
TRIAL_COLUMNS = ["round", "latest_metric", "best_metric", "best_round", "wall_time_s", "run_dir", "error"]


def write_sweep(tmp_path: Path, **fields) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"base": TINY_BASE, "output": {"dir": str(tmp_path / "sweeps")}, **fields}))
    return path


def only_sweep_dir(tmp_path: Path) -> Path:
    [sweep_dir] = list((tmp_path / "sweeps").iterdir())
    return sweep_dir


def rows_by_trial(sweep_dir: Path) -> dict[str, dict]:
    return {row["trial_id"]: row for row in pq.read_table(sweep_dir / "trials.parquet").to_pylist()}


def assert_trials_match_their_runs(sweep_dir: Path, rounds_in: int) -> None:
    """Each trial's row in ``trials.parquet`` and its rows in ``rounds.parquet`` are what its run directory
    (``trials/<trial id>``) recorded: the same rounds and accuracies, its latest and best metric and best
    round, its config, a checkpoint; TERMINATED with a complete run directory (``summary.json``) when it
    ran all ``rounds_in`` rounds, else STOPPED_EARLY without one."""
    swept_keys = json.loads((sweep_dir / "meta.json").read_text())["swept_keys"]
    rounds = pq.read_table(sweep_dir / "rounds.parquet").to_pylist()
    for trial_id, row in rows_by_trial(sweep_dir).items():
        run_dir = sweep_dir / row["run_dir"]
        assert row["run_dir"] == f"trials/{trial_id}" and row["error"] is None
        engine_rows = read_metrics(run_dir, "round")
        reported = [r for r in rounds if r["trial_id"] == trial_id]
        assert [r["round"] for r in reported] == [r["round"] for r in engine_rows] == list(range(1, row["round"] + 1))
        accuracies = [r["test_accuracy"] for r in engine_rows]
        assert [r["test_accuracy"] for r in reported] == accuracies
        assert row["latest_metric"] == accuracies[-1] and row["best_metric"] == max(accuracies)
        assert accuracies[row["best_round"] - 1] == row["best_metric"]
        config = load_config(run_dir / "config.yaml").to_dict()
        for key in swept_keys:  # the trial ran with its swept values
            assert functools.reduce(operator.getitem, key.split("."), config) == row[key], key
        assert list_checkpoints(run_dir)
        assert row["status"] == ("TERMINATED" if row["round"] == rounds_in else "STOPPED_EARLY")
        # a finished trial's run directory is complete although ASHA ends every trial at its last report
        assert (run_dir / "summary.json").is_file() == (row["status"] == "TERMINATED")


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


HOLD_MODULE = "holdlab"
HOLD_CODE = textwrap.dedent("""
    import os
    import time

    from fedray import Callback


    class HoldTheThirdTrial(Callback):
        \"\"\"Holds the trial at learning rate 0.03 at the end of a round (its checkpoint and metrics row
        written, before Tune hears of the round) while the file "hold" exists in the test's folder,
        after creating "held" there: the test kills the sweep at a known point, without a race. The
        file "die" ends the held trial's process at once, as the OOM killer would: Ray's teardown of
        the killed driver's actors did not free its resources within 60 s while the trial was held
        (seen once in a full suite run).\"\"\"

        def on_round_end(self, run, row, client_rows):
            folder = run.run_dir.parents[3]  # <test folder>/sweeps/<sweep id>/trials/<trial id>
            if run.config.train.lr == 0.03 and (folder / "hold").exists():
                (folder / "held").touch()
                while (folder / "hold").exists():
                    if (folder / "die").exists():
                        os._exit(1)
                    time.sleep(0.05)
""")


def decisions(sweep_dir: Path) -> dict[str, tuple[str, int]]:
    """What the sweep decided for each trial: its status and its last reported round."""
    return {trial_id: (row["status"], row["round"]) for trial_id, row in rows_by_trial(sweep_dir).items()}


def uninterrupted_decisions(sweep_dir: Path) -> dict[str, tuple[str, int]]:
    """The decisions of an uninterrupted sweep: Tune's own ASHA, fresh, fed every trial's reported
    rounds in the order the trials ran (one at a time: trial ids are numbered in creation order).
    The engine is deterministic, so these are the metrics an uninterrupted sweep would report."""
    from ray.tune.schedulers import TrialScheduler

    from fedray.tune import load_sweep
    from fedray.tune.schedulers import make_scheduler

    spec = load_sweep(sweep_dir / "sweep.yaml")
    scheduler = make_scheduler(spec)
    scheduler.set_search_properties(spec.metric, spec.mode)
    rounds = pq.read_table(sweep_dir / "rounds.parquet").to_pylist()
    expected = {}
    for trial_id in sorted(rows_by_trial(sweep_dir)):
        trial = SimpleNamespace(trial_id=trial_id)
        scheduler.on_trial_add(None, trial)
        expected[trial_id] = ("RUNNING", 0)  # never stopped within the rounds it reported: a mismatch
        for row in sorted((r for r in rounds if r["trial_id"] == trial_id), key=lambda r: r["round"]):
            if scheduler.on_trial_result(None, trial, {"round": row["round"], spec.metric: row[spec.metric]}) == TrialScheduler.STOP:
                last = spec.trial_config({"train.lr": rows_by_trial(sweep_dir)[trial_id]["train.lr"]}).train.rounds
                expected[trial_id] = ("TERMINATED" if row["round"] == last else "STOPPED_EARLY", row["round"])
                break
    return expected


def files_and_times(run_dir: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir() if p.is_file()}


def test_an_interrupted_then_killed_asha_sweep_resumes_with_the_decisions_of_an_uninterrupted_one(ray_session, tmp_path, monkeypatch):
    # One `fedray tune` sweep, one trial at a time (one warm trial process), stopped twice and resumed
    # twice. ASHA's decisions then depend only on the (deterministic) metrics: the good trial (lr 0.1)
    # sets the rungs, the hopeless one (1e-6) is cut at round 1, and the third (0.03) is compared at
    # round 2 with the first. A resume whose ASHA had forgotten the rungs would let it run to the end.
    #   1. Ctrl+C (SIGINT) once two trials are done: `fedray tune` exits 130 with the resume command;
    #   2. `fedray tune --resume` continues the third trial, and is killed (SIGKILL: no clean-up, Tune's
    #      state as last saved) while that trial is held (HoldTheThirdTrial) after its first round in
    #      this driver, with a checkpoint: a known point, no race;
    #   3. `fedray tune --resume` again finishes the sweep: no finished trial is run again, the third
    #      continues from its checkpoint, and ASHA makes the decisions of an uninterrupted sweep.
    # The user code (the callback) ships in each driver's job runtime_env (`--address`).
    (tmp_path / f"{HOLD_MODULE}.py").write_text(HOLD_CODE)
    monkeypatch.syspath_prepend(str(tmp_path))  # this process reads the sweep file, which names it, too
    base = {**TINY_BASE, "checkpoint": {"every": 1}, "output": {**TINY_BASE["output"], "callbacks": [f"{HOLD_MODULE}:HoldTheThirdTrial"]}}
    write_sweep(
        tmp_path,
        name="asha",
        base=base,
        space={"train.lr": {"grid": [0.1, 1e-6, 0.03]}},
        scheduler={"type": "asha", "grace_period": 1, "reduction_factor": 2},
        max_concurrent_trials=1,
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_ADDRESS": "", "FEDRAY_SERVICE_DIR": str(tmp_path / "no-service")}
    address = ["--address", ray_session.get_runtime_context().gcs_address]
    sweeps = tmp_path / "sweeps"

    def start(log_name: str, *args: str) -> tuple[subprocess.Popen, TextIO]:
        log = open(tmp_path / log_name, "w")
        command = [sys.executable, "-m", "fedray.cli.main", "tune", *args, *address]
        return popen_interruptible(command, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT), log

    def stop_when(driver: subprocess.Popen, log: TextIO, condition, what: str, sig: signal.Signals) -> int:
        try:
            wait_for(lambda: condition() or driver.poll() is not None, 300, what)
            assert driver.poll() is None, (tmp_path / log.name).read_text()[-3000:]
            driver.send_signal(sig)
            return driver.wait(timeout=120)
        finally:
            if driver.poll() is None:
                driver.kill()
                driver.wait()
            log.close()

    def two_trials_done() -> bool:
        found = list(sweeps.iterdir()) if sweeps.is_dir() else []
        if not found or not (found[0] / "trials.parquet").is_file():
            return False
        return sum(row["status"] in ("TERMINATED", "STOPPED_EARLY") for row in rows_by_trial(found[0]).values()) >= 2

    # 1. interrupted (Ctrl+C)
    driver, log = start("interrupted.log", "sweep.yaml")
    assert (
        stop_when(driver, log, two_trials_done, "two trials of the sweep to finish", signal.SIGINT) == 130
    )  # as fedray run: a trial left unfinished
    sweep_dir = only_sweep_dir(tmp_path)
    printed = (tmp_path / "interrupted.log").read_text()
    resume = f"; continue with `fedray tune --resume {sweep_dir}`"
    assert re.search(r"fedray: interrupted with [1-9]\d* trial\(s\) unfinished" + re.escape(resume), printed), printed[-3000:]
    assert json.loads((sweep_dir / "meta.json").read_text())["status"] == "failed"
    at_interruption = decisions(sweep_dir)
    third = sorted(at_interruption)[-1] if len(at_interruption) == 3 else None
    assert third is None or at_interruption[third][0] in ("PENDING", "RUNNING")
    finished = [t for t, (status, _) in at_interruption.items() if status in ("TERMINATED", "STOPPED_EARLY")]
    finished_files = {t: files_and_times(sweep_dir / "trials" / t) for t in finished}

    # 2. resumed, then killed (SIGKILL) with the third trial held after a round
    (tmp_path / "hold").touch()
    driver, log = start("killed.log", "--resume", str(sweep_dir))
    held = lambda: (tmp_path / "held").is_file()  # noqa: E731
    assert stop_when(driver, log, held, "the third trial to be held", signal.SIGKILL) == -signal.SIGKILL
    # the held trial's process dies too (a machine's crash takes both), so it never runs past its
    # checkpoint; then Ray frees the dead driver's placement groups before the resume
    (tmp_path / "die").touch()
    wait_for(lambda: ray_session.available_resources().get("CPU") == 4.0, 120, "the killed sweep's resources")
    (tmp_path / "hold").unlink()
    (tmp_path / "die").unlink()
    [third_dir] = [d for d in (sweep_dir / "trials").iterdir() if d.name not in finished]
    at_kill = read_metrics(third_dir, "round")
    checkpointed = list_checkpoints(third_dir)[-1][0]
    assert checkpointed == at_kill[-1]["round"] < 4

    # 3. resumed to the end
    driver, log = start("resumed.log", "--resume", str(sweep_dir))
    try:
        assert driver.wait(timeout=300) == 0, (tmp_path / "resumed.log").read_text()[-3000:]
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        log.close()
    resumed = decisions(sweep_dir)
    assert resumed == uninterrupted_decisions(sweep_dir)
    by_lr = {rows_by_trial(sweep_dir)[t]["train.lr"]: decision for t, decision in resumed.items()}
    assert by_lr[0.1] == ("TERMINATED", 4) and by_lr[1e-6] == ("STOPPED_EARLY", 1)
    # the decision that needs the rungs recorded before both stops (else the test proves nothing)
    assert by_lr[0.03] == ("STOPPED_EARLY", 2)
    assert json.loads((sweep_dir / "meta.json").read_text())["status"] == "finished"
    # the finished trials were not run again after either stop: none of their files was rewritten
    assert {t: files_and_times(sweep_dir / "trials" / t) for t in finished} == finished_files
    # the killed driver's third trial continued from its checkpoint: the rounds up to it are the rows
    # written before the kill (a restart would have re-timed them), and no round is missing or duplicated
    after = read_metrics(third_dir, "round")
    assert after[:checkpointed] == at_kill and [r["round"] for r in after] == [1, 2]
    # the sweep's tables are its trials' runs, each round once across both resumes; the trial ASHA
    # let finish has a complete run directory (summary.json) although ASHA ended it at its last
    # report, the ones it stopped have none
    assert_trials_match_their_runs(sweep_dir, rounds_in=4)


# A trial whose config fails only inside the trial: tests/tune/test_tune_api.py::test_a_trial_that_fails_on_its_config_errors_once_and_is_listed
