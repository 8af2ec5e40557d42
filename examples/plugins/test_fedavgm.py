"""Unit tests of ``mylab``'s FedAvgM on :mod:`fedray.testing`'s in-process federation: the real round
engine and workers, no Ray, a few seconds each. Run them from the repository root with
``python -m pytest examples/plugins/test_fedavgm.py`` (pytest puts this folder, which holds ``mylab``,
on the import path)."""

from __future__ import annotations

import torch

from fedray.testing import Federation

FEDAVGM = "algorithm.name=mylab.fedavgm:FedAvgM"


def test_without_momentum_it_is_fedavg(tmp_path):
    """β = 0, η = 1: FedAvg, up to float32 rounding (w − (w − mean) is not always mean, bit for bit)."""
    ours = Federation(tmp_path / "fedavgm", [FEDAVGM, "algorithm.server_momentum=0"]).run(2)
    fedavg = Federation(tmp_path / "fedavg", ["algorithm.name=fedavg"]).run(2)
    assert torch.allclose(ours.state["weights"], fedavg.state["weights"], rtol=0, atol=1e-6)
    assert ours.rows[-1]["test_accuracy"] == fedavg.rows[-1]["test_accuracy"]


def test_the_momentum_accumulates_the_rounds_changes(tmp_path):
    """v_1 = Δ_1 and v_2 = β v_1 + Δ_2, with Δ_t the distance from w_t to the clients' weighted mean
    (read from what reached ``aggregate``: :attr:`Federation.results`)."""
    run = Federation(tmp_path, [FEDAVGM, "algorithm.server_momentum=0.5"])
    weights = [run.state["weights"].clone()]
    momentum = []
    for round in (1, 2):
        run.run_round(round)
        results = run.results[-1]
        delta = (weights[-1].double() - results.sums["weights"] / results.sums["num_samples"]).float()
        momentum.append(delta if round == 1 else 0.5 * momentum[-1] + delta)
        weights.append(run.state["weights"].clone())
        assert torch.allclose(run.state["momentum"], momentum[-1])
    assert run.rows[-1]["server_step_norm"] > 0


def test_one_client_step_by_hand(tmp_path):
    """A single client's update, outside a round: FedAvg's local SGD, weighted by its samples."""
    run = Federation(tmp_path, [FEDAVGM])
    update = run.client_update(round=1, client_id=0)
    assert float(update.sums["num_samples"]) == len(run.client_context(1, 0).y)
    assert not torch.equal(update.sums["weights"] / update.sums["num_samples"], run.state["weights"].double())
