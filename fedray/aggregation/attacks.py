"""Simulated malicious clients, to evaluate robust rules (``robust.attack``, ``robust.attackers``,
docs/guide/privacy.md).

**Who attacks** (``robust.attackers``):

- ``fraction``: fixed for the run: the first ⌊fraction·N⌉ clients (``robust.malicious_fraction``)
  of a permutation of the population drawn from the seed alone, so a client attacks in every round
  it is sampled, on any worker, and a round's number of attackers varies with its cohort;
- ``per_round``: exactly k = ``robust.attackers_per_round`` of each round's seeded cohort
  (:func:`fedray.seeding.sample_cohort`), drawn from (seed, round): every round has k attackers,
  and who they are changes from round to round.

**What they do** (``robust.attack``). Model poisoning: a malicious client computes its honest update
Δ (its new model minus the broadcast) and uploads instead, with s = ``robust.attack_scale``:

- ``sign_flip``: −s·Δ (Fang et al., USENIX Security 2020 use such reversed updates);
- ``scaled``: s·Δ (a boosted update, as in model replacement; Bagdasaryan et al., AISTATS 2020);
- ``random``: a Gaussian vector of norm s·‖Δ‖ seeded from (seed, round, client id);
- ``alie``: "A little is enough" (Baruch et al., NeurIPS 2019): every malicious client uploads
  μ − z·σ, μ and σ the coordinate-wise mean and (population) standard deviation of the round's
  benign updates, z from the paper's formula for n clients of which m attack
  (:func:`alie_z`) or ``robust.alie_z``. It needs the benign updates, so the server substitutes it
  where the per-client updates are collected (:func:`alie_updates`;
  :class:`fedray.runtime.upload_path.ServerUploadPath`).

Data poisoning: a malicious client trains on poisoned data (:func:`poisoned_data`) and uploads the
resulting update Δ, times b = ``robust.boost`` (model replacement, Bagdasaryan et al. 2020: the
server receives w + b·Δ; b = 1 leaves it as trained):

- ``label_flip``: every label y becomes C − 1 − y (C classes; the label flipping of Tolpegin et
  al., ESORICS 2020, "Data Poisoning Attacks Against Federated Learning Systems");
- ``backdoor``: a share p = ``robust.poison_fraction`` of the client's samples (⌊p·n_k⌉ of them,
  drawn from (seed, round, client id)) gets a t×t white square in the bottom-right corner of the
  image (t = ``robust.trigger_size``; the pixel-pattern trigger of Gu et al., "BadNets", 2017) and
  the label ``robust.target_class`` (Bagdasaryan et al., AISTATS 2020, "How to backdoor federated
  learning"). Its success is measured on a triggered copy of the test set without the samples of
  the target class (:func:`backdoor_test_set`): the share classified as the target class is the
  round's ``attack_success_rate``.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch

from fedray.seeding import derive_seed, sample_cohort

if TYPE_CHECKING:
    from fedray.config import RunConfig
    from fedray.data import DatasetInfo

Attack = Literal["sign_flip", "scaled", "random", "alie", "label_flip", "backdoor"]
#: Attacks on the uploaded update, by the client (the others are on the data, or alie's on the server).
MODEL_ATTACKS = ("sign_flip", "scaled", "random")
#: Attacks on a malicious client's training data.
DATA_ATTACKS = ("label_flip", "backdoor")
MALICIOUS_STREAM = 4403  # derive_seed streams, distinct from fedray.seeding's and fedray.privacy.mechanisms'
RANDOM_ATTACK_STREAM = 4404
PER_ROUND_ATTACKERS_STREAM = 4406
BACKDOOR_SAMPLES_STREAM = 4407


def malicious_clients(seed: int, num_clients: int, fraction: float) -> np.ndarray:
    """``bool [num_clients]``: True at the clients that attack (``robust.attackers: fraction``)."""
    chosen = np.random.default_rng(derive_seed(seed, MALICIOUS_STREAM)).permutation(num_clients)[: round(fraction * num_clients)]
    mask = np.zeros(num_clients, dtype=bool)
    mask[chosen] = True
    return mask


def round_attackers(seed: int, round: int, num_clients: int, clients_per_round: int, attackers: int) -> np.ndarray:
    """The ascending ids of the ``attackers`` clients of ``round``'s seeded cohort that attack in it
    (``robust.attackers: per_round``)."""
    cohort = sample_cohort(seed, round, num_clients, clients_per_round)
    rng = np.random.default_rng(derive_seed(seed, PER_ROUND_ATTACKERS_STREAM, round))
    return np.sort(rng.choice(cohort, size=attackers, replace=False))


class Attackers:
    """Which clients attack in which round, under ``robust.attackers`` (module docstring)."""

    def __init__(self, config: RunConfig, num_clients: int) -> None:
        robust = config.robust
        self.seed, self.num_clients, self.cohort = config.seed, num_clients, config.train.clients_per_round
        self.per_round = robust.attackers == "per_round"
        self.count = robust.attackers_per_round or 0
        self.mask = None if self.per_round else malicious_clients(config.seed, num_clients, robust.malicious_fraction)
        self._round, self._of_round = -1, np.zeros(num_clients, dtype=bool)

    def is_malicious(self, round: int, client_id: int) -> bool:
        if self.mask is not None:
            return bool(self.mask[client_id])
        if round != self._round:  # drawn once a round on each worker
            self._of_round = np.zeros(self.num_clients, dtype=bool)
            self._of_round[round_attackers(self.seed, round, self.num_clients, self.cohort, self.count)] = True
            self._round = round
        return bool(self._of_round[client_id])


def attacked_delta(delta: torch.Tensor, attack: Attack, scale: float, seed: int, round: int, client_id: int) -> torch.Tensor:
    """What a malicious client uploads instead of its honest delta under a model-poisoning attack
    (:data:`MODEL_ATTACKS`; module docstring)."""
    if attack == "sign_flip":
        return -scale * delta
    if attack == "scaled":
        return scale * delta
    generator = torch.Generator().manual_seed(derive_seed(seed, RANDOM_ATTACK_STREAM, round, client_id))
    direction = torch.randn(delta.shape, generator=generator, dtype=torch.float64).to(delta.device)
    return direction * (scale * float(torch.linalg.vector_norm(delta)) / float(torch.linalg.vector_norm(direction)))


# ---------------------------------------------------------------------- A little is enough
def alie_z(n: int, m: int) -> float:
    """z^max of Baruch et al. (NeurIPS 2019, Sec. 4, Alg. 1) for n clients of which m attack: the
    attackers need s = ⌊n/2 + 1⌋ − m benign clients "on their side", and z = Φ⁻¹((n − s)/n), Φ the
    standard normal CDF. With m so large that s < 1 (the paper assumes m < n/2), s = 1."""
    s = max(math.floor(n / 2 + 1) - m, 1)
    return NormalDist().inv_cdf((n - s) / n)


def alie_updates(updates: torch.Tensor, malicious: torch.Tensor, z: float | None = None) -> torch.Tensor:
    """``updates [n, d]`` with every row where ``malicious [n]`` (bool) is True replaced by μ − z·σ,
    μ and σ the coordinate-wise mean and population standard deviation (ddof = 0) of the other
    rows (of all rows when every client attacks: the attackers' own honest updates, the paper's
    estimate); z: :func:`alie_z` of n and m when None."""
    m = int(malicious.sum())
    if m == 0:
        return updates
    n = updates.shape[0]
    z = alie_z(n, m) if z is None else z
    benign = updates[~malicious] if m < n else updates
    mean, std = benign.mean(dim=0), benign.std(dim=0, correction=0)
    out = updates.clone()
    out[malicious] = mean - z * std
    return out


# ---------------------------------------------------------------------- data poisoning
def flipped_labels(y: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Label flipping (Tolpegin et al., ESORICS 2020): y → C − 1 − y."""
    return num_classes - 1 - y


