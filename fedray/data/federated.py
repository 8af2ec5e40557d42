"""Assemble a :class:`FederatedDataset` from a :class:`DataConfig`."""

from __future__ import annotations

import numpy as np

from fedray.config import DataConfig
from fedray.data.base import ClientPartition, FederatedDataset
from fedray.data.datasets import hold_out, load_dataset
from fedray.data.partition import partition_labels, split_client_test

_PUBLIC_STREAM = 0x5055  # keeps the public draw independent of the partition's draws with the same seed


def build_federated_dataset(cfg: DataConfig, seed: int) -> FederatedDataset:
    """Load ``cfg.name``, partition its training labels by ``cfg.partition`` and, when
    ``cfg.client_test_fraction > 0``, hold out that share of every client's samples as its
    personal test split (``client_test``). When ``cfg.public_fraction > 0``, that share of the
    training set is first held out as the unlabelled ``public`` set and the rest is partitioned."""
    train, test, info = load_dataset(cfg, seed)
    public = None
    if cfg.public_fraction > 0:
        public, owned = hold_out_public(len(train), cfg.public_fraction, seed)
        partition = partition_labels(train.y[owned], cfg, seed)
        clients = ClientPartition(indices=owned[partition.indices], offsets=partition.offsets)
    else:
        clients = partition_labels(train.y, cfg, seed)
    client_test = None
    if cfg.client_test_fraction > 0:
        clients, client_test = split_client_test(clients, cfg.client_test_fraction, seed)
    return FederatedDataset(
        train=train, test=test, info=info, clients=clients, client_test=client_test, public=public
    )


def hold_out_public(num_samples: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A seeded ``round(fraction · N)``-sample (at least 1) public subset of ``0..N-1`` and the
    remaining indices, both ascending."""
    return hold_out(num_samples, max(1, round(fraction * num_samples)), seed, _PUBLIC_STREAM)
