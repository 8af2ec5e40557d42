"""Assemble a :class:`FederatedDataset` from a :class:`DataConfig`."""

from __future__ import annotations

import numpy as np

from fedray.config import ConfigError, DataConfig
from fedray.data.base import ClientPartition, FederatedDataset
from fedray.data.datasets import hold_out, load_dataset
from fedray.data.partition import natural_partition, partition_labels, split_client_test

_PUBLIC_STREAM = 0x5055  # keeps the public draw independent of the partition's draws with the same seed


def build_federated_dataset(cfg: DataConfig, seed: int) -> FederatedDataset:
    """Load ``cfg.name``, partition its training labels by ``cfg.partition`` and, when
    ``cfg.client_test_fraction > 0``, hold out that share of every client's samples as its
    personal test split (``client_test``). When ``cfg.public_fraction > 0``, that share of the
    training set is first held out as the unlabelled ``public`` set and the rest is partitioned.
    ``cfg.partition=natural`` makes one client per client id of the data, whose ids become
    ``client_names``."""
    train, test, info = load_dataset(cfg, seed)
    public = None
    owned = None
    if cfg.public_fraction > 0:
        public, owned = hold_out_public(len(train), cfg.public_fraction, seed)
    client_names = None
    if cfg.partition == "natural":
        if train.client_ids is None:
            raise ConfigError(
                "data.partition",
                f"natural needs the data's client ids, which data.name={cfg.name} does not have "
                f"(a table's data.client_column, or UserData.client_ids_train)",
                within=None,
            )
        clients, client_names = natural_partition(train.client_ids if owned is None else train.client_ids[owned], cfg)
    else:
        clients = partition_labels(train.y if owned is None else train.y[owned], cfg, seed)
    if owned is not None:
        clients = ClientPartition(indices=owned[clients.indices], offsets=clients.offsets)
    client_test = None
    if cfg.client_test_fraction > 0:
        clients, client_test = split_client_test(clients, cfg.client_test_fraction, seed)
    return FederatedDataset(
        train=train,
        test=test,
        info=info,
        clients=clients,
        client_test=client_test,
        public=public,
        client_names=client_names,
    )


def hold_out_public(num_samples: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A seeded ``round(fraction · N)``-sample (at least 1) public subset of ``0..N-1`` and the
    remaining indices, both ascending."""
    return hold_out(num_samples, max(1, round(fraction * num_samples)), seed, _PUBLIC_STREAM)
