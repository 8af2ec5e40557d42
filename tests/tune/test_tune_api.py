"""``fedray.run_sweep`` from Python (a notebook, a script): the outcome it returns gives the trials
table, the best trial and its run config; a trial whose config fails only inside the trial errors once
and is listed; and a sweep after a run in the same process prints only its progress line, not the
trials' own output. All of it from one sweep, run by one Python process after a run."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

import fedray
from fedray.config import RunConfig

# one xdist group: with pytest -n, the tests of the one module-scoped sweep run on one worker, which makes it once
pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.xdist_group("tune_api_sweep")]

REPO = Path(__file__).resolve().parents[2]
TINY_BASE = {
    "data": {"num_clients": 4, "alpha": 1.0},
    "train": {"rounds": 2, "clients_per_round": 4, "lr": 0.1},
    "checkpoint": {"every": 1},
    "resources": {"num_workers": 1, "cpus_per_worker": 1},
    "output": {"tensorboard": False, "plots": False},
}


def write_sweep(directory: Path, base: dict, space: dict, **fields) -> Path:
    path = directory / "sweep.yaml"
    path.write_text(yaml.safe_dump({"base": base, "output": {"dir": str(directory / "sweeps")}, "space": space, **fields}))
    return path


SWEEP_AFTER_A_RUN = textwrap.dedent(
    """
    import pickle
    import sys
    import fedray

    base = {**BASE, "train": {**BASE["train"], "rounds": 1}, "resources": {**BASE["resources"], "backend": "ray"}}
    base["output"] = {**BASE["output"], "dir": "runs"}
    fedray.run_experiment(fedray.build_config(base), progress=False)  # leaves its local Ray up
    print("MARK the sweep begins", flush=True)
    spec = fedray.load_sweep(sys.argv[1])
    spec.per_algorithm["fedprox"].append("data.num_clients=5000")  # after validation: fails only in the trial
    outcome = fedray.run_sweep(spec)
    print("MARK the sweep ended", outcome.status, flush=True)
    with open("outcome.pickle", "wb") as file:
        pickle.dump(outcome, file)  # what run_sweep returned, for the tests
    """
)


@pytest.fixture(scope="module")
def api_sweep(tmp_path_factory):
    """A Python process, as a notebook or a script would be, that runs one round of a run on a local Ray
    (``run_experiment`` leaves it up) and then calls ``fedray.run_sweep`` of FedAvg and FedProx at a
    useless and a good learning rate, one trial at a time. Validation before Ray catches config
    errors; one that only shows in the trial when it loads its data (here: the sweep's per-algorithm
    overrides changed after validation to more clients than samples, as data missing on a worker node
    would) fails both FedProx trials. Returns the ``SweepOutcome`` that ``run_sweep`` returned
    (pickled by that process), the sweep's directory's parent and the process's output."""
    tmp_path = tmp_path_factory.mktemp("api")
    sweep_file = write_sweep(
        tmp_path,
        TINY_BASE,
        {"algorithm.name": {"grid": ["fedavg", "fedprox"]}, "train.lr": {"grid": [1e-6, 0.1]}},
        per_algorithm={"fedprox": ["algorithm.mu=0.1"]},
        max_failures=3,
        max_concurrent_trials=1,
    )
    result = subprocess.run(
        [sys.executable, "-c", f"BASE = {TINY_BASE!r}\n{SWEEP_AFTER_A_RUN}", str(sweep_file)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO), "RAY_ADDRESS": ""},
    )
    assert result.returncode == 0, result.stdout[-3000:]
    with open(tmp_path / "outcome.pickle", "rb") as file:
        outcome = pickle.load(file)
    return outcome, tmp_path, result.stdout


def test_run_sweep_returns_the_trials_the_best_trial_and_its_config(api_sweep):
    outcome, tmp_path, _ = api_sweep
    assert outcome.status == "finished" and outcome.sweep_dir.parent == tmp_path / "sweeps"
    trials = outcome.trials
    assert isinstance(trials, pd.DataFrame) and len(trials) == 4
    assert {"trial_id", "status", "train.lr", "best_metric", "best_round", "run_dir"} <= set(trials.columns)
    best = outcome.best_trial
    assert (best["algorithm.name"], best["train.lr"]) == ("fedavg", 0.1)  # 1e-6 barely moves the model: chance level
    assert best["best_metric"] == trials["best_metric"].max()
    config = outcome.best_config
    assert isinstance(config, RunConfig)
    assert config.train.lr == 0.1 and config.train.rounds == 2
    assert config == fedray.load_config(outcome.sweep_dir / best["run_dir"] / "config.yaml")


def test_a_trial_that_fails_on_its_config_errors_once_and_is_listed(api_sweep, capsys):
    # The trial must end at once (no retry despite max_failures), and be listed, not dropped.
    from fedray.cli.tune import print_outcome

    outcome, _, _ = api_sweep
    assert (outcome.num_errors, outcome.num_unfinished, outcome.status) == (2, 0, "finished")
    trials = pq.read_table(outcome.sweep_dir / "trials.parquet").to_pylist()
    assert {(row["algorithm.name"], row["status"]) for row in trials} == {("fedavg", "TERMINATED"), ("fedprox", "ERROR")}
    errored = [row for row in trials if row["algorithm.name"] == "fedprox"]
    for row in errored:
        assert "data.num_clients (K=5000) exceeds the number of training samples" in row["error"]
        # ended on its first attempt: Tune saw a normal end (no error file, no retry) and no round ran
        assert not list((outcome.sweep_dir / "tune" / outcome.sweep_dir.name / row["trial_id"]).glob("error.*"))
        assert not list((outcome.sweep_dir / "trials" / row["trial_id"]).glob("checkpoints/*"))
    print_outcome(outcome.sweep_dir, 5)
    printed = capsys.readouterr().out
    assert "errored trials" in printed and all(row["trial_id"] in printed.split("errored trials", 1)[1] for row in errored)
    comparison = (outcome.sweep_dir / "comparison.md").read_text()
    assert "| fedprox | 1 errored | 1 errored |" in comparison and "### errored trials (2)" in comparison, comparison


def test_a_sweep_after_a_run_in_the_same_process_prints_no_trial_output(api_sweep):
    """``run_experiment`` leaves its local Ray up, copying every process's output to the caller: the
    sweep stops it and starts its own, so its trials' lines (Tune's "Checkpoint successfully
    created" for every round) stay out of the notebook."""
    outcome, _, output = api_sweep
    assert "MARK the sweep ended finished" in output and outcome.status == "finished"
    during_the_sweep = output.partition("MARK the sweep begins")[2]
    assert "Checkpoint successfully created" not in during_the_sweep, during_the_sweep[-3000:]
    assert "pid=" not in during_the_sweep, during_the_sweep[-3000:]  # no line copied from a Ray worker process
