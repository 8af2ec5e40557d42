"""The Gaussian mechanisms on the upload path, and where their noise comes from.

- central (DP-FedAvg, McMahan et al., ICLR 2018, Alg. 1): the server adds N(0, (z·C)²·I) to the sum
  of the clipped client deltas (z = ``privacy.noise_multiplier``, C = ``privacy.clip``) and divides
  by the fixed cohort size m = ``train.clients_per_round`` (the estimator f̃_f of its Eq. 3 with
  uniform client weights w_k = 1, so W·q = m): Δ̃ = (Σ_k clip(Δ_k) + N(0, σ²)) / m. With
  ``privacy.noise_cohort_size`` M the std is scaled by m/M (pfl-research's practice), so the mean
  carries the noise std z·C/M of a cohort of M clients;
- local: each client adds N(0, (z·C)²·I) to its own clipped delta before it uploads.

The noise is float64 on the CPU and seeded from (seed, round) or (seed, round, client id), never from
the worker that ran a client, so a resumed run draws the same noise (docs/architecture.md, principle 7).
"""

from __future__ import annotations

import torch

from fedray.seeding import derive_seed

# Streams of derive_seed; distinct from fedray.seeding's cohort (1) and client (2) streams.
CENTRAL_NOISE_STREAM = 4401
LOCAL_NOISE_STREAM = 4402


def gaussian_noise(like: torch.Tensor, std: float, generator: torch.Generator) -> torch.Tensor:
    """N(0, std²·I) with the shape of ``like``, float64 on the CPU."""
    return torch.randn(like.shape, generator=generator, dtype=torch.float64) * std


def central_noise(seed: int, round: int, like: torch.Tensor, std: float) -> torch.Tensor:
    """The server's noise on the sum of ``round`` (on ``like``'s device)."""
    generator = torch.Generator().manual_seed(derive_seed(seed, CENTRAL_NOISE_STREAM, round))
    return gaussian_noise(like, std, generator).to(like.device)


def local_noise(seed: int, round: int, client_id: int, like: torch.Tensor, std: float) -> torch.Tensor:
    """Client ``client_id``'s own noise in ``round`` (on ``like``'s device)."""
    generator = torch.Generator().manual_seed(derive_seed(seed, LOCAL_NOISE_STREAM, round, client_id))
    return gaussian_noise(like, std, generator).to(like.device)


def central_noise_std(noise_multiplier: float, clip: float, cohort: int, noise_cohort: int) -> float:
    """The std of the noise on the sum: z·C·m/M (= z·C without a larger noise cohort)."""
    if noise_multiplier == 0:
        return 0.0
    return noise_multiplier * clip * cohort / noise_cohort
