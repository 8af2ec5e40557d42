"""Warm trials (``reuse_workers``): trials run one after another in the same trial process, server and
workers, and give the results of a standalone run of their config; a crashed trial takes its process
with it and the next trial starts a new one."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from fedray import load_config
from fedray.runtime import run_experiment
from fedray.tracking import read_metrics
from fedray.tune import parse_sweep, run_sweep
from test_e2e_tune import TINY_BASE

# the module-scoped sweep feeds three tests: on one process under pytest -n
pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.xdist_group("tune_reuse_sweep")]

# tiny trials of 1 worker; 2 rounds (ASHA's one rung is round 1, so a trial it stops ends mid-run),
# a checkpoint after round 2
BASE = {**TINY_BASE, "data": {"num_clients": 6, "alpha": 1.0}, "train": {**TINY_BASE["train"], "rounds": 2}}


def sweep(tmp_path: Path, space: dict, **fields):
    spec = parse_sweep(
        {"name": "warm", "base": BASE, "space": space, "max_concurrent_trials": 1, "output": {"dir": str(tmp_path / "sweeps")}, **fields},
        tmp_path / "warm.yaml",
        tmp_path,
    )
    outcome = run_sweep(spec)
    trials = pq.read_table(outcome.sweep_dir / "trials.parquet").to_pylist()
    return outcome, sorted(trials, key=lambda row: row["trial_id"])  # Tune's order, in which they ran


def placement(sweep_dir: Path, trial: dict) -> dict:
    return json.loads((sweep_dir / trial["run_dir"] / "placement.json").read_text())


def assert_same_as_standalone(sweep_dir: Path, trial: dict, out_dir: Path) -> None:
    """Every metric of every round the trial ran, except the timing, equals a standalone run of its config.
    The standalone run is on the local backend, bit-identical to Ray's by design (``tests/runtime/test_backends.py``)."""
    # Quoted: --set values are YAML, and a trial id such as 43754_00002 would read as the integer 4375400002.
    overrides = [f"output.dir={out_dir}", f"output.name='{trial['trial_id']}'", "resources.backend=local"]
    config = load_config(sweep_dir / trial["run_dir"] / "config.yaml", overrides)
    summary = run_experiment(config, progress=False)
    strip = lambda rows: [{k: v for k, v in row.items() if k != "seconds"} for row in rows]  # noqa: E731
    warm = strip(read_metrics(sweep_dir / trial["run_dir"], "round"))
    standalone = strip(read_metrics(Path(summary.run_dir), "round"))
    assert len(warm) == trial["round"] and warm == standalone[: len(warm)], f"trial {trial['trial_id']} differs from a standalone run"


def test_warm_trials_reuse_the_pool_and_match_standalone_runs(ray_session, tmp_path):
    # One trial at a time: every trial after the first reuses the first one's process, placement group
    # and worker process, across a change of algorithm (SCAFFOLD keeps client state) and of data.
    outcome, trials = sweep(tmp_path, {"algorithm.name": {"grid": ["fedavg", "scaffold"]}, "data.alpha": {"grid": [1.0, 0.3]}})
    assert outcome.status == "finished" and [t["status"] for t in trials] == ["TERMINATED"] * 4
    placements = [placement(outcome.sweep_dir, t) for t in trials]
    assert len({p["placement_group_id"] for p in placements}) == 1
    assert len({tuple(p["worker_pids"]) for p in placements}) == 1
    assert all(p["worker_placement_group_ids"] == [p["placement_group_id"]] for p in placements)
    for trial in trials:
        assert_same_as_standalone(outcome.sweep_dir, trial, tmp_path / "standalone")


@pytest.fixture(scope="module")
def stopped_and_crashed(ray_session, tmp_path_factory):
    """One trial at a time: ASHA stops the hopeless second trial after round 1 (Tune ends it at its
    report, between rounds) and the third runs after it; the fourth diverges (deterministic: it errors
    at once, without retry, its reason in the trials table) and the fifth runs after it."""
    tmp_path = tmp_path_factory.mktemp("reuse")
    outcome, trials = sweep(
        tmp_path,
        {"train.lr": {"grid": [0.1, 1e-6, 0.05, 1e12, 0.08]}},
        scheduler={"type": "asha", "grace_period": 1, "reduction_factor": 2},
        max_failures=0,
    )
    return outcome, trials, tmp_path


def test_a_crashed_trial_does_not_leave_its_pool_to_the_next_trial(stopped_and_crashed):
    # The diverged trial's pool is discarded, so the next trial runs with new workers and still matches
    # its standalone run (for the rounds ASHA let it run).
    outcome, trials, tmp_path = stopped_and_crashed
    assert len(trials) == 5 and (trials[3]["train.lr"], trials[3]["status"]) == (1e12, "ERROR")
    assert trials[4]["train.lr"] == 0.08 and trials[4]["status"] in ("TERMINATED", "STOPPED_EARLY")
    assert "training diverged" in trials[3]["error"]
    before, after = placement(outcome.sweep_dir, trials[2]), placement(outcome.sweep_dir, trials[4])
    assert set(before["worker_pids"]).isdisjoint(after["worker_pids"])
    assert_same_as_standalone(outcome.sweep_dir, trials[4], tmp_path / "standalone")


def test_a_trial_stopped_by_asha_leaves_a_pool_the_next_trial_reuses(stopped_and_crashed):
    # The trial after the one ASHA stopped runs on the same workers (as the two before did) and
    # matches its standalone run for the rounds it ran.
    outcome, trials, tmp_path = stopped_and_crashed
    assert [(t["train.lr"], t["status"], t["round"]) for t in trials[:2]] == [(0.1, "TERMINATED", 2), (1e-6, "STOPPED_EARLY", 1)]
    assert trials[2]["train.lr"] == 0.05 and trials[2]["status"] in ("TERMINATED", "STOPPED_EARLY")
    assert len({tuple(placement(outcome.sweep_dir, t)["worker_pids"]) for t in trials[:3]}) == 1
    assert_same_as_standalone(outcome.sweep_dir, trials[2], tmp_path / "standalone")


def test_a_failed_trial_logs_its_traceback(stopped_and_crashed):
    # The diverged trial's log.txt (real Ray trial): the server actor's warning of the round that fails,
    # relayed to the trial before its error, then the whole traceback.
    outcome, trials, _ = stopped_and_crashed
    diverged = trials[3]
    log = (outcome.sweep_dir / diverged["run_dir"] / "log.txt").read_text()
    assert f"trial {diverged['trial_id']} started from round 1 of 2" in log
    assert re.search(r"round 1: \d+ non-finite client update\(s\) excluded: \[", log)
    assert log.index("excluded") < log.index("the trial failed:\nTraceback (most recent call last):")
    assert "fedray.runtime.errors.TrainingDiverged" in log and "training diverged" in log
