"""CKA maths and the consensus kernel of Hetero-SSFL (docs/algorithms_hetero_ssfl.md, "Properties the
tests check")."""

from __future__ import annotations

import pytest
import torch

from fedray.algorithms.cka import (
    alignment_distance,
    center_gram,
    cka,
    consensus,
    consensus_block,
    feature_cka,
    gram,
)

ESTIMATORS = ["biased", "debiased"]
TOL = 1e-4  # the maths runs in float32


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def random_orthogonal(d: int, seed: int) -> torch.Tensor:
    q, _ = torch.linalg.qr(randn(d, d, seed=seed))
    return q


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_p1_identical_representations_have_cka_one_and_zero_distance(estimator):
    a = randn(64, 12)
    similarity = cka(gram(a), gram(a), estimator)
    assert similarity.item() == pytest.approx(1.0, abs=TOL)
    assert alignment_distance(similarity).item() == pytest.approx(0.0, abs=TOL)


def test_p2_p3_symmetric_and_in_unit_interval():
    for seed in range(5):
        x, y = randn(50, 7, seed=seed), randn(50, 30, seed=seed + 100) + randn(50, 30, seed=seed) * 0.1
        forward, backward = cka(gram(x), gram(y)), cka(gram(y), gram(x))
        assert forward.item() == pytest.approx(backward.item(), abs=1e-6)
        assert 0.0 <= forward.item() <= 1.0 + 1e-6


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_p4_invariant_to_orthogonal_maps_isotropic_scaling_and_translation(estimator):
    x = randn(100, 16)
    for seed, scale in [(1, 2.5), (2, -0.3), (3, 40.0)]:
        moved = scale * x @ random_orthogonal(16, seed) + randn(1, 16, seed=seed) * 3
        assert cka(gram(x), gram(moved), estimator).item() == pytest.approx(1.0, abs=TOL)


def test_p5_not_invariant_to_an_ill_conditioned_invertible_map():
    """The paper claims invariance to invertible linear maps; linear CKA does not have it."""
    x = randn(100, 16)
    m = torch.diag(torch.logspace(0, 3, 16)) @ randn(16, 16, seed=5)
    assert torch.linalg.matrix_rank(m) == 16  # invertible
    assert cka(gram(x), gram(x @ m)).item() < 0.9


def test_p6_widths_may_differ():
    x, y = randn(40, 16), randn(40, 2048, seed=1)
    similarity = cka(gram(x), gram(y))
    assert torch.isfinite(similarity) and 0.0 <= similarity.item() <= 1.0


def test_p7_feature_form_equals_kernel_form_and_factor_form_equals_kernel():
    x = randn(60, 9)
    parts = [randn(60, 5, seed=1), randn(60, 20, seed=2), randn(60, 3, seed=3)]
    weights = torch.tensor([0.5, 0.3, 0.2])
    kernel = consensus(parts, weights, "kernel")
    factor = consensus(parts, weights, "factor")
    expected = sum(w * a @ a.T for w, a in zip(weights, parts))
    torch.testing.assert_close(kernel, expected, atol=1e-4, rtol=1e-5)
    assert factor.shape == (60, 5 + 20 + 3)
    assert cka(gram(x), kernel).item() == pytest.approx(feature_cka(x, factor).item(), abs=TOL)
    assert cka(gram(x), gram(parts[1])).item() == pytest.approx(feature_cka(x, parts[1]).item(), abs=TOL)
    index = torch.tensor([7, 3, 59, 0, 12])
    torch.testing.assert_close(consensus_block(kernel, index, "kernel"), consensus_block(factor, index, "factor"), atol=1e-4, rtol=1e-5)


def test_p21_blocks_read_the_rows_of_the_mini_batch():
    """An "identity encoder": the block of rows I is exactly K[I, I] of the uploaded representation."""
    a = torch.arange(12.0).view(6, 2)
    index = torch.tensor([4, 1, 5])
    assert torch.equal(consensus_block(consensus([a], torch.ones(1)), index), a[index] @ a[index].T)


