"""The one real ``fedray tune`` sweep of user code that two test modules read (issue 40: "a user module
with its own model and dataset under fedray run and fedray tune"), made once per session by the
``user_code_sweep`` fixture of ``tests/conftest.py``:

- ``tests/e2e/test_user_code_sweep.py`` checks that every trial ran the user's code;
- ``tests/dashboard/test_dashboard_browser.py`` reads the sweep directory in a browser and through
  ``DashboardData`` (what ``fedray tune`` writes is what the dashboard reads).

Both modules are in the xdist group :data:`XDIST_GROUP`, so that one pytest-xdist worker runs them and
makes the sweep once.

The sweep: a separate ``fedray tune`` process (its own local Ray; PYTHONPATH holds only fedray) in a
researcher's project directory holding ``mylab/`` (a copy of ``examples/plugins/mylab``: the algorithm
``mylab.fedavgm:FedAvgM`` and the run callback ``mylab.loggers:JsonLinesLogger``) and ``lab.py`` (the model
``lab:WineNet`` and the dataset ``lab:vineyards``, whose samples' natural client ids are their vineyards).
Two trials, ``ROUNDS`` rounds each, of all ``CLIENTS`` clients: a key of the user's model on a grid
(``model.kwargs.hidden``) and a parameter of the user's algorithm as a choice (``algorithm.server_momentum``).
Plots are on: the dashboard's run view shows each trial's ``partition.png``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
PLUGINS = REPO / "examples" / "plugins"
XDIST_GROUP = "user_code_sweep"

HIDDEN = [4, 32]  # model.kwargs.hidden, a grid: one trial each
MOMENTUM = [0.0, 0.5]  # algorithm.server_momentum, a random choice
SPACE = {"model.kwargs.hidden": {"grid": HIDDEN}, "algorithm.server_momentum": {"choice": MOMENTUM}}
ROUNDS = 3
CLIENTS = 4  # the vineyards; every round trains all of them (train.clients_per_round)
USER_MODULES = ("lab", "mylab")  # the top-level modules of the user's code

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

BASE = {
    "algorithm": {"name": "mylab.fedavgm:FedAvgM"},
    "data": {"name": "lab:vineyards", "partition": "natural", "num_clients": CLIENTS, "test_fraction": 0.25},
    "model": {"name": "lab:WineNet"},
    "train": {"rounds": ROUNDS, "clients_per_round": CLIENTS, "local_epochs": 2, "batch_size": 8, "lr": 0.1},
    "checkpoint": {"every": ROUNDS},
    "resources": {"num_workers": 1},
    "output": {"tensorboard": False, "plots": True, "callbacks": ["mylab.loggers:JsonLinesLogger"]},
}


@dataclass(frozen=True)
class UserCodeSweep:
    """What ``fedray tune`` left: its process's result, the project directory it ran in, and the sweep
    directories found in ``project/sweeps`` right after it (one, if it worked)."""

    project: Path
    result: subprocess.CompletedProcess
    sweep_dirs: tuple[Path, ...]

    @property
    def sweep_dir(self) -> Path:
        """The sweep directory; fails with the process's output if ``fedray tune`` did not make exactly one."""
        assert self.result.returncode == 0 and len(self.sweep_dirs) == 1, (
            self.sweep_dirs,
            self.result.stdout[-2000:],
            self.result.stderr[-3000:],
        )
        return self.sweep_dirs[0]


def make_user_code_sweep(project: Path) -> UserCodeSweep:
    """Writes the user's code and ``sweep.yaml`` into ``project`` and runs ``fedray tune sweep.yaml`` there."""
    shutil.copytree(PLUGINS, project, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))  # mylab/
    (project / "lab.py").write_text(LAB_MODULE)
    sweep = {"base": BASE, "space": SPACE, "output": {"dir": str(project / "sweeps")}, "max_concurrent_trials": 1}
    (project / "sweep.yaml").write_text(yaml.safe_dump(sweep, sort_keys=False))  # the space in SPACE's order
    result = subprocess.run(
        [sys.executable, "-m", "fedray.cli.main", "tune", "sweep.yaml"],
        cwd=project,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), "RAY_ADDRESS": ""},
        timeout=600,
    )
    sweeps = project / "sweeps"
    return UserCodeSweep(project, result, tuple(sorted(sweeps.iterdir())) if sweeps.is_dir() else ())


@contextmanager
def user_code_importable(project: Path) -> Iterator[None]:
    """``project``'s user code importable in this process (for ``fedray.load_config``, which imports the
    algorithm, callbacks and model a config names); its modules are forgotten afterwards, so that no later
    test imports this copy instead of its own."""
    saved_path = list(sys.path)
    sys.path.insert(0, str(project))
    try:
        yield
    finally:
        sys.path[:] = saved_path
        for name in [name for name in sys.modules if name.partition(".")[0] in USER_MODULES]:
            del sys.modules[name]
