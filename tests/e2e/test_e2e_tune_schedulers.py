"""Schedulers end to end on the session's real local Ray: ASHA makes the same decisions after an
interrupted sweep is resumed (the interrupted ``fedray tune`` exits 130, as an interrupted ``fedray run``
does, with the resume command), and PBT clones a trial from another trial's engine checkpoint."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest
import yaml

from child_signals import popen_interruptible
from fedray.cli.main import main
from fedray import load_config
from fedray.tracking import read_metrics

from test_e2e_tune import TINY_BASE, assert_trials_match_their_runs, rows_by_trial, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.ray]


def write_sweep(path: Path, **fields) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"base": TINY_BASE, "output": {"dir": str(path.parent / "sweeps")}, **fields}))
    return path


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


def test_a_resumed_asha_sweep_makes_the_decisions_of_an_uninterrupted_one(ray_session, tmp_path):
    # One trial at a time, so ASHA's decisions depend only on the (deterministic) metrics: the good
    # trial sets the rungs, the hopeless one is cut at round 1, and the third is compared at round 2
    # with the first. The sweep is interrupted (Ctrl+C) once two trials are done; a resume whose ASHA
    # had forgotten the rungs compares the third trial with nobody and lets it run to the end.
    sweep_file = write_sweep(
        tmp_path / "sweep.yaml",
        name="asha",
        base={**TINY_BASE, "checkpoint": {"every": 1}},
        space={"train.lr": {"grid": [0.1, 1e-6, 0.03]}},
        scheduler={"type": "asha", "grace_period": 1, "reduction_factor": 2},
        max_concurrent_trials=1,
    )
    sweeps = tmp_path / "sweeps"
    log = open(tmp_path / "interrupted.log", "w")
    driver = popen_interruptible(  # stopped with SIGINT below
        [sys.executable, "-m", "fedray.cli.main", "tune", str(sweep_file), "--address", ray_session.get_runtime_context().gcs_address],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:

        def two_trials_done() -> bool:
            found = list(sweeps.iterdir()) if sweeps.is_dir() else []
            if not found or not (found[0] / "trials.parquet").is_file():
                return False
            return sum(row["status"] in ("TERMINATED", "STOPPED_EARLY") for row in rows_by_trial(found[0]).values()) >= 2

        wait_for(two_trials_done, 300, "two trials of the sweep to finish")
        driver.send_signal(signal.SIGINT)  # Ctrl+C
        assert driver.wait(timeout=120) == 130  # interrupted (as fedray run is): a trial left unfinished
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        log.close()
    [sweep_dir] = sweeps.iterdir()
    printed = (tmp_path / "interrupted.log").read_text()
    resume = f"; continue with `fedray tune --resume {sweep_dir}`"
    assert re.search(r"fedray: interrupted with [1-9]\d* trial\(s\) unfinished" + re.escape(resume), printed), printed[-3000:]
    assert json.loads((sweep_dir / "meta.json").read_text())["status"] == "failed"
    at_interruption = decisions(sweep_dir)
    third = sorted(at_interruption)[-1] if len(at_interruption) == 3 else None
    assert third is None or at_interruption[third][0] in ("PENDING", "RUNNING")

    assert main(["tune", "--resume", str(sweep_dir)]) == 0
    resumed = decisions(sweep_dir)
    expected = uninterrupted_decisions(sweep_dir)
    assert resumed == expected
    by_lr = {rows_by_trial(sweep_dir)[t]["train.lr"]: decision for t, decision in resumed.items()}
    assert by_lr[0.1] == ("TERMINATED", 4) and by_lr[1e-6] == ("STOPPED_EARLY", 1)
    # the decision that needs the rungs recorded before the interruption (else the test proves nothing)
    assert by_lr[0.03][0] == "STOPPED_EARLY"
    assert json.loads((sweep_dir / "meta.json").read_text())["status"] == "finished"
    # the sweep's tables are its trials' runs, each round once across the resume; the trial ASHA let
    # finish has a complete run directory (summary.json) although ASHA ended it at its last report,
    # the ones it stopped have none
    assert_trials_match_their_runs(sweep_dir, rounds_in=4)


def test_pbt_clones_a_trial_from_the_donors_engine_checkpoint_with_a_perturbed_config(ray_session, tmp_path):
    # Two trials side by side, synchronous PBT: at round 2 the worse one is restarted from the better
    # one's engine checkpoint with the learning rate perturbed, and continues to round 3.
    sweep_file = write_sweep(
        tmp_path / "sweep.yaml",
        name="pbt",
        base={**TINY_BASE, "train": {**TINY_BASE["train"], "rounds": 3}, "checkpoint": {"every": 2}},
        space={"train.lr": {"loguniform": [1e-5, 0.2]}},
        num_samples=2,
        search={"type": "random", "seed": 3},
        scheduler={"type": "pbt", "perturbation_interval": 2, "quantile_fraction": 0.5, "synch": True},
    )
    assert main(["tune", str(sweep_file)]) == 0
    [sweep_dir] = (tmp_path / "sweeps").iterdir()
    trials = rows_by_trial(sweep_dir)
    assert {row["status"] for row in trials.values()} == {"TERMINATED"}
    cloned = [t for t in trials if (sweep_dir / "trials" / t / "exploits.json").is_file()]
    assert len(cloned) == 1, "no exploit happened"
    [recipient] = cloned
    [exploit] = json.loads((sweep_dir / "trials" / recipient / "exploits.json").read_text())
    donor = exploit["donor"]
    assert donor in trials and donor != recipient and exploit["round"] == 2

    donor_rows = read_metrics(sweep_dir / "trials" / donor, "round")
    recipient_rows = read_metrics(sweep_dir / "trials" / recipient, "round")
    assert [r["round"] for r in recipient_rows] == [1, 2, 3]
    # the recipient's rounds 1-2 are the donor's (it continued from the donor's round 2), round 3 its own
    assert [r["test_accuracy"] for r in recipient_rows[:2]] == [r["test_accuracy"] for r in donor_rows[:2]]
    # with the donor's learning rate, perturbed (x0.8 / x1.2, or resampled) and kept inside the domain
    new_lr = exploit["values"]["train.lr"]
    assert load_config(sweep_dir / "trials" / recipient / "config.yaml").train.lr == new_lr == trials[recipient]["train.lr"]
    assert 1e-5 <= new_lr <= 0.2 and new_lr != trials[donor]["train.lr"]
    rounds = pq.read_table(sweep_dir / "rounds.parquet").to_pylist()
    assert max(r["round"] for r in rounds if r["trial_id"] == recipient) == 3
