"""``fedray.run_sweep`` from Python (a notebook, a script): the outcome it returns gives the trials
table, the best trial and its run config; and a sweep after a run in the same process prints only
its progress line, not the trials' own output."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import yaml

import fedray
from fedray.config import RunConfig

pytestmark = [pytest.mark.slow, pytest.mark.ray]

REPO = Path(__file__).resolve().parents[2]
TINY_BASE = {
    "data": {"num_clients": 4, "alpha": 1.0},
    "train": {"rounds": 2, "clients_per_round": 4, "lr": 0.1},
    "checkpoint": {"every": 1},
    "resources": {"num_workers": 1, "cpus_per_worker": 1},
    "output": {"tensorboard": False, "plots": False},
}


def write_sweep(directory: Path, base: dict, space: dict) -> Path:
    path = directory / "sweep.yaml"
    path.write_text(yaml.safe_dump({"base": base, "output": {"dir": str(directory / "sweeps")}, "space": space}))
    return path


def test_run_sweep_returns_the_trials_the_best_trial_and_its_config(ray_session, tmp_path):
    sweep_file = write_sweep(tmp_path, TINY_BASE, {"train.lr": {"grid": [1e-6, 0.1]}})
    outcome = fedray.run_sweep(fedray.load_sweep(sweep_file))

    assert outcome.status == "finished" and outcome.sweep_dir.parent == tmp_path / "sweeps"
    trials = outcome.trials
    assert isinstance(trials, pd.DataFrame) and len(trials) == 2
    assert {"trial_id", "status", "train.lr", "best_metric", "best_round", "run_dir"} <= set(trials.columns)
    best = outcome.best_trial
    assert best["train.lr"] == 0.1  # 1e-6 barely moves the model: chance level
    assert best["best_metric"] == trials["best_metric"].max()
    config = outcome.best_config
    assert isinstance(config, RunConfig)
    assert config.train.lr == 0.1 and config.train.rounds == 2
    assert config == fedray.load_config(outcome.sweep_dir / best["run_dir"] / "config.yaml")


SWEEP_AFTER_A_RUN = textwrap.dedent(
    """
    import sys
    import fedray

    base = {**BASE, "resources": {**BASE["resources"], "backend": "ray"}, "output": {**BASE["output"], "dir": "runs"}}
    fedray.run_experiment(fedray.build_config(base), progress=False)  # leaves its local Ray up
    print("MARK the sweep begins", flush=True)
    outcome = fedray.run_sweep(fedray.load_sweep(sys.argv[1]))
    print("MARK the sweep ended", outcome.status, flush=True)
    """
)


def test_a_sweep_after_a_run_in_the_same_process_prints_no_trial_output(tmp_path):
    """``run_experiment`` leaves its local Ray up, copying every process's output to the caller: the
    sweep stops it and starts its own, so its trials' lines (Tune's "Checkpoint successfully
    created" for every round) stay out of the notebook."""
    sweep_file = write_sweep(tmp_path, TINY_BASE, {"train.lr": {"grid": [0.1, 0.05]}})
    script = f"BASE = {TINY_BASE!r}\n{SWEEP_AFTER_A_RUN}"
    result = subprocess.run(
        [sys.executable, "-c", script, str(sweep_file)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO), "RAY_ADDRESS": ""},
    )
    assert result.returncode == 0, result.stdout[-3000:]
    assert "MARK the sweep ended finished" in result.stdout
    during_the_sweep = result.stdout.partition("MARK the sweep begins")[2]
    assert "Checkpoint successfully created" not in during_the_sweep, during_the_sweep[-3000:]
    assert "pid=" not in during_the_sweep, during_the_sweep[-3000:]  # no line copied from a Ray worker process
