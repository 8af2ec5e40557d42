"""Assemble a :class:`FederatedDataset` from a :class:`DataConfig`."""

from __future__ import annotations

from fedray.config import DataConfig
from fedray.data.base import FederatedDataset
from fedray.data.datasets import load_dataset
from fedray.data.partition import partition_labels, split_client_test


def build_federated_dataset(cfg: DataConfig, seed: int) -> FederatedDataset:
    """Load ``cfg.name``, partition its training labels by ``cfg.partition`` and, when
    ``cfg.client_test_fraction > 0``, hold out that share of every client's samples as its
    personal test split (``client_test``)."""
    train, test, info = load_dataset(cfg, seed)
    clients = partition_labels(train.y, cfg, seed)
    client_test = None
    if cfg.client_test_fraction > 0:
        clients, client_test = split_client_test(clients, cfg.client_test_fraction, seed)
    return FederatedDataset(
        train=train, test=test, info=info, clients=clients, client_test=client_test
    )