def test_p8_block_centring_differs_from_slicing_a_globally_centred_kernel():
    a = randn(300, 8)
    a[:150] += 2.0  # the mini-batch comes from the shifted half: its mean differs from the RAD's
    z = a + randn(300, 8, seed=1)
    kernel = gram(a)
    index = torch.arange(0, 150, 2)
    block_centred = cka(gram(z[index]), consensus_block(kernel, index))  # centres K̄[I, I] with H_b
    globally_centred = center_gram(kernel)[index][:, index]
    sliced = (center_gram(gram(z[index])) * globally_centred).sum() / (
        torch.linalg.norm(center_gram(gram(z[index]))) * torch.linalg.norm(globally_centred)
    )
    assert abs(block_centred.item() - sliced.item()) > 1e-3


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_p9_a_collapsed_representation_gives_finite_value_and_gradient(estimator):
    z = torch.ones(32, 8, requires_grad=True)
    similarity = cka(gram(z), gram(randn(32, 8)), estimator)
    similarity.backward()
    assert torch.isfinite(similarity) and abs(similarity.item()) < 1e-3
    assert torch.isfinite(z.grad).all()


def test_p10_sign_guard_descent_on_one_minus_cka_aligns_and_the_literal_sign_repels():
    """Adam on a free Z (200 × 32) against a target from a width-8 A: random-init CKA is low (two
    random width-2048 matrices would already give ≈ 0.91)."""
    target = gram(randn(200, 8))

    def descend(distance: str, steps: int = 300) -> tuple[float, float]:
        z = randn(200, 32, seed=1).requires_grad_(True)
        optimizer = torch.optim.Adam([z], lr=0.01)
        start = cka(gram(z), target).item()
        for _ in range(steps):
            loss = alignment_distance(cka(gram(z), target), distance)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return start, cka(gram(z), target).item()

    start, aligned = descend("one_minus_cka")
    assert start < 0.2 and aligned > 0.95
    assert descend("neg_cka")[1] == pytest.approx(aligned, abs=1e-4)  # same gradient as 1 - CKA
    assert descend("cka_literal", steps=50)[1] < start  # the paper's literal sign pushes apart


def test_debiased_estimator_removes_the_small_batch_bias():
    """Two independent 200 × 2048 Gaussians: biased CKA ≈ 0.91, debiased ≈ 0 (the small-batch bias)."""
    a, b = randn(200, 2048), randn(200, 2048, seed=1)
    assert cka(gram(a), gram(b)).item() > 0.85
    assert abs(cka(gram(a), gram(b), "debiased").item()) < 0.05


def test_p12_p13_consensus_is_symmetric_psd_and_order_free():
    parts = [randn(50, d, seed=d) for d in (4, 16, 64)]
    weights = torch.full((3,), 1 / 3)
    kernel = consensus(parts, weights)
    assert kernel.shape == (50, 50)
    torch.testing.assert_close(kernel, kernel.T)
    assert torch.linalg.eigvalsh(kernel.double()).min() >= -1e-5 * torch.linalg.norm(kernel)
    permuted = consensus(parts[::-1], weights)
    torch.testing.assert_close(kernel, permuted, atol=1e-4, rtol=1e-5)


def test_p14_rotated_and_scaled_copies_of_one_representation_agree_with_the_consensus():
    a = randn(80, 10)
    parts = [c * a @ random_orthogonal(10, seed) for seed, c in [(1, 1.0), (2, -3.0), (3, 0.2)]]
    kernel = consensus(parts, torch.full((3,), 1 / 3))
    for part in parts:
        assert alignment_distance(cka(gram(part), kernel)).item() == pytest.approx(0.0, abs=TOL)


def test_p24_kernels_and_cka_compute_in_float32():
    x = randn(30, 6).to(torch.bfloat16)
    assert gram(x).dtype == torch.float32
    assert cka(gram(x).half(), gram(x).half()).dtype == torch.float32
    assert consensus([x], torch.ones(1)).dtype == torch.float32


def test_unknown_options_are_rejected_with_the_allowed_values():
    with pytest.raises(ValueError, match="allowed: biased, debiased"):
        cka(torch.eye(4), torch.eye(4), "unbiased")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="one_minus_cka"):
        alignment_distance(torch.tensor(0.5), "cosine")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least 4 samples"):
        cka(torch.eye(3), torch.eye(3), "debiased")
