"""Simulated malicious clients, to evaluate robust rules (``robust.malicious_fraction``,
``robust.attack``, ``robust.attack_scale``).

Which clients attack is fixed for the run: the first ⌊fraction·N⌉ clients of a permutation of the
population drawn from the seed alone, so a client attacks in every round it is sampled, on any
worker. A malicious client computes its honest update Δ (its new model minus the broadcast) and
uploads instead, with s = ``robust.attack_scale``:

- ``sign_flip``: −s·Δ (Fang et al., USENIX Security 2020 use such reversed updates);
- ``scaled``: s·Δ (a boosted update, as in model replacement; Bagdasaryan et al., AISTATS 2020);
- ``random``: a Gaussian vector of norm s·‖Δ‖ seeded from (seed, round, client id).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch

from fedray.seeding import derive_seed

Attack = Literal["sign_flip", "scaled", "random"]
MALICIOUS_STREAM = 4403  # derive_seed streams, distinct from fedray.seeding's and fedray.privacy.mechanisms'
RANDOM_ATTACK_STREAM = 4404


def malicious_clients(seed: int, num_clients: int, fraction: float) -> np.ndarray:
    """``bool [num_clients]``: True at the clients that attack."""
    chosen = np.random.default_rng(derive_seed(seed, MALICIOUS_STREAM)).permutation(num_clients)[: round(fraction * num_clients)]
    mask = np.zeros(num_clients, dtype=bool)
    mask[chosen] = True
    return mask


def attacked_delta(delta: torch.Tensor, attack: Attack, scale: float, seed: int, round: int, client_id: int) -> torch.Tensor:
    """What a malicious client uploads instead of its honest delta (module docstring)."""
    if attack == "sign_flip":
        return -scale * delta
    if attack == "scaled":
        return scale * delta
    generator = torch.Generator().manual_seed(derive_seed(seed, RANDOM_ATTACK_STREAM, round, client_id))
    direction = torch.randn(delta.shape, generator=generator, dtype=torch.float64).to(delta.device)
    return direction * (scale * float(torch.linalg.vector_norm(delta)) / float(torch.linalg.vector_norm(direction)))
