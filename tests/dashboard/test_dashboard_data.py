"""The dashboard's data layer without Ray or a browser: reading sweep/run folders as the sweep directory
contract and the run directory define them, downsampling, best-trial selection, half-written files, the
CLI's path errors. Also holds the helpers that write contract files (used by the browser tests too)."""

from __future__ import annotations

import json
import os
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow.parquet as pq
import pytest

from fedray.cli.main import main as fedray_main
from fedray.config import save_config
from fedray import load_config
from fedray.dashboard import DashboardServer
from fedray.dashboard.data import (
    DashboardData,
    as_new_run_config,
    client_distribution,
    detect_kind,
    differing_keys,
    downsample,
    select_best_trial,
    summarize_curve,
)
from fedray.tracking.metrics_file import write_table_atomically
from fedray.data import build_federated_dataset
from fedray.runtime.experiment import write_run_info

# ---------------------------------------------------------------------------------------------------
# Writers of the contract's files (shared with tests/dashboard/test_dashboard_browser.py)


def write_meta(
    sweep_dir: Path,
    swept_keys: list[str],
    num_trials: int,
    metric: str = "test_accuracy",
    mode: str = "max",
    status: str = "running",
    ray_dashboard_url: str | None = None,
) -> None:
    meta = {
        "sweep_id": sweep_dir.name,
        "metric": metric,
        "mode": mode,
        "swept_keys": swept_keys,
        "num_trials": num_trials,
        "started_at": "2026-01-02T03:04:05",
        "ray_dashboard_url": ray_dashboard_url,
        "status": status,
    }
    (sweep_dir / "meta.json").write_text(json.dumps(meta))


def trial_row(
    trial_id: str,
    swept: dict[str, Any],
    rounds: list[dict[str, Any]],
    metric: str = "test_accuracy",
    mode: str = "max",
    status: str = "TERMINATED",
) -> dict[str, Any]:
    """A ``trials.parquet`` row computed from the trial's round rows."""
    curve = summarize_curve([r["round"] for r in rounds], [r.get(metric) for r in rounds], mode)
    return {
        "trial_id": trial_id,
        "status": status,
        **swept,
        **curve,
        "wall_time_s": float(sum(r.get("seconds") or 0 for r in rounds)),
        "run_dir": f"trials/{trial_id}",
        "error": None,
    }


def write_sweep_from_runs(sweep_dir: Path, trials: dict[str, dict[str, Any]], metric: str = "test_accuracy", mode: str = "max") -> None:
    """``trials.parquet``, ``rounds.parquet`` and ``meta.json`` for the finished fedray runs in
    ``sweep_dir/trials/<trial_id>`` (``trials`` maps each trial id to its swept values), exactly as
    ``fedray tune`` writes them."""
    trial_rows, round_rows = [], []
    for trial_id, swept in trials.items():
        rows = [r for r in pq.read_table(sweep_dir / "trials" / trial_id / "metrics.parquet").to_pylist() if r["scope"] == "round"]
        rows = [{k: v for k, v in r.items() if k not in ("scope", "client_id")} for r in rows]
        trial_rows.append(trial_row(trial_id, swept, rows, metric, mode))
        round_rows += [{"trial_id": trial_id, **r} for r in rows]
    write_meta(sweep_dir, list(next(iter(trials.values()))), len(trials), metric, mode, status="finished")
    write_table_atomically(trial_rows, sweep_dir / "trials.parquet")
    write_table_atomically(round_rows, sweep_dir / "rounds.parquet")


