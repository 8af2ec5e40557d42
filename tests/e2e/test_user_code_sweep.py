"""A researcher's own model and own dataset together, from one module of theirs, under ``fedray tune``
on a real local Ray (issue 40: "a user module with its own model and dataset under fedray run and
fedray tune"): the sweep varies a key of the user's model (``model.kwargs.hidden``); the trials,
created by Tune, import the module from the job's runtime_env (a separate ``fedray tune`` process, a
job of its own on the session's Ray); the data's natural client ids reach the client rows."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from fedray.tracking import read_metrics

REPO = Path(__file__).resolve().parents[2]

LAB_MODULE = '''
import numpy as np
from sklearn.datasets import load_wine
from torch import nn

import fedray.data


def vineyards():
    """scikit-learn's wine table (178 × 13 features, 3 classes); each sample's "vineyard" (its index
    mod 4) is its client, a natural partition."""
    x, y = load_wine(return_X_y=True)
    return fedray.data.UserData(
        x_train=x.astype(np.float32), y_train=y.astype(np.int64),
        client_ids_train=np.array([f"vineyard-{i % 4}" for i in range(len(y))]),
    )


class WineNet(nn.Module):
    def __init__(self, num_features, num_classes, hidden=16):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(num_features, hidden), nn.ReLU())
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x):
        return self.head(self.body(x))
'''


@pytest.mark.slow
@pytest.mark.ray
def test_fedray_tune_sweeps_a_user_models_key_on_a_user_dataset(ray_session, tmp_path):
    (tmp_path / "lab.py").write_text(LAB_MODULE)
    base = {
        "data": {"name": "lab:vineyards", "partition": "natural", "num_clients": 4, "test_fraction": 0.25},
        "model": {"name": "lab:WineNet"},
        "train": {"rounds": 3, "clients_per_round": 4, "local_epochs": 2, "batch_size": 8, "lr": 0.1},
        "checkpoint": {"every": 3},
        "resources": {"num_workers": 1},
        "output": {"tensorboard": False, "plots": False},
    }
    sweep = {
        "base": base,
        "space": {"model.kwargs.hidden": {"grid": [4, 32]}},
        "output": {"dir": str(tmp_path / "sweeps")},
        "max_concurrent_trials": 1,
    }
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(sweep))
    result = subprocess.run(
        [sys.executable, "-m", "fedray.cli.main", "tune", "sweep.yaml", "--address", ray_session.get_runtime_context().gcs_address],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), "RAY_ADDRESS": ""},
        timeout=600,
    )
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-3000:])
    [sweep_dir] = list((tmp_path / "sweeps").iterdir())
    trials = pq.read_table(sweep_dir / "trials.parquet").to_pylist()
    assert sorted(trial["model.kwargs.hidden"] for trial in trials) == [4, 32]
    assert all(trial["status"] == "TERMINATED" and trial["round"] == 3 for trial in trials), trials
    for trial in trials:
        run_dir = sweep_dir / trial["run_dir"]
        saved = yaml.safe_load((run_dir / "config.yaml").read_text())["model"]
        assert saved["kwargs"] == {"hidden": trial["model.kwargs.hidden"]}
        clients = read_metrics(run_dir, "client")
        assert {row["client_name"] for row in clients} == {f"vineyard-{i}" for i in range(4)}
        assert read_metrics(run_dir, "round")[-1]["test_accuracy"] > 0.4  # 3 classes: trained beyond chance
