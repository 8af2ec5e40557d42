"""FedDecorr's decorrelation regulariser, Ray-free."""

from __future__ import annotations

import pytest
import torch

from fedray.algorithms.losses import decorrelation_loss

from fedray.testing import Federation
from federation_helpers import assert_same_round_as


def features(seed: int = 0, n: int = 16, d: int = 6) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed))


def test_zero_beta_is_fedavg(tmp_path):
    assert_same_round_as(tmp_path, ["algorithm.name=feddecorr", "algorithm.beta=0"], ["algorithm.name=fedavg"])


def test_the_regulariser_is_active_in_training(tmp_path):
    federation = Federation(tmp_path, ["algorithm.name=feddecorr", "algorithm.beta=0.1"])
    update = federation.algorithm.client_update(
        federation.worker.client_context(1, 0, -1), federation.algorithm.broadcast(federation.state, 1)
    )
    assert update.metrics["decorrelation"] > 0


def test_it_is_non_negative():
    for seed in range(5):
        assert float(decorrelation_loss(features(seed))) >= 0


def test_per_column_scaling_and_shifts_leave_it_unchanged():
    z = features(1)
    scale, shift = torch.linspace(0.5, 4.0, z.shape[1]), torch.linspace(-3.0, 3.0, z.shape[1])
    assert torch.allclose(decorrelation_loss(z * scale + shift), decorrelation_loss(z), rtol=1e-4)


def test_it_is_about_zero_for_centred_orthogonal_columns():
    basis = torch.cat([torch.ones(32, 1), features(2, n=32, d=5)], dim=1)
    q, _ = torch.linalg.qr(basis)
    z = q[:, 1:]  # orthonormal columns, all orthogonal to the ones vector, hence centred
    assert float(z.mean(dim=0).abs().max()) < 1e-6
    assert float(decorrelation_loss(z)) < 1e-8


def test_a_single_sample_gives_zero():
    z = features(3, n=1).requires_grad_(True)
    loss = decorrelation_loss(z)
    assert float(loss.detach()) == 0.0
    loss.backward()  # still part of the graph


def test_two_identical_columns_match_the_hand_computed_value():
    n = 10
    column = torch.arange(n, dtype=torch.float32).unsqueeze(1)
    # standardised with the unbiased variance, Σ ẑ² = (n − 1) var/(var + 1e-8) ≈ n − 1 for both the
    # diagonal and the one off-diagonal pair, so mean_{i≠j} M_ij² / n = (n − 1)² / n
    assert float(decorrelation_loss(torch.cat([column, column], dim=1))) == pytest.approx((n - 1) ** 2 / n, rel=1e-5)
