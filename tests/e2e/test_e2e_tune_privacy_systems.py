"""A ``fedray tune`` sweep over privacy and systems keys (issues 43 and 44): each trial is a DP-FedAvg
run with simulated devices and compressed uploads, its noise calibrated from its own target ε.

The same sweep (one trial at a time, uninterrupted: the second trial is the first one's warm process and
pool reset for another target ε) is the one whose directory is checked: ``meta.json``, ``sweep.yaml``,
``trials.parquet``, ``rounds.parquet``, one run directory per trial inside the trial's placement group,
and the best trial printed. (Two trials side by side, each failing if a worker lands outside its own
group: the PBT sweep in ``test_e2e_tune_schedulers.py``.)"""

from __future__ import annotations

import contextlib
import io
import json
import re
from datetime import datetime

import pyarrow.parquet as pq
import pytest
from test_e2e_tune import TINY_BASE, TRIAL_COLUMNS, assert_trials_match_their_runs, only_sweep_dir, rows_by_trial, write_sweep

from fedray import load_config
from fedray.cli.main import main
from fedray.tracking import read_metrics
from fedray.tune import load_sweep

# one sweep for the module's tests: on one process under pytest -n
pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.xdist_group("tune_privacy_sweep")]

PRIVATE_DEVICES = {
    **TINY_BASE,
    "data": {"num_clients": 8, "alpha": 1.0},
    "train": {**TINY_BASE["train"], "rounds": 3},
    "privacy": {"mechanism": "central", "clip": 0.5, "delta": 1e-4, "population_size": 5000, "noise_cohort_size": 200},
    "systems": {
        "enabled": True,
        "devices": {"source": "profiles", "profiles": {"phone_low": 0.5, "phone_high": 0.5}},
        "selection": {"over_selection": 1.5},
        "compression": {"method": "int8"},
    },
}
TARGETS = [2.0, 8.0]


@pytest.fixture(scope="module")
def private_sweep(ray_session, tmp_path_factory):
    """``fedray tune`` (in this process) of two trials one after the other, one per target ε; returns the
    sweep file, the sweep directory and what the command printed."""
    tmp_path = tmp_path_factory.mktemp("private")
    sweep_file = write_sweep(
        tmp_path,
        name="private-devices",
        base=PRIVATE_DEVICES,
        space={"privacy.target_epsilon": {"grid": TARGETS}},
        max_concurrent_trials=1,
    )
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["tune", str(sweep_file)]) == 0
    return sweep_file, only_sweep_dir(tmp_path), printed.getvalue()


def test_a_sweep_over_target_epsilon_calibrates_each_trial_and_reports_privacy_and_systems_metrics(private_sweep):
    _, sweep_dir, _ = private_sweep
    trials = rows_by_trial(sweep_dir)
    assert sorted(row["privacy.target_epsilon"] for row in trials.values()) == TARGETS

    noise_by_target = {}
    for row in trials.values():
        assert (row["status"], row["error"]) == ("TERMINATED", None)
        run_dir = sweep_dir / row["run_dir"]
        config = load_config(run_dir / "config.yaml")
        assert config.privacy.target_epsilon == row["privacy.target_epsilon"]
        rounds = read_metrics(run_dir, "round")
        assert [r["round"] for r in rounds] == [1, 2, 3]
        # the calibrated noise spends the trial's own budget over its 3 rounds, and no more
        spent = [r["dp_epsilon"] for r in rounds]
        assert spent == sorted(spent) and 0.9 * config.privacy.target_epsilon <= spent[-1] <= config.privacy.target_epsilon * (1 + 1e-9)
        noise_by_target[config.privacy.target_epsilon] = {r["dp_noise_multiplier"] for r in rounds}
        # the systems model ran: over-selection, a simulated clock, int8 uploads (a byte per weight
        # and a scale per bucket) against the float32 broadcast
        for r in rounds:
            assert r["selected"] == 6 and r["aggregated"] == 4  # 1.5 x the 4 reports wanted; the first 4 count
            assert r["bytes_up"] < r["bytes_down"] / 3
        assert [r["sim_time"] for r in rounds] == sorted(r["sim_time"] for r in rounds) and rounds[0]["sim_time"] > 0
    [low], [high] = noise_by_target[2.0], noise_by_target[8.0]
    assert low > high > 0  # a smaller ε needs more noise

    swept = pq.read_table(sweep_dir / "rounds.parquet").to_pylist()
    assert {"dp_epsilon", "sim_time", "bytes_up", "aggregated"} <= set(swept[0])


def test_a_sweep_writes_its_directory_and_prints_its_best_trial(private_sweep):
    sweep_file, sweep_dir, printed = private_sweep
    meta = json.loads((sweep_dir / "meta.json").read_text())
    assert re.fullmatch(r"private-devices-\d{8}-\d{6}", meta["sweep_id"]) and meta["sweep_id"] == sweep_dir.name
    assert {k: meta[k] for k in ("metric", "mode", "swept_keys", "num_trials", "status")} == {
        "metric": "test_accuracy",
        "mode": "max",
        "swept_keys": ["privacy.target_epsilon"],
        "num_trials": 2,
        "status": "finished",
    }
    datetime.fromisoformat(meta["started_at"])
    assert load_sweep(sweep_dir / "sweep.yaml") == load_sweep(sweep_file)

    table = pq.read_table(sweep_dir / "trials.parquet")
    assert table.schema.names == ["trial_id", "status", "privacy.target_epsilon", *TRIAL_COLUMNS]
    rounds = pq.read_table(sweep_dir / "rounds.parquet").to_pylist()
    assert {"trial_id", "round", "test_accuracy", "test_loss", "train_loss", "seconds"} <= set(rounds[0])
    assert not {"training_iteration", "time_total_s", "timestamp"} & set(rounds[0])
    assert_trials_match_their_runs(sweep_dir, rounds_in=3)

    trials = rows_by_trial(sweep_dir)
    for row in trials.values():
        # the trial's worker ran inside the trial's placement group: driver+server bundle, worker bundle
        placement = json.loads((sweep_dir / row["run_dir"] / "placement.json").read_text())
        assert placement["bundles"] == [{"CPU": 1.0}, {"CPU": 1.0}]
        assert placement["worker_placement_group_ids"] == [placement["placement_group_id"]]

    best = max(trials.values(), key=lambda row: row["best_metric"])
    assert f"best trial         {best['trial_id']}" in printed
    assert f"privacy.target_epsilon = {best['privacy.target_epsilon']}" in printed
