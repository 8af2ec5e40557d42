"""A ``fedray tune`` sweep over privacy and systems keys (issues 43 and 44): each trial is a DP-FedAvg
run with simulated devices and compressed uploads, its noise calibrated from its own target ε."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
from test_e2e_tune import TINY_BASE, only_sweep_dir, rows_by_trial, write_sweep

from fedray import load_config
from fedray.cli.main import main
from fedray.tracking import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.ray]

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


def test_a_sweep_over_target_epsilon_calibrates_each_trial_and_reports_privacy_and_systems_metrics(ray_session, tmp_path):
    targets = [2.0, 8.0]
    sweep_file = write_sweep(
        tmp_path,
        name="private-devices",
        base=PRIVATE_DEVICES,
        space={"privacy.target_epsilon": {"grid": targets}},
        max_concurrent_trials=2,
    )
    assert main(["tune", str(sweep_file)]) == 0
    sweep_dir = only_sweep_dir(tmp_path)
    trials = rows_by_trial(sweep_dir)
    assert sorted(row["privacy.target_epsilon"] for row in trials.values()) == targets

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