def stamp_trigger(x: torch.Tensor, size: int) -> torch.Tensor:
    """``x [B, C, H, W]`` (a copy) with a ``size`` × ``size`` white square (the dtype's largest
    value: 255 for uint8 images, 1 for float) in the bottom-right corner of every channel."""
    out = x.clone()
    white = torch.iinfo(x.dtype).max if not x.dtype.is_floating_point else 1.0
    out[..., x.shape[-2] - size :, x.shape[-1] - size :] = white
    return out


def poisoned_samples(seed: int, round: int, client_id: int, num_samples: int, fraction: float) -> np.ndarray:
    """The ascending positions of the ⌊fraction·n⌉ samples, of a client's n, that a backdoor
    attacker poisons in ``round``."""
    rng = np.random.default_rng(derive_seed(seed, BACKDOOR_SAMPLES_STREAM, round, client_id))
    return np.sort(rng.permutation(num_samples)[: int(np.rint(fraction * num_samples))])


def poisoned_data(
    config: RunConfig, num_classes: int, round: int, client_id: int, x: torch.Tensor, y: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """A malicious client's training data ``x``, ``y`` under ``robust.attack`` (label_flip, backdoor;
    new tensors), as the module docstring says."""
    robust = config.robust
    if robust.attack == "label_flip":
        return x, flipped_labels(y, num_classes)
    chosen = torch.as_tensor(poisoned_samples(config.seed, round, client_id, len(y), robust.poison_fraction), device=x.device)
    x, y = x.clone(), y.clone()
    x[chosen] = stamp_trigger(x[chosen], robust.trigger_size)
    y[chosen] = robust.target_class
    return x, y


def backdoor_test_set(x: torch.Tensor, y: torch.Tensor, trigger_size: int, target_class: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The test set on which the backdoor's success is measured: every sample whose true label is
    not ``target_class``, with the trigger stamped, labelled ``target_class`` (its accuracy is the
    attack success rate)."""
    keep = y != target_class
    triggered = stamp_trigger(x[keep], trigger_size)
    return triggered, torch.full_like(y[keep], target_class)


def poisoning_problem(config: RunConfig, info: DatasetInfo) -> str | None:
    """Why ``robust.attack`` cannot poison this data (one line), or None: a backdoor needs images
    at least ``trigger_size`` on a side and a ``target_class`` among the classes; label flipping
    needs classes. (Checked with the data, before Ray: :func:`fedray.runtime.worker.build_algorithm`.)"""
    robust = config.robust
    if robust.attack not in DATA_ATTACKS:
        return None
    if robust.attack == "backdoor":
        if info.modality != "image":
            return f"robust.attack=backdoor stamps a pixel trigger on images; data.name={info.name} has {info.modality} inputs"
        height, width = info.input_shape[-2:]
        if robust.trigger_size > min(height, width):
            return f"robust.trigger_size ({robust.trigger_size}) is larger than the images of data.name={info.name} ({height}×{width})"
        if robust.target_class >= info.num_classes:
            return f"robust.target_class ({robust.target_class}) must be below the {info.num_classes} classes of data.name={info.name}"
    return None
