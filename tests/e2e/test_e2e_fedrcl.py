"""FedRCL end to end with two workers on the local backend (bit-identical to two Ray workers:
tests/runtime/test_backends.py): digits, cnn_small's three taps, a few rounds."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from fedray import load_config
from fedray.runtime import run_experiment
from fedray.tracking import read_metrics

pytestmark = pytest.mark.slow
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fedrcl_digits.yaml"


def test_fedrcl_trains_on_digits_with_an_active_penalty(tiny_overrides, tmp_path):
    config = load_config(EXAMPLE, [*tiny_overrides, "resources.backend=local"])
    summary = run_experiment(config, progress=False)

    rounds = read_metrics(tmp_path / "run", "round")
    assert [r["round"] for r in rounds] == [1, 2, 3, 4]
    assert all(r["excluded_updates"] == 0 for r in rounds)
    assert summary.final_test_accuracy > 0.3  # chance is 0.1

    clients = read_metrics(tmp_path / "run", "client")
    assert len(clients) == 4 * 4
    for row in clients:
        assert all(math.isfinite(row[key]) for key in ("train_loss", "ce", "scl", "penalty"))
        assert row["train_loss"] == pytest.approx(row["ce"] + row["scl"] + row["penalty"], rel=1e-4)
    # post-ReLU cnn_small features start out highly similar: the divergence penalty is really at work
    assert all(row["penalty"] > 0 for row in clients)
