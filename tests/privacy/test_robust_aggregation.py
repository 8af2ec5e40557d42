"""Robust aggregation (fedray.aggregation): each rule against a direct numpy computation, the seeded
choice of attackers, and a short run in which sign-flipping clients wreck FedAvg but not the median."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedray.aggregation.attacks import attacked_delta, malicious_clients
from fedray.aggregation.robust import coordinate_median, krum, multi_krum, trimmed_mean
from fedray.testing import Federation


@pytest.fixture
def updates() -> np.ndarray:
    rng = np.random.default_rng(0)
    honest = rng.normal(0.0, 1.0, size=(7, 5))
    return np.concatenate([honest, rng.normal(30.0, 1.0, size=(2, 5))])  # two outliers


@pytest.mark.parametrize("n", [8, 9])
def test_median_is_numpys(updates, n):
    assert np.allclose(coordinate_median(torch.from_numpy(updates[:n])).numpy(), np.median(updates[:n], axis=0), rtol=0, atol=1e-15)


def test_trimmed_mean_is_the_mean_of_the_sorted_middle(updates):
    cut = int(0.25 * len(updates))  # 2 of 9 at each end
    expected = np.sort(updates, axis=0)[cut : len(updates) - cut].mean(axis=0)
    assert np.allclose(trimmed_mean(torch.from_numpy(updates), 0.25).numpy(), expected, rtol=0, atol=1e-15)


def _krum_scores(updates: np.ndarray, f: int) -> np.ndarray:
    n = len(updates)
    distances = ((updates[:, None, :] - updates[None, :, :]) ** 2).sum(axis=2)
    return np.array([np.sort(np.delete(distances[i], i))[: n - f - 2].sum() for i in range(n)])


def test_krum_and_multi_krum_pick_by_the_papers_score(updates):
    scores = _krum_scores(updates, f=2)
    assert np.allclose(krum(torch.from_numpy(updates), 2).numpy(), updates[np.argmin(scores)])
    best = np.argsort(scores, kind="stable")[:5]
    assert np.allclose(multi_krum(torch.from_numpy(updates), 2, 5).numpy(), updates[best].mean(axis=0))
    assert set(best) <= set(range(7))  # the outliers are never chosen


def test_malicious_clients_are_an_exact_seeded_share():
    mask = malicious_clients(3, 50, 0.2)
    assert mask.sum() == 10 and np.array_equal(mask, malicious_clients(3, 50, 0.2))
    assert not np.array_equal(mask, malicious_clients(4, 50, 0.2))


def test_attacks():
    delta = torch.tensor([1.0, -2.0, 2.0], dtype=torch.float64)
    assert torch.equal(attacked_delta(delta, "sign_flip", 4.0, 0, 1, 2), -4 * delta)
    assert torch.equal(attacked_delta(delta, "scaled", 4.0, 0, 1, 2), 4 * delta)
    noise = attacked_delta(delta, "random", 4.0, 0, 1, 2)
    assert float(noise.norm()) == pytest.approx(12.0) and torch.equal(noise, attacked_delta(delta, "random", 4.0, 0, 1, 2))


def test_robust_rules_collect_per_client_updates(tmp_path):
    federation = Federation(tmp_path, ["robust.rule=median"])
    federation.run_round(1, [0, 2, 5])
    results = federation.results[0]
    assert results.payloads == {} and float(results.sums["num_samples"]) == 1.0  # the rule's result, used as a mean


@pytest.mark.slow
def test_sign_flipping_clients_wreck_fedavg_but_not_the_median(tmp_path):
    """30 % of the clients upload −4Δ: the mean moves against the honest clients' direction; the
    coordinate-wise median of 10 updates with 3 attackers stays among the honest ones."""
    common = [
        "data.num_clients=10",
        "train.clients_per_round=10",
        "data.partition=iid",
        "train.lr=0.1",
        "robust.malicious_fraction=0.3",
        "robust.attack=sign_flip",
    ]
    fedavg = Federation(tmp_path / "fedavg", common).run(6)
    median = Federation(tmp_path / "median", [*common, "robust.rule=median"]).run(6)
    assert fedavg.rows[-1]["malicious_clients"] == 3.0
    assert median.rows[-1]["test_accuracy"] > 0.6
    assert fedavg.rows[-1]["test_accuracy"] < median.rows[-1]["test_accuracy"] - 0.3