def write_run_dir(run_dir: Path, overrides: list[str], accuracies: list[float], clients_per_round: int = 3, finished: bool = True) -> None:
    """A fedray run directory in the real formats (config via ``save_config``, metrics via the engine's
    Parquet writer), with made-up metric values."""
    run_dir.mkdir(parents=True, exist_ok=True)
    config = load_config(None, overrides)
    save_config(config, run_dir / "config.yaml")
    write_run_info(config, run_dir, build_federated_dataset(config.data, config.seed))
    rows = []
    for round, accuracy in enumerate(accuracies, start=1):
        rows.append(
            {
                "scope": "round",
                "client_id": None,
                "round": round,
                "train_loss": 2.0 / round,
                "test_accuracy": accuracy,
                "test_loss": 1.0 - accuracy,
                "seconds": 0.5,
            }
        )
        rows += [{"scope": "client", "round": round, "client_id": c, "train_loss": 2.0 / round + 0.1 * c} for c in range(clients_per_round)]
    write_table_atomically(rows, run_dir / "metrics.parquet")
    (run_dir / "partition.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    if finished:
        (run_dir / "summary.json").write_text(json.dumps({"rounds": len(accuracies), "seconds": 12.5}))


def synthetic_round_rows(accuracies: list[float]) -> list[dict[str, Any]]:
    return [
        {"round": i, "test_accuracy": a, "test_loss": 1.0 - a, "train_loss": 2.0 / i, "seconds": 0.5} for i, a in enumerate(accuracies, 1)
    ]


def age(path: Path, seconds: float) -> None:
    """Set the modification time of ``path`` and of every file under it ``seconds`` in the past."""
    then = time.time() - seconds
    for item in [path, *path.rglob("*")] if path.is_dir() else [path]:
        os.utime(item, (then, then), follow_symlinks=False)


@contextmanager
def serve(path: Path, **options: Any) -> Iterator[DashboardServer]:
    """A real dashboard server on 127.0.0.1 and a free port, in a thread; the page checks every 0.5 s."""
    server = DashboardServer(path, port=0, **{"refresh_seconds": 0.5, **options})
    server.start_in_thread()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


COMPARISON_SPACE = {
    "algorithm.name": {"grid": ["fedavg", "fedsc", "hetero_ssfl"]},
    "data.alpha": {"grid": [0.1, 0.5]},
    "seed": {"grid": [0, 1]},
    "train.lr": {"loguniform": [0.001, 0.1]},
}


def comparison_accuracies(algorithm: str, alpha: float, seed: int) -> list[float]:
    """Made-up 4-round accuracy curves with known means: algorithms ordered fedavg < fedsc, α=0.5 above α=0.1,
    seed 1 above seed 0 by 0.02; hetero_ssfl's (a linear probe's accuracy) is the highest number of all."""
    top = {"fedavg": 0.6, "fedsc": 0.7, "hetero_ssfl": 0.85}[algorithm] + (0.1 if alpha == 0.5 else 0.0) + 0.02 * seed
    return [round(top * f, 6) for f in (0.4, 0.7, 1.0, 0.95)]


def write_comparison_sweep(
    sweep_dir: Path,
    status: str = "running",
    errored: tuple = ("fedsc", 0.5, 1),
    running: tuple | None = None,
    ray_dashboard_url: str | None = "http://127.0.0.1:8265",
) -> dict[tuple, str]:
    """A sweep like ``tune_configs/compare_algorithms.yaml`` (algorithms × α × seed, a log-uniform lr), 12 trials
    of 4 rounds in the sweep directory contract (``sweep.yaml``, ``meta.json``, ``trials.parquet``,
    ``rounds.parquet``): hetero_ssfl trials also report ``probe_accuracy``; the trial ``errored``
    (algorithm, α, seed) failed at round 2 with an error, the trial ``running`` has reported 3 rounds.
    Returns the trial ids by (algorithm, α, seed)."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    (sweep_dir / "sweep.yaml").write_text(
        json.dumps({"name": "compare", "space": COMPARISON_SPACE, "metric": "test_accuracy", "mode": "max"})
    )
    write_meta(sweep_dir, list(COMPARISON_SPACE), 12, status=status, ray_dashboard_url=ray_dashboard_url)
    trial_rows, round_rows, ids = [], [], {}
    shapes = [(a, alpha, seed) for a in COMPARISON_SPACE["algorithm.name"]["grid"] for alpha in (0.1, 0.5) for seed in (0, 1)]
    for index, (algorithm, alpha, seed) in enumerate(shapes):
        trial_id = f"train_{index:05d}"
        ids[(algorithm, alpha, seed)] = trial_id
        rows = synthetic_round_rows(comparison_accuracies(algorithm, alpha, seed))
        if (algorithm, alpha, seed) in (errored, running):
            rows = rows[: 2 if (algorithm, alpha, seed) == errored else 3]
        if algorithm == "hetero_ssfl":
            rows = [{**r, "probe_accuracy": r["test_accuracy"]} for r in rows]
        swept = {"algorithm.name": algorithm, "data.alpha": alpha, "seed": seed, "train.lr": 0.001 * (1 + index)}
        row = trial_row(trial_id, swept, rows)
        if (algorithm, alpha, seed) == errored:
            row.update(status="ERROR", error="ValueError: fedsc: the prototypes of class 3 are empty")
        if (algorithm, alpha, seed) == running:
            row.update(status="RUNNING")
        trial_rows.append(row)
        round_rows += [{"trial_id": trial_id, **r} for r in rows]
    write_table_atomically(trial_rows, sweep_dir / "trials.parquet")
    write_table_atomically(round_rows, sweep_dir / "rounds.parquet")
    return ids


@pytest.fixture
def sweep_dir(tmp_path) -> Path:
    """A finished 3-trial sweep over τ and α (trial t1 is the best) with each trial's run directory."""
    sweep = tmp_path / "demo-20260102-030405"
    curves = {"t0": [0.2, 0.4, 0.5], "t1": [0.3, 0.7, 0.6], "t2": [0.1, 0.2, 0.3]}
    swept = {
        "t0": {"algorithm.mu": 0.01, "data.alpha": 0.1},
        "t1": {"algorithm.mu": 0.1, "data.alpha": 1.0},
        "t2": {"algorithm.mu": 1.0, "data.alpha": 10.0},
    }
    for trial_id, accuracies in curves.items():
        write_run_dir(
            sweep / "trials" / trial_id,
            [
                f"output.dir={sweep / 'trials'}",
                f"output.name={trial_id}",
                "algorithm.name=fedprox",
                f"algorithm.mu={swept[trial_id]['algorithm.mu']}",
                f"data.alpha={swept[trial_id]['data.alpha']}",
            ],
            accuracies,
        )
    write_sweep_from_runs(sweep, swept)
    return sweep


# ---------------------------------------------------------------------------------------------------
# Pure helpers


def test_downsample_keeps_short_curves_and_drops_missing_values():
    x, y = downsample(np.arange(1, 6), np.array([0.1, np.nan, 0.3, 0.4, np.inf]))
    assert x.tolist() == [1, 3, 4] and y.tolist() == [0.1, 0.3, 0.4]


def test_downsample_long_curve_to_at_most_500_points_keeping_ends_and_extremes():
    rng = np.random.default_rng(0)
    rounds = np.arange(1, 5001)
    values = np.cumsum(rng.normal(size=5000))
    values[1234] = 1e3  # a single spike (the best round) must survive
    x, y = downsample(rounds, values, 500)
    assert 400 < len(x) <= 500
    assert x[0] == 1 and x[-1] == 5000
    assert np.all(np.diff(x) > 0)
    assert 1235 in x.tolist() and y.max() == 1e3
    assert y.min() == values.min()
    assert np.array_equal(y, values[x - 1])  # real points, not interpolated ones


def test_downsample_rejects_a_useless_budget():
    with pytest.raises(ValueError, match="max_points"):
        downsample(np.arange(10), np.arange(10.0), 3)


def test_select_best_trial_by_mode_ignoring_missing_and_first_on_ties():
    trials = [
        {"trial_id": "a", "best_metric": 0.5},
        {"trial_id": "b", "best_metric": None},
        {"trial_id": "c", "best_metric": 0.9},
        {"trial_id": "d", "best_metric": float("nan")},
        {"trial_id": "e", "best_metric": 0.9},
        {"trial_id": "f", "best_metric": 0.1},
    ]
    assert select_best_trial(trials, "max") == "c"
    assert select_best_trial(trials, "min") == "f"
    assert select_best_trial([{"trial_id": "a", "best_metric": None}], "max") is None
    # a trial that reported the best value and then errored (diverged) is not the best
    assert select_best_trial([*trials, {"trial_id": "g", "status": "ERROR", "best_metric": 0.95}], "max") == "c"
    assert select_best_trial([], "min") is None
    with pytest.raises(ValueError, match="'max' or 'min'"):
        select_best_trial(trials, "best")


def test_summarize_curve_golden_values():
    assert summarize_curve([1, 2, 3, 4], [0.2, None, 0.7, 0.6], "max") == {
        "round": 4,
        "latest_metric": 0.6,
        "best_metric": 0.7,
        "best_round": 3,
    }
    assert summarize_curve([1, 2, 3], [2.0, 1.0, 1.0], "min") == {"round": 3, "latest_metric": 1.0, "best_metric": 1.0, "best_round": 2}
    assert summarize_curve([1], [None], "max") == {"round": 1, "latest_metric": None, "best_metric": None, "best_round": None}


def test_differing_keys_ignore_output_location_and_other_algorithms_defaults():
    configs = [
        {"data": {"alpha": 0.1, "name": "digits"}, "algorithm": {"name": "fedavg"}, "output": {"dir": "a", "name": "x"}},
        {"data": {"alpha": 1.0, "name": "digits"}, "algorithm": {"name": "fedprox", "mu": 0.1}, "output": {"dir": "b", "name": "y"}},
    ]
    assert differing_keys(configs) == ["algorithm.name", "data.alpha"]  # μ is FedProx's default: not varied
    configs.append({"data": {"alpha": 1.0, "name": "digits"}, "algorithm": {"name": "fedprox", "mu": 0.5}, "output": {}})
    assert differing_keys(configs) == ["algorithm.name", "data.alpha", "algorithm.mu"]  # varied among the FedProx runs


def test_best_config_is_runnable_and_does_not_point_into_the_sweep(tmp_path):
    original = tmp_path / "config.yaml"
    save_config(
        load_config(
            None, ["output.dir=/sweeps/s/trials", "output.name=t1", "data.alpha=0.3", "algorithm.name=fedprox", "algorithm.mu=0.2"]
        ),
        original,
    )
    copied = tmp_path / "best.yaml"
    copied.write_text(as_new_run_config(original.read_text()))
    config = load_config(copied)
    assert config.data.alpha == 0.3 and config.algorithm.name == "fedprox" and config.algorithm.mu == 0.2
    assert config.output.dir == "runs" and config.output.name is None
    with pytest.raises(ValueError, match="mapping"):
        as_new_run_config("- a list\n")


def test_client_distribution_defaults_to_the_last_round():
    import pandas as pd

    rows = pd.DataFrame(
        {"round": [1, 1, 2, 2, 2], "client_id": [0, 1, 0, 1, 2], "train_loss": [1.0, 2.0, 0.5, None, 0.7], "test_loss": [None] * 5}
    )
    latest = client_distribution(rows, None)
    assert latest == {
        "rounds": [1, 2],
        "round": 2,
        "num_clients": 3,
        "shown_clients": 3,
        "client_ids": [0, 1, 2],
        "metrics": {"train_loss": [0.5, None, 0.7]},
    }
    assert client_distribution(rows, 1)["metrics"] == {"train_loss": [1.0, 2.0]}
    assert client_distribution(rows, 7)["round"] == 2  # a round without client rows: the latest
    assert client_distribution(rows.iloc[:0], None) is None


# ---------------------------------------------------------------------------------------------------
# Sweep directories


def test_sweep_overview_lists_trials_swept_values_and_best(sweep_dir):
    overview = DashboardData(sweep_dir).overview()
    assert overview.kind == "sweep" and overview.title == sweep_dir.name
    assert overview.metric == "test_accuracy" and overview.mode == "max" and overview.status == "finished"
    assert overview.swept_keys == ["algorithm.mu", "data.alpha"]
    assert [t["trial_id"] for t in overview.trials] == ["t0", "t1", "t2"]
    t1 = overview.trials[1]
    assert (t1["algorithm.mu"], t1["data.alpha"], t1["round"], t1["best_metric"], t1["best_round"], t1["latest_metric"]) == (
        0.1,
        1.0,
        3,
        0.7,
        2,
        0.6,
    )
    assert overview.best_trial == "t1"
    assert "mu: 0.1" in overview.best_config and "name: null" in overview.best_config
    assert {"test_accuracy", "test_loss", "train_loss"} <= set(overview.round_metrics)
    assert overview.messages == []
    json.dumps(overview.to_json(), allow_nan=False)  # strict JSON for the page


def test_sweep_with_min_mode_marks_the_lowest_metric(sweep_dir):
    write_meta(sweep_dir, ["algorithm.mu", "data.alpha"], 3, metric="test_loss", mode="min")
    trials = [
        trial_row(t, {}, synthetic_round_rows(a), "test_loss", "min")
        for t, a in (("t0", [0.2, 0.5]), ("t1", [0.3, 0.9]), ("t2", [0.1, 0.4]))
    ]
    write_table_atomically(trials, sweep_dir / "trials.parquet")
    overview = DashboardData(sweep_dir).overview()
    assert overview.mode == "min" and overview.best_trial == "t1"  # test_loss = 1 - accuracy: lowest is 0.1


def test_curves_are_downsampled_and_keep_the_best_round(sweep_dir):
    accuracies = list(0.5 + 0.4 * np.sin(np.arange(3000) / 300.0))
    accuracies[2222] = 0.999
    write_table_atomically([{"trial_id": "long", **r} for r in synthetic_round_rows(accuracies)], sweep_dir / "rounds.parquet")
    curve = DashboardData(sweep_dir).curves(["long", "absent"], "test_accuracy")["curves"]
    assert list(curve) == ["long"]
    assert len(curve["long"]["round"]) <= 500 and 2223 in curve["long"]["round"] and max(curve["long"]["value"]) == 0.999
    assert DashboardData(sweep_dir).curves(["long"], "no_such_metric")["curves"] == {}


def test_version_changes_only_when_the_files_change(sweep_dir):
    data = DashboardData(sweep_dir)
    first = data.overview()
    assert data.version() == first.version and data.overview() is first  # nothing changed: nothing re-read
    rows = pq.read_table(sweep_dir / "trials.parquet").to_pylist()
    rows.append(trial_row("t3", {"algorithm.mu": 0.5, "data.alpha": 0.5}, synthetic_round_rows([0.9, 0.95]), status="RUNNING"))
    write_table_atomically(rows, sweep_dir / "trials.parquet")
    os.utime(sweep_dir / "trials.parquet", ns=(1, 1))  # a different mtime even on coarse-clock file systems
    assert data.version() != first.version
    second = data.overview()
    assert [t["trial_id"] for t in second.trials] == ["t0", "t1", "t2", "t3"] and second.best_trial == "t3"
    assert second.best_config is None  # t3 has no run directory yet: said on the page, not raised
    assert any("t3 has no config.yaml" in m.text for m in second.messages)


def test_meta_swept_keys_missing_are_inferred_from_the_trials_table(sweep_dir):
    (sweep_dir / "meta.json").unlink()
    overview = DashboardData(sweep_dir).overview()
    assert overview.swept_keys == ["algorithm.mu", "data.alpha"] and overview.best_trial == "t1"
    assert any("meta.json is not written yet" in m.text for m in overview.messages)


def test_half_written_trials_file_gives_a_message_not_an_error(sweep_dir):
    good = (sweep_dir / "trials.parquet").read_bytes()
    (sweep_dir / "trials.parquet").write_bytes(good[: len(good) // 2])
    overview = DashboardData(sweep_dir).overview()
    assert overview.trials == [] and overview.best_trial is None
    assert any(m.level == "error" and "trials.parquet could not be read" in m.text for m in overview.messages)


def test_half_written_file_after_a_good_read_keeps_the_last_good_contents(sweep_dir):
    data = DashboardData(sweep_dir)
    assert len(data.overview().trials) == 3
    good = (sweep_dir / "trials.parquet").read_bytes()
    (sweep_dir / "trials.parquet").write_bytes(good[:100])
    overview = data.overview()
    assert [t["trial_id"] for t in overview.trials] == ["t0", "t1", "t2"]
    assert any(m.level == "warning" and "last good contents" in m.text for m in overview.messages)


def test_sweep_that_has_only_started(tmp_path):
    sweep = tmp_path / "s"
    sweep.mkdir()
    write_meta(sweep, ["data.alpha"], 8)
    overview = DashboardData(sweep).overview()
    assert overview.kind == "sweep" and overview.trials == [] and overview.num_trials == 8
    assert any("No trial has reported yet" in m.text for m in overview.messages)


def test_trials_file_without_trial_id_column(sweep_dir):
    write_table_atomically([{"status": "RUNNING"}], sweep_dir / "trials.parquet")
    overview = DashboardData(sweep_dir).overview()
    assert overview.trials == [] and any("no trial_id column" in m.text for m in overview.messages)


def test_ray_dashboard_link_comes_from_meta(sweep_dir):
    write_meta(sweep_dir, ["algorithm.mu", "data.alpha"], 3, ray_dashboard_url="http://head:8265")
    assert DashboardData(sweep_dir).overview().ray_dashboard_url == "http://head:8265"


# ---------------------------------------------------------------------------------------------------
# Per-run views, files, folders of runs, bad paths


def test_run_view_of_a_sweep_trial(sweep_dir):
    data = DashboardData(sweep_dir)
    view = data.run_view("t1")
    assert view["found"] and view["run_dir"] == "trials/t1"
    assert view["curves"]["test_accuracy"] == {"round": [1, 2, 3], "value": [0.3, 0.7, 0.6]}
    assert view["clients"]["round"] == 3 and view["clients"]["num_clients"] == 3
    assert view["clients"]["metrics"]["train_loss"] == pytest.approx([2 / 3, 2 / 3 + 0.1, 2 / 3 + 0.2])
    assert data.run_view("t1", client_round=1)["clients"]["metrics"]["train_loss"] == pytest.approx([2.0, 2.1, 2.2])
    assert "mu: 0.1" in view["config"] and "partition.png" in view["files"]
    assert data.run_file("t1", "partition.png") == (sweep_dir / "trials" / "t1" / "partition.png").resolve()


def test_run_view_falls_back_to_rounds_file_when_the_trial_dir_is_missing(sweep_dir):
    shutil.rmtree(sweep_dir / "trials" / "t2")
    view = DashboardData(sweep_dir).run_view("t2")
    assert view["found"] and view["run_dir"] is None and view["clients"] is None
    assert view["curves"]["test_accuracy"]["value"] == [0.1, 0.2, 0.3]
    assert any("not here" in m["text"] for m in view["messages"])


def test_run_dir_recorded_in_the_trials_file_is_used(sweep_dir):
    shutil.move(sweep_dir / "trials" / "t1", sweep_dir / "elsewhere")
    rows = pq.read_table(sweep_dir / "trials.parquet").to_pylist()
    rows[1]["run_dir"] = "elsewhere"
    write_table_atomically(rows, sweep_dir / "trials.parquet")
    data = DashboardData(sweep_dir)
    assert "mu: 0.1" in data.overview().best_config
    assert data.run_view("t1")["run_dir"] == "elsewhere"


def test_unknown_trial_and_files_outside_the_whitelist_or_the_folder(sweep_dir, tmp_path):
    data = DashboardData(sweep_dir)
    view = data.run_view("nope")
    assert not view["found"] and "No trial or run named 'nope'" in view["messages"][0]["text"]
    assert data.run_file("t1", "metrics.parquet") is None
    assert data.run_file("t1", "../../etc/passwd") is None
    outside = tmp_path / "outside"
    write_run_dir(outside, [], [0.5])
    rows = pq.read_table(sweep_dir / "trials.parquet").to_pylist()
    rows[0]["run_dir"] = "../outside"
    write_table_atomically(rows, sweep_dir / "trials.parquet")
    shutil.rmtree(sweep_dir / "trials" / "t0")
    assert DashboardData(sweep_dir).run_file("t0", "config.yaml") is None


def test_single_run_directory_is_one_trial(tmp_path):
    run = tmp_path / "fedavg-digits-1"
    write_run_dir(run, [], [0.3, 0.8, 0.7])
    data = DashboardData(run)
    overview = data.overview()
    assert overview.kind == "run" and overview.swept_keys == []
    assert overview.trials == [
        {
            "trial_id": "fedavg-digits-1",
            "status": "TERMINATED",
            "round": 3,
            "latest_metric": 0.7,
            "best_metric": 0.8,
            "best_round": 2,
            "wall_time_s": 12.5,
            "run_dir": ".",
            "error": None,
            "metric_name": "test_accuracy",
            "evaluation": "global",
            "started_at": (run / "config.yaml").stat().st_mtime_ns / 1e9,  # when it wrote its config
            "ended_at": (run / "summary.json").stat().st_mtime_ns / 1e9,  # and its summary
            "resources": None,  # no placement.json: not a sweep trial
            "label": "fedavg-digits-1",
        }
    ]
    assert data.run_view("fedavg-digits-1")["clients"]["num_clients"] == 3


def test_folder_of_runs_sweeps_over_the_keys_that_differ(tmp_path):
    write_run_dir(tmp_path / "a", ["data.alpha=0.1", "output.name=a"], [0.4, 0.5])
    write_run_dir(tmp_path / "b", ["data.alpha=1.0", "output.name=b"], [0.6, 0.9], finished=False)
    (tmp_path / "not-a-run").mkdir()
    data = DashboardData(tmp_path)
    overview = data.overview()
    assert overview.kind == "runs" and overview.swept_keys == ["data.alpha"]
    assert [(t["trial_id"], t["status"], t["data.alpha"], t["best_metric"]) for t in overview.trials] == [
        ("a", "TERMINATED", 0.1, 0.5),
        ("b", "RUNNING", 1.0, 0.9),
    ]
    assert overview.best_trial == "b"
    assert data.curves(["a", "b"], "test_accuracy")["curves"]["a"] == {"round": [1, 2], "value": [0.4, 0.5]}


def test_personalised_runs_are_marked_beside_global_ones(tmp_path):
    """FedPer's test_accuracy is a global model with an untrained head: its row says it is personalised."""
    write_run_dir(tmp_path / "a", ["algorithm.name=fedavg", "output.name=a"], [0.4, 0.5])
    write_run_dir(
        tmp_path / "b", ["algorithm.name=fedper", "data.client_test_fraction=0.25", "eval.personalized=true", "output.name=b"], [0.1, 0.1]
    )
    trials = {t["trial_id"]: t for t in DashboardData(tmp_path).overview().trials}
    assert (trials["a"]["evaluation"], trials["b"]["evaluation"]) == ("global", "personalised")
    assert trials["a"]["label"].startswith("fedavg") and "(personalised)" not in trials["a"]["label"]
    assert trials["b"]["label"].startswith("fedper (personalised)")


def test_empty_missing_and_sweeps_folders_get_messages(tmp_path):
    assert detect_kind(tmp_path / "nope") == "missing"
    missing = DashboardData(tmp_path / "nope").overview()
    assert missing.kind == "missing" and "does not exist" in missing.messages[0].text
    (tmp_path / "empty").mkdir()
    empty = DashboardData(tmp_path / "empty").overview()
    assert empty.kind == "empty" and empty.trials == [] and "Nothing to show yet" in empty.messages[0].text
    (tmp_path / "empty" / "sweep-a").mkdir()
    write_meta(tmp_path / "empty" / "sweep-a", [], 1)
    sweeps = DashboardData(tmp_path / "empty").overview()  # a folder of sweeps: the page compares them
    assert sweeps.kind == "sweeps" and [s["name"] for s in sweeps.sweeps] == ["sweep-a"]
    assert "open one of them (sweep-a)" in sweeps.messages[0].text


def test_cli_rejects_a_missing_path_with_exit_2(tmp_path, capsys):
    assert fedray_main(["dashboard", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "file.txt").write_text("x")
    assert fedray_main(["dashboard", str(tmp_path / "file.txt")]) == 2
    assert "is a file" in capsys.readouterr().err
    assert fedray_main(["dashboard", str(tmp_path), "--port", "70000"]) == 2
