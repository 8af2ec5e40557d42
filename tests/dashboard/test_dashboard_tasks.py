"""The dashboard follows a run's task: a folder of regression runs is ranked by test_rmse, lowest
first, from the runs' saved configs (files in their real formats; no browser)."""

from __future__ import annotations

from pathlib import Path

from fedray.config import save_config
from fedray.dashboard.data import DashboardData, task_headline
from fedray.plugins import load_config
from fedray.tracking.metrics_file import write_table_atomically


def write_regression_run(run_dir: Path, rmse: list[float]) -> None:
    run_dir.mkdir(parents=True)
    save_config(
        load_config(None, ["data.name=diabetes", "data.task=regression", "data.partition=iid", "model.name=mlp"]), run_dir / "config.yaml"
    )
    rows = [
        {"scope": "round", "client_id": None, "round": r, "train_loss": 1.0 / r, "test_rmse": v, "test_loss": v / 77, "seconds": 0.5}
        for r, v in enumerate(rmse, 1)
    ]
    write_table_atomically(rows, run_dir / "metrics.parquet")


def test_a_folder_of_regression_runs_is_ranked_by_the_lowest_rmse(tmp_path):
    write_regression_run(tmp_path / "high", [80.0, 70.0, 75.0])
    write_regression_run(tmp_path / "low", [78.0, 60.0, 62.0])
    overview = DashboardData(tmp_path).overview()
    assert (overview.metric, overview.mode) == ("test_rmse", "min")
    assert overview.best_trial == "low"
    best = {trial["trial_id"]: trial["best_metric"] for trial in overview.trials}
    assert best == {"high": 70.0, "low": 60.0}


def test_a_config_saved_before_tasks_existed_is_a_classification():
    assert task_headline({"data": {"name": "digits"}}) == ("test_accuracy", "max")
    assert task_headline({"data": {"task": "language_modeling"}}) == ("test_perplexity", "min")
