"""The sweep's heatmap without a browser: the grid of mean final values over two swept keys
(:func:`~fedray.dashboard.data.heatmap_grid`, :func:`~fedray.dashboard.data.final_values`) and its API route."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from test_dashboard_data import serve, write_comparison_sweep
from test_dashboard_server import get

from fedray.dashboard.data import BadRequest, DashboardData, final_values, heatmap_grid


def threat_trials() -> list[dict]:
    """Trials of an attack × noise multiplier sweep over two seeds (a made-up trials table)."""
    keys = ("robust.attack", "privacy.noise_multiplier", "seed")
    shapes = [
        ("sign_flip", 10, 0),
        ("sign_flip", 10, 1),
        ("sign_flip", 2, 0),
        ("backdoor", 0.5, 0),
        ("backdoor", 0.5, 1),
        ("backdoor", 2, 0),
        ("alie", 2, 0),  # no value: left out
    ]
    return [{"trial_id": f"t{i}", **dict(zip(keys, shape))} for i, shape in enumerate(shapes)]


def test_grid_means_and_counts_over_the_other_keys_with_missing_cells_and_ordered_axes():
    values = {"t0": 0.2, "t1": 0.4, "t2": 0.5, "t3": 0.9, "t4": 0.7, "t5": 0.1}
    grid = heatmap_grid(threat_trials(), values, "privacy.noise_multiplier", "robust.attack")
    assert grid["x_values"] == [0.5, 2, 10]  # by value, not as text ("10" < "2")
    assert grid["x_labels"] == ["0.5", "2", "10"]
    assert grid["y_values"] == ["backdoor", "sign_flip"]  # alie has no value: no row
    assert grid["mean"] == [[pytest.approx(0.8), 0.1, None], [None, 0.5, pytest.approx(0.3)]]
    assert grid["count"] == [[2, 1, 0], [0, 1, 2]]


def test_grid_of_trials_without_values_is_empty():
    grid = heatmap_grid(threat_trials(), {}, "robust.attack", "seed")
    assert (grid["x_values"], grid["y_values"], grid["mean"], grid["count"]) == ([], [], [], [])


def test_final_value_is_the_last_finite_one_of_each_trial():
    rounds = pd.DataFrame(
        {
            "trial_id": ["a", "a", "a", "b", "b", "c"],
            "round": [3, 1, 2, 1, 2, 1],
            "attack_success_rate": [None, 0.1, 0.6, 0.3, float("nan"), None],
        }
    )
    assert final_values(rounds, "attack_success_rate") == {"a": 0.6, "b": 0.3}
    assert final_values(rounds, "test_accuracy") == {}


def test_heatmap_of_a_sweep_leaves_out_failed_trials_and_other_quantities(tmp_path):
    ids = write_comparison_sweep(tmp_path / "compare", status="finished")  # fedsc α=0.5 seed 1 failed
    data = DashboardData(tmp_path / "compare")
    grid = data.heatmap("data.alpha", "algorithm.name", None)
    assert (grid["metric"], grid["value"], grid["x_values"], grid["y_values"]) == (
        "test_accuracy",
        "final",
        [0.1, 0.5],
        ["fedavg", "fedsc"],
    )
    # fedavg α=0.1: final = 0.95 × (0.6 + 0.02 seed), seeds 0 and 1; fedsc α=0.5: seed 0 only
    assert grid["mean"][0][0] == pytest.approx(0.95 * 0.61) and grid["count"][0][0] == 2
    assert grid["mean"][1][1] == pytest.approx(0.95 * 0.8) and grid["count"][1][1] == 1
    assert grid["left_out"] == 5  # the failed trial and hetero_ssfl's 4 (a linear probe's accuracy)
    probe = data.heatmap("seed", "data.alpha", "probe_accuracy")
    assert probe["count"] == [[1, 1], [1, 1]] and probe["left_out"] == len(ids) - 4
    with pytest.raises(BadRequest, match="'train.epochs' is not a swept key"):
        data.heatmap("train.epochs", "seed", None)
    with pytest.raises(BadRequest, match="reports 'nope'"):
        data.heatmap("seed", "data.alpha", "nope")
    with pytest.raises(BadRequest, match="two different keys"):
        data.heatmap("seed", "seed", None)


def test_heatmap_route_answers_the_grid_and_400_for_bad_parameters(tmp_path):
    write_comparison_sweep(tmp_path / "compare", status="finished")
    with serve(tmp_path / "compare") as server:
        status, body = get(server, "/api/heatmap?x=data.alpha&y=algorithm.name&metric=test_accuracy")
        assert status == 200 and json.loads(body)["count"] == [[2, 2], [2, 1]]
        for query, message in [
            ("x=data.alpha&y=nope", "'nope' is not a swept key of compare"),
            ("x=data.alpha", "'' is not a swept key"),
            ("x=data.alpha&y=seed&metric=%3Cb%3E", "no trial of compare reports '<b>'"),
        ]:
            status, body = get(server, f"/api/heatmap?{query}")
            assert status == 400 and message in json.loads(body)["error"]
            assert "Traceback" not in body.decode() and str(tmp_path) not in body.decode()
