"""MLflow tracking for a run (``output.callbacks: [mlflow]``; ``pip install 'fedray[mlflow]'``).

One MLflow run per fedray run, in a local MLflow file store by default:

- params: the resolved config, flattened to dotted keys (``data.alpha``, ``algorithm.mu``);
- metrics: every numeric value of each round row (``test_accuracy``, ``train_loss``, ``seconds``,
  the algorithm's diagnostics) at ``step`` = the round;
- artifacts, at the end: ``config.yaml`` and the run's plots (``learning_curve.png``, ``partition.png``).

Where: ``$MLFLOW_TRACKING_URI`` if set, else ``<output.dir>/mlruns`` (a file store; MLflow ≥ 3.7 keeps
file stores in maintenance mode behind ``MLFLOW_ALLOW_FILE_STORE``, which this logger sets for its own
file store unless you set it). Experiment: ``$MLFLOW_EXPERIMENT_NAME``, else ``fedray``. A resumed
fedray run continues its MLflow run (found by the ``fedray.run_dir`` tag). Read it back with
``mlflow ui --backend-store-uri runs/mlruns`` or ``mlflow.tracking.MlflowClient``.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

try:
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient
except ImportError:
    raise ImportError("the MLflow callback needs MLflow: pip install 'fedray[mlflow]'") from None

from fedray.layout import LEARNING_CURVE_PLOT, PARTITION_PLOT, SAVED_CONFIG_FILE
from fedray.tracking.callbacks import Callback, RunContext

RUN_DIR_TAG = "fedray.run_dir"
ARTIFACTS = (SAVED_CONFIG_FILE, LEARNING_CURVE_PLOT, PARTITION_PLOT)


def flatten(mapping: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"data": {"alpha": 0.5}}`` → ``{"data.alpha": 0.5}`` (lists and ``None`` are kept as values)."""
    flat: dict[str, Any] = {}
    for key, value in mapping.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


class MLflowLogger(Callback):
    """Logs the run's params, per-round metrics and plots to MLflow (see the module docstring)."""

    def __init__(self) -> None:
        self.client: MlflowClient | None = None
        self.run_id: str | None = None

    def on_run_start(self, run: RunContext) -> None:
        tracking_uri = os.environ.get("MLFLOW_TRACKING_URI") or (run.run_dir.resolve().parent / "mlruns").as_uri()
        if tracking_uri.startswith("file:"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=tracking_uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "fedray")
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment is not None else self.client.create_experiment(name)
        run_dir = str(run.run_dir.resolve())
        previous = self.client.search_runs([experiment_id], filter_string=f"tags.`{RUN_DIR_TAG}` = '{run_dir}'", max_results=1)
        if previous:  # a resumed fedray run continues its MLflow run
            self.run_id = previous[0].info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
            return
        mlflow_run = self.client.create_run(experiment_id, run_name=run.run_dir.name, tags={RUN_DIR_TAG: run_dir})
        self.run_id = mlflow_run.info.run_id
        params = [Param(key, str(value)) for key, value in flatten(run.config.to_dict()).items()]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[start : start + 100])

    def on_round_end(self, run: RunContext, row: dict[str, Any], client_rows: list[dict[str, Any]]) -> None:
        timestamp = int(time.time() * 1000)
        metrics = [
            Metric(key, float(value), timestamp, int(row["round"]))
            for key, value in row.items()
            if key != "round" and isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        ]
        self.client.log_batch(self.run_id, metrics=metrics)

    def on_run_end(self, run: RunContext) -> None:
        for name in ARTIFACTS:
            if (run.run_dir / name).is_file():
                self.client.log_artifact(self.run_id, str(run.run_dir / name))
        self.client.set_terminated(self.run_id, "FINISHED")
