"""User code under ``fedray tune`` on a real local Ray (issue 40: "a user module with its own model and
dataset under fedray run and fedray tune"): one sweep whose trials use a researcher's out-of-tree
algorithm (``mylab.fedavgm:FedAvgM``, a copy of ``examples/plugins/mylab``) and run callback
(``mylab.loggers:JsonLinesLogger``), and their own model and dataset from one module of theirs
(``lab:WineNet`` on ``lab:vineyards``). The sweep varies a key of the user's model
(``model.kwargs.hidden``, a grid) and a parameter of the user's algorithm (``algorithm.server_momentum``,
a choice). The trials, created by Tune, import both from the job's runtime_env, which the separate
``fedray tune`` process sets when it starts its own local Ray (PYTHONPATH holds only fedray; the
``--address`` branch, joining a running Ray, is proven with user code by
``test_e2e_tune_failures.py``); each trial's server and workers import them from the server's. The
data's natural client ids reach the client rows."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from fedray.tracking import read_metrics

REPO = Path(__file__).resolve().parents[2]
PLUGINS = REPO / "examples" / "plugins"

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
def test_fedray_tune_runs_a_users_algorithm_callback_model_and_dataset_in_every_trial(tmp_path):
    shutil.copytree(PLUGINS, tmp_path, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))  # mylab/
    (tmp_path / "lab.py").write_text(LAB_MODULE)
    base = {
        "algorithm": {"name": "mylab.fedavgm:FedAvgM"},
        "data": {"name": "lab:vineyards", "partition": "natural", "num_clients": 4, "test_fraction": 0.25},
        "model": {"name": "lab:WineNet"},
        "train": {"rounds": 3, "clients_per_round": 4, "local_epochs": 2, "batch_size": 8, "lr": 0.1},
        "checkpoint": {"every": 3},
        "resources": {"num_workers": 1},
        "output": {"tensorboard": False, "plots": False, "callbacks": ["mylab.loggers:JsonLinesLogger"]},
    }
    sweep = {
        "base": base,
        "space": {"model.kwargs.hidden": {"grid": [4, 32]}, "algorithm.server_momentum": {"choice": [0.0, 0.5]}},
        "output": {"dir": str(tmp_path / "sweeps")},
        "max_concurrent_trials": 1,
    }
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(sweep))
    result = subprocess.run(
        [sys.executable, "-m", "fedray.cli.main", "tune", "sweep.yaml"],
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
        saved = yaml.safe_load((run_dir / "config.yaml").read_text())
        assert saved["model"]["kwargs"] == {"hidden": trial["model.kwargs.hidden"]}
        assert trial["algorithm.server_momentum"] in (0.0, 0.5)
        assert saved["algorithm"]["server_momentum"] == trial["algorithm.server_momentum"]  # the swept plug-in parameter
        clients = read_metrics(run_dir, "client")
        assert {row["client_name"] for row in clients} == {f"vineyard-{i}" for i in range(4)}
        rows = read_metrics(run_dir, "round")
        assert rows[-1]["test_accuracy"] > 0.4  # 3 classes: trained beyond chance
        assert len(rows) == 3 and all(row["server_step_norm"] > 0 for row in rows)  # FedAvgM's own aggregate ran
        logged = [json.loads(line) for line in (run_dir / "rounds.jsonl").read_text().splitlines()]
        assert [row["round"] for row in logged] == [1, 2, 3]  # the out-of-tree callback saw every round of the trial
