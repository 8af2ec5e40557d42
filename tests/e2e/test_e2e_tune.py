"""``fedray tune`` end to end on the session's real local Ray (4 logical CPUs): tiny digits trials of
1 worker each (2 CPUs with the driver's bundle), so two trials run side by side; the helpers and the
tiny base config the other ``test_e2e_tune_*`` modules share.

A sweep's directory (``meta.json``, ``sweep.yaml``, ``trials.parquet``, ``rounds.parquet``, one run
directory per trial in its own placement group, the best trial printed) is checked on the privacy
sweep (``test_e2e_tune_privacy_systems.py::test_a_sweep_writes_its_directory_and_prints_its_best_trial``),
and on an ASHA sweep, stopped trials without ``summary.json`` and finished ones with it
(``test_e2e_tune_schedulers.py::test_a_resumed_asha_sweep_makes_the_decisions_of_an_uninterrupted_one``)."""

from __future__ import annotations

import functools
import json
import operator
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from fedray import load_config
from fedray.cli.main import main
from fedray.runtime import list_checkpoints
from fedray.tracking import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.ray]

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


def test_killed_sweep_resumes_without_rerunning_finished_trials(ray_session, tmp_path):
    # A short and a long trial side by side; the sweep's driver is SIGKILLed once the short one has
    # finished and the long one is mid-run with a checkpoint, then `fedray tune --resume` finishes it.
    # The long trial starts no earlier than the short one (grid order), so at the kill it is a round or
    # two past the short one's 2: 8 rounds leave it mid-run (asserted below).
    long_rounds = 8
    base = {**TINY_BASE, "checkpoint": {"every": 1}}
    sweep_file = write_sweep(tmp_path, name="killed", base=base, space={"train.rounds": {"grid": [2, long_rounds]}})
    log = open(tmp_path / "fedray-tune.log", "w")
    driver = subprocess.Popen(
        [sys.executable, "-m", "fedray.cli.main", "tune", str(sweep_file), "--address", ray_session.get_runtime_context().gcs_address],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:

        def short_done_and_long_checkpointed() -> bool:
            sweeps = tmp_path / "sweeps"
            if not sweeps.is_dir() or not any(sweeps.iterdir()) or not (only_sweep_dir(tmp_path) / "trials.parquet").is_file():
                return False
            trials = rows_by_trial(only_sweep_dir(tmp_path)).values()
            short = [t for t in trials if t["train.rounds"] == 2 and t["status"] == "TERMINATED"]
            long = [t for t in trials if t["train.rounds"] == long_rounds]
            return bool(short and long and list_checkpoints(only_sweep_dir(tmp_path) / long[0]["run_dir"]))

        wait_for(short_done_and_long_checkpointed, 240, "the short trial to finish and the long one to checkpoint")
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        log.close()
    sweep_dir = only_sweep_dir(tmp_path)
    trials = rows_by_trial(sweep_dir)
    short_id = next(t for t, row in trials.items() if row["train.rounds"] == 2)
    long_id = next(t for t, row in trials.items() if row["train.rounds"] == long_rounds)
    short_files = {p.name: p.stat().st_mtime_ns for p in (sweep_dir / "trials" / short_id).iterdir() if p.is_file()}
    # the killed driver's trials are torn down by Ray (their placement groups freed) before resuming
    wait_for(lambda: ray_session.available_resources().get("CPU") == 4.0, 60, "the killed sweep's resources")
    long_dir = sweep_dir / "trials" / long_id
    checkpointed = list_checkpoints(long_dir)[-1][0]
    assert checkpointed < long_rounds, "the long trial finished before the kill; make it longer"
    before = {r["round"]: r for r in read_metrics(long_dir, "round") if r["round"] <= checkpointed}

    assert main(["tune", "--resume", str(sweep_dir)]) == 0

    trials = rows_by_trial(sweep_dir)
    assert {t: (row["status"], row["round"]) for t, row in trials.items()} == {
        short_id: ("TERMINATED", 2),
        long_id: ("TERMINATED", long_rounds),
    }
    assert json.loads((sweep_dir / "meta.json").read_text())["status"] == "finished"
    # the finished trial was not run again: none of its files was rewritten
    assert {p.name: p.stat().st_mtime_ns for p in (sweep_dir / "trials" / short_id).iterdir() if p.is_file()} == short_files
    # the long trial continued from its checkpoint: the rounds before it are the original rows
    # (a restart would have re-timed them), and no round is missing or duplicated
    after = read_metrics(long_dir, "round")
    assert [r["round"] for r in after] == list(range(1, long_rounds + 1))
    assert [r["seconds"] for r in after[:checkpointed]] == [before[r]["seconds"] for r in range(1, checkpointed + 1)]
    rounds = pq.read_table(sweep_dir / "rounds.parquet").to_pylist()
    assert sorted((r["trial_id"], r["round"]) for r in rounds) == sorted(
        [(short_id, r) for r in (1, 2)] + [(long_id, r) for r in range(1, long_rounds + 1)]
    )


# A trial whose config fails only inside the trial: tests/tune/test_tune_api.py::test_a_trial_that_fails_on_its_config_errors_once_and_is_listed
