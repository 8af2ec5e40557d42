"""Schedulers end to end on the session's real local Ray: PBT clones a trial from another trial's
engine checkpoint. (ASHA makes the same decisions after an interrupted sweep is resumed, twice: after
Ctrl+C and after SIGKILL, in
``test_e2e_tune.py::test_an_interrupted_then_killed_asha_sweep_resumes_with_the_decisions_of_an_uninterrupted_one``.)"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from fedray.cli.main import main
from fedray import load_config
from fedray.tracking import read_metrics

from test_e2e_tune import TINY_BASE, rows_by_trial

pytestmark = [pytest.mark.slow, pytest.mark.ray]


def write_sweep(path: Path, **fields) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"base": TINY_BASE, "output": {"dir": str(path.parent / "sweeps")}, **fields}))
    return path


def test_pbt_clones_a_trial_from_the_donors_engine_checkpoint_with_a_perturbed_config(ray_session, tmp_path):
    # Two trials side by side, synchronous PBT: at round 2 the worse one is restarted from the better
    # one's engine checkpoint with the learning rate perturbed, and continues to round 3.
    sweep_file = write_sweep(
        tmp_path / "sweep.yaml",
        name="pbt",
        base={**TINY_BASE, "train": {**TINY_BASE["train"], "rounds": 3}, "checkpoint": {"every": 2}},
        space={"train.lr": {"loguniform": [1e-5, 0.2]}},
        num_samples=2,
        search={"type": "random", "seed": 3},
        scheduler={"type": "pbt", "perturbation_interval": 2, "quantile_fraction": 0.5, "synch": True},
    )
    assert main(["tune", str(sweep_file)]) == 0
    [sweep_dir] = (tmp_path / "sweeps").iterdir()
    trials = rows_by_trial(sweep_dir)
    assert {row["status"] for row in trials.values()} == {"TERMINATED"}
    cloned = [t for t in trials if (sweep_dir / "trials" / t / "exploits.json").is_file()]
    assert len(cloned) == 1, "no exploit happened"
    [recipient] = cloned
    [exploit] = json.loads((sweep_dir / "trials" / recipient / "exploits.json").read_text())
    donor = exploit["donor"]
    assert donor in trials and donor != recipient and exploit["round"] == 2

    donor_rows = read_metrics(sweep_dir / "trials" / donor, "round")
    recipient_rows = read_metrics(sweep_dir / "trials" / recipient, "round")
    assert [r["round"] for r in recipient_rows] == [1, 2, 3]
    # the recipient's rounds 1-2 are the donor's (it continued from the donor's round 2), round 3 its own
    assert [r["test_accuracy"] for r in recipient_rows[:2]] == [r["test_accuracy"] for r in donor_rows[:2]]
    # with the donor's learning rate, perturbed (x0.8 / x1.2, or resampled) and kept inside the domain
    new_lr = exploit["values"]["train.lr"]
    assert load_config(sweep_dir / "trials" / recipient / "config.yaml").train.lr == new_lr == trials[recipient]["train.lr"]
    assert 1e-5 <= new_lr <= 0.2 and new_lr != trials[donor]["train.lr"]
    rounds = pq.read_table(sweep_dir / "rounds.parquet").to_pylist()
    assert max(r["round"] for r in rounds if r["trial_id"] == recipient) == 3
