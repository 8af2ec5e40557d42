"""Every random choice derives from (seed, round, client id), never from which worker ran a client
(docs/architecture.md, principle 7)."""

from __future__ import annotations

import numpy as np
import torch

# Streams keep the cohort draw and the clients' draws independent even when ids coincide.
_COHORT_STREAM = 1
_CLIENT_STREAM = 2


def derive_seed(*keys: int) -> int:
    """A 63-bit seed from integer keys, via numpy's SeedSequence (well mixed, platform independent)."""
    return int(np.random.SeedSequence([int(k) for k in keys]).generate_state(2, dtype=np.uint32).view(np.uint64)[0] >> 1)


def sample_cohort(seed: int, round: int, num_clients: int, clients_per_round: int) -> np.ndarray:
    """The ascending ids of the clients that train in ``round``."""
    rng = np.random.default_rng(derive_seed(seed, _COHORT_STREAM, round))
    return np.sort(rng.choice(num_clients, size=clients_per_round, replace=False))


def sample_cohort_among(seed: int, round: int, candidates: np.ndarray, size: int) -> np.ndarray:
    """The ascending ids of ``size`` of ``candidates`` (ascending ids: the clients online in a round
    of ``systems.availability``) that train in ``round``; with every client a candidate, the same
    draw as :func:`sample_cohort`."""
    rng = np.random.default_rng(derive_seed(seed, _COHORT_STREAM, round))
    return np.sort(rng.choice(candidates, size=size, replace=False))


def seed_client(seed: int, round: int, client_id: int) -> torch.Generator:
    """Seed torch's global RNG (dropout, initialisation inside algorithms) and return a CPU
    generator for data order and augmentation, both from (seed, round, client id)."""
    client_seed = derive_seed(seed, _CLIENT_STREAM, round, client_id)
    # torch.manual_seed would also queue a lazy CUDA seeding, recording a Python stack each call
    # (~1 ms per client); seed the generators in use directly instead.
    torch.default_generator.manual_seed(client_seed)
    if torch.cuda.is_initialized():
        torch.cuda.manual_seed(client_seed)
    return torch.Generator().manual_seed(client_seed)
