"""FedLC's logit-calibrated loss, Ray-free."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from fedray.algorithms.losses import logit_calibrated_cross_entropy

from fedray.testing import Federation
from federation_helpers import assert_same_round_as


def test_zero_tau_is_fedavg(tmp_path):
    assert_same_round_as(tmp_path, ["algorithm.name=fedlc", "algorithm.calibration_tau=0"], ["algorithm.name=fedavg"])


def test_calibration_changes_the_local_training(tmp_path):
    fedlc, fedavg = Federation(tmp_path / "lc", ["algorithm.name=fedlc"]), Federation(tmp_path / "avg", ["algorithm.name=fedavg"])
    fedlc.run_round(1, [0, 1])
    fedavg.run_round(1, [0, 1])
    assert not torch.allclose(fedlc.state["weights"], fedavg.state["weights"], atol=1e-4)


def test_equal_counts_give_plain_cross_entropy():
    logits, labels = torch.randn(6, 4, generator=torch.Generator().manual_seed(0)), torch.tensor([0, 1, 2, 3, 0, 1])
    calibrated = logit_calibrated_cross_entropy(logits, labels, torch.full((4,), 25), tau=1.0)
    assert torch.allclose(calibrated, F.cross_entropy(logits, labels), atol=1e-6)


def test_absent_classes_get_no_gradient_and_the_loss_stays_finite():
    logits = torch.randn(5, 4, generator=torch.Generator().manual_seed(1), requires_grad=True)
    labels = torch.tensor([0, 1, 0, 1, 1])
    loss = logit_calibrated_cross_entropy(logits, labels, torch.tensor([3, 2, 0, 0]), tau=1.0)
    loss.backward()
    assert math.isfinite(float(loss.detach()))
    assert torch.equal(logits.grad[:, 2:], torch.zeros(5, 2)) and bool((logits.grad[:, :2] != 0).all())
    clamped = logit_calibrated_cross_entropy(logits, labels, torch.tensor([3, 2, 0, 0]), tau=1.0, absent_classes="clamp")
    assert math.isfinite(float(clamped.detach()))


def test_the_margin_grows_as_the_class_count_shrinks():
    logits, label = torch.zeros(1, 2), torch.tensor([0])
    losses = [float(logit_calibrated_cross_entropy(logits, label, torch.tensor([n, 100]), tau=1.0)) for n in (100, 30, 5, 1)]
    assert losses == sorted(losses) and losses[0] < losses[-1]  # a rarer true class is pushed harder


def test_three_class_toy_matches_the_hand_computed_value():
    logits, counts, tau = [2.0, 0.5, -1.0], [16, 1, 81], 0.5
    shifted = [z - tau * n**-0.25 for z, n in zip(logits, counts)]
    expected = -(shifted[1] - math.log(sum(math.exp(s) for s in shifted)))
    loss = logit_calibrated_cross_entropy(torch.tensor([logits]), torch.tensor([1]), torch.tensor(counts), tau=tau)
    assert float(loss) == pytest.approx(expected, rel=1e-6)
