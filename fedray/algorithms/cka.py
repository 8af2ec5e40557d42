"""Centred kernel alignment (CKA) and Hetero-SSFL's consensus kernel (docs/algorithms_hetero_ssfl.md).

Linear CKA of two representations ``X [n, d1]`` and ``Y [n, d2]`` of the same n inputs (paper Eq. 1,
with the centring of Kornblith et al. 2019 that Eq. 1 omits)::

    CKA(K, K') = <H K H, H K' H>_F / (‖H K H‖_F ‖H K' H‖_F),   K = X Xᵀ, K' = Y Yᵀ, H = I - 11ᵀ/n

It compares Gram matrices, so the widths may differ; it is invariant to orthogonal maps, isotropic
scaling and translation of the features, but **not** to general invertible linear maps (the paper
claims it is). The ``debiased`` estimator replaces the biased HSIC by the unbiased one of Song et
al. (2012), as Nguyen et al. (2021) do for CKA: the biased mini-batch CKA of unrelated wide
representations is close to 1 (docs/algorithms_hetero_ssfl.md, 'Ambiguities': small-batch CKA bias).

The consensus kernel ``K̄ = Σ_j w_j A_j A_jᵀ`` (paper Alg. 1) is kept either as the ``L × L`` kernel
or as the factor ``Ā = [√w_1 A_1 | … | √w_N A_N]`` with ``Ā Āᵀ = K̄``; :func:`consensus_block` reads
the block ``K̄[I, I]`` from either. Everything here computes in float32.
"""

from __future__ import annotations

from typing import Literal

import torch

Tensor = torch.Tensor
Estimator = Literal["biased", "debiased"]
Distance = Literal["one_minus_cka", "neg_cka", "cka_literal"]
ConsensusForm = Literal["kernel", "factor"]

EPS = 1e-8  # in the denominator: a collapsed representation gives CKA ≈ 0, not NaN


def gram(x: Tensor) -> Tensor:
    """The linear kernel ``x xᵀ`` of ``x [n, d]`` in float32."""
    x = x.float()
    return x @ x.T


def center_gram(k: Tensor) -> Tensor:
    """``H K H``: subtract row and column means, add back the grand mean."""
    return k - k.mean(dim=0, keepdim=True) - k.mean(dim=1, keepdim=True) + k.mean()


def _unbiased_hsic(k: Tensor, l: Tensor) -> Tensor:
    """Song et al. (2012)'s unbiased HSIC estimator (up to a constant that cancels in CKA); needs n ≥ 4."""
    n = k.shape[0]
    k = k - torch.diag(torch.diag(k))
    l = l - torch.diag(torch.diag(l))
    trace_kl = (k * l).sum()
    middle = k.sum() * l.sum() / ((n - 1) * (n - 2))
    last = 2 * (k.sum(dim=1) * l.sum(dim=1)).sum() / (n - 2)
    return (trace_kl + middle - last) / (n * (n - 3))


def cka(k: Tensor, l: Tensor, estimator: Estimator = "biased") -> Tensor:
    """CKA of two ``n × n`` (uncentred) kernels on the same inputs, as a float32 scalar.

    ``biased`` (default): centred kernel alignment, in [0, 1] for PSD kernels. ``debiased``: the
    unbiased-HSIC estimator; 1 for identical kernels, about 0 for unrelated ones, may leave [0, 1]
    slightly. Both centre the kernels they are given, so pass a block ``K̄[I, I]`` uncentred
    (each block is centred with its own ``H_b``; centring the whole K̄ and slicing differs).
    """
    # Centring first is what the biased estimator needs; the unbiased HSIC does not change under it
    # (it is invariant to translating the features) but loses far less to float32 cancellation.
    k, l = center_gram(k.float()), center_gram(l.float())
    if estimator == "biased":
        numerator, k_self, l_self = (k * l).sum(), (k * k).sum(), (l * l).sum()
    elif estimator == "debiased":
        if k.shape[0] < 4:
            raise ValueError(f"the debiased CKA estimator needs at least 4 samples, got {k.shape[0]}")
        numerator, k_self, l_self = _unbiased_hsic(k, l), _unbiased_hsic(k, k), _unbiased_hsic(l, l)
    else:
        raise ValueError(f"unknown CKA estimator {estimator!r} (allowed: biased, debiased)")
    # Each norm is taken separately (no overflow of the product) with EPS² inside the square root,
    # so a collapsed representation has a finite gradient as well as a finite value.
    return numerator / (torch.sqrt(k_self.clamp_min(0) + EPS**2) * torch.sqrt(l_self.clamp_min(0) + EPS**2))


def feature_cka(x: Tensor, y: Tensor) -> Tensor:
    """Linear CKA in feature form ``‖Ỹᵀ X̃‖²_F / (‖X̃ᵀ X̃‖_F ‖Ỹᵀ Ỹ‖_F)`` with column-centred ``X̃, Ỹ``;
    equal to ``cka(gram(x), gram(y))`` and cheaper when ``d ≪ n``."""
    x = x.float() - x.float().mean(dim=0, keepdim=True)
    y = y.float() - y.float().mean(dim=0, keepdim=True)
    numerator = (y.T @ x).pow(2).sum()
    return numerator / (torch.linalg.norm(x.T @ x) * torch.linalg.norm(y.T @ y) + EPS)


def alignment_distance(similarity: Tensor, distance: Distance = "one_minus_cka") -> Tensor:
    """The alignment term's distance: ``1 - CKA`` (default), ``-CKA`` (same gradient), or ``+CKA``,
    the paper's literal Eq. 2, which pushes clients apart (ablation only; docs/algorithms_hetero_ssfl.md,
    'Ambiguities': sign)."""
    if distance == "one_minus_cka":
        return 1 - similarity
    if distance == "neg_cka":
        return -similarity
    if distance == "cka_literal":
        return similarity
    raise ValueError(f"unknown alignment distance {distance!r} (allowed: one_minus_cka, neg_cka, cka_literal)")


def consensus(representations: list[Tensor], weights: Tensor, form: ConsensusForm = "kernel") -> Tensor:
    """``K̄ = Σ_j w_j A_j A_jᵀ`` from the clients' ``A_j [L, d_j]`` (any widths) as the ``L × L`` kernel,
    or the factor ``Ā = [√w_j A_j]_j`` of shape ``[L, Σ d_j]`` (``Ā Āᵀ = K̄``)."""
    factor = torch.cat([w.sqrt() * a.float() for a, w in zip(representations, weights.float())], dim=1)
    if form == "factor":
        return factor
    if form == "kernel":
        return factor @ factor.T
    raise ValueError(f"unknown consensus form {form!r} (allowed: kernel, factor)")


def consensus_block(consensus_matrix: Tensor, index: Tensor, form: ConsensusForm = "kernel") -> Tensor:
    """The uncentred block ``K̄[I, I]`` for RAD rows ``index``, from either form of :func:`consensus`."""
    if form == "factor":
        rows = consensus_matrix[index]
        return rows @ rows.T
    return consensus_matrix[index][:, index]
