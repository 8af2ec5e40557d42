"""The Gaussian mechanisms on the upload path, and where their noise comes from.

- central (DP-FedAvg, McMahan et al., ICLR 2018, Alg. 1): the server adds N(0, (z·C)²·I) to the sum
  of the clipped client deltas (z = ``privacy.noise_multiplier``, C = ``privacy.clip``) and divides
  by the fixed cohort size m = ``train.clients_per_round`` (the estimator f̃_f of its Eq. 3 with
  uniform client weights w_k = 1, so W·q = m): Δ̃ = (Σ_k clip(Δ_k) + N(0, σ²)) / m. With
  ``privacy.noise_cohort_size`` M the std is scaled by m/M (pfl-research's practice), so the mean
  carries the noise std z·C/M of a cohort of M clients;
- local: each client adds N(0, (z·C)²·I) to its own clipped delta before it uploads;
- adaptive clipping (Andrew et al., NeurIPS 2021, Alg. 1): the server also adds N(0, σ_b²) to the
  count of unclipped updates (scaled by m/M as above), and the update's noise multiplier becomes
  z_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2), so that the two releases together cost what one Gaussian mechanism
  of multiplier z does (their Thm. 1): the accountant keeps accounting for z.
- every upload kind (prototypes, class representations, logit knowledge, counts): a client releasing
  P parts, part i clipped to C_i (sensitivity C_i) and noised with z_i·C_i, releases one Gaussian
  mechanism of multiplier z = (Σ_i z_i⁻²)^(−1/2): the privacy loss of a Gaussian mechanism depends only
  on ‖Δ/σ‖, and the parts' (Δ_i/(z_i·C_i)) stack into one vector of norm ≤ (Σ_i z_i⁻²)^(1/2) (equivalently,
  their Rényi divergences α/(2z_i²) add up to α/(2z²)). fedray splits z equally, z_i = √P·z
  (:func:`part_noise_multiplier`), so the accountant charges z for the round whatever P is. Parts summed
  over the cohort are noised on the sum like the weights (std z_i·C_i·m/M under central DP); a part
  the server needs client by client (FedSC's prototypes) gets its own noise z_i·C_i per client.

The noise is float64 on the CPU and seeded from (seed, round) or (seed, round, client id), never from
the worker that ran a client, so a resumed run draws the same noise (docs/architecture.md, principle 7).
"""

from __future__ import annotations

import torch

from fedray.seeding import derive_seed

# Streams of derive_seed; distinct from fedray.seeding's cohort (1) and client (2) streams.
CENTRAL_NOISE_STREAM = 4401
LOCAL_NOISE_STREAM = 4402
CLIPPED_COUNT_STREAM = 4403
CENTRAL_PART_NOISE_STREAM = 4404


def gaussian_noise(like: torch.Tensor, std: float, generator: torch.Generator) -> torch.Tensor:
    """N(0, std²·I) with the shape of ``like``, float64 on the CPU."""
    return torch.randn(like.shape, generator=generator, dtype=torch.float64) * std


def central_noise(seed: int, round: int, like: torch.Tensor, std: float, part: int = 0) -> torch.Tensor:
    """The server's noise on the sum of ``round`` (on ``like``'s device): of the model weights
    (``part`` 0) or of the ``part``-th other private part (:func:`fedray.algorithms.uploads.private_parts`)."""
    keys = (CENTRAL_NOISE_STREAM, round) if part == 0 else (CENTRAL_PART_NOISE_STREAM, round, part)
    generator = torch.Generator().manual_seed(derive_seed(seed, *keys))
    return gaussian_noise(like, std, generator).to(like.device)


def local_noise(seed: int, round: int, client_id: int, like: torch.Tensor, std: float, part: int = 0) -> torch.Tensor:
    """Client ``client_id``'s own noise in ``round`` on ``part`` (as :func:`central_noise`; on ``like``'s
    device): added by the client under local DP, by the trusted server to a per-client part under central DP."""
    generator = torch.Generator().manual_seed(derive_seed(seed, LOCAL_NOISE_STREAM, round, client_id, *((part,) if part else ())))
    return gaussian_noise(like, std, generator).to(like.device)


def central_noise_std(noise_multiplier: float, clip: float, cohort: int, noise_cohort: int) -> float:
    """The std of the noise on the sum: z·C·m/M (= z·C without a larger noise cohort)."""
    if noise_multiplier == 0:
        return 0.0
    return noise_multiplier * clip * cohort / noise_cohort


def clipped_count_noise(seed: int, round: int, std: float) -> float:
    """Adaptive clipping: the server's noise N(0, std²) on the count of unclipped updates of ``round``."""
    generator = torch.Generator().manual_seed(derive_seed(seed, CLIPPED_COUNT_STREAM, round))
    return float(gaussian_noise(torch.empty(()), std, generator))


def update_noise_multiplier(noise_multiplier: float, count_stddev: float) -> float:
    """z_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2): the update's noise multiplier under adaptive clipping whose release,
    together with the count of unclipped updates noised with σ_b (sensitivity ½ once centred), is a
    Gaussian mechanism of multiplier z (Andrew et al., NeurIPS 2021, Thm. 1). Needs z < 2σ_b
    (:func:`fedray.config.privacy.adaptive_noise_problem`); 0 for z = 0."""
    if noise_multiplier == 0:
        return 0.0
    return (noise_multiplier**-2 - (2 * count_stddev) ** -2) ** -0.5


def part_noise_multiplier(noise_multiplier: float, parts: int) -> float:
    """z_i = √P·z: the multiplier of each of ``parts`` = P released parts whose Gaussian mechanisms
    together are one of multiplier z (module docstring: (Σ_i z_i⁻²)^(−1/2) = z)."""
    return noise_multiplier * parts**0.5
