"""A backdoor run end to end (``examples/backdoor_median_digits.yaml``, ``resources.backend: local``,
tiny): every evaluated round row reports ``attack_success_rate`` beside ``test_accuracy``, with the
median rule and with FedAvg's weighted mean, and each round has its 3 attackers."""

from __future__ import annotations

from pathlib import Path

import pytest

import fedray
from fedray.tracking import read_metrics

REPO = Path(__file__).resolve().parents[2]
TINY = [
    "resources.backend=local",
    "data.num_clients=10",
    "train.clients_per_round=10",
    "train.rounds=3",
    "eval.every=2",  # rounds 2 and 3 (the last) are evaluated, round 1 is not
    "checkpoint.every=3",
    "output.tensorboard=false",
    "output.plots=false",
]


@pytest.mark.parametrize("rule", ["median", "none"])
@pytest.mark.slow
def test_a_backdoor_run_reports_attack_success_rate_in_every_evaluated_row(tmp_path, rule):
    config = fedray.load_config(
        REPO / "examples" / "backdoor_median_digits.yaml", [f"output.dir={tmp_path}", "output.name=run", *TINY, f"robust.rule={rule}"]
    )
    assert config.robust.attack == "backdoor" and config.robust.attackers_per_round == 3
    fedray.run_experiment(config, progress=False)
    rows = read_metrics(tmp_path / "run", "round")
    assert [row["round"] for row in rows] == [1, 2, 3]
    assert [row["malicious_clients"] for row in rows] == [3.0, 3.0, 3.0]
    evaluated = [row["round"] for row in rows if row["test_accuracy"] is not None]
    assert evaluated == [2, 3]
    reported = [row["round"] for row in rows if row["attack_success_rate"] is not None]
    assert reported == evaluated
    assert all(0.0 <= row["attack_success_rate"] <= 1.0 for row in rows if row["round"] in evaluated)
