"""Assemble a :class:`FederatedDataset` from a :class:`DataConfig`."""

from __future__ import annotations

import numpy as np

from fedray.config import ConfigError, DataConfig
from fedray.data.base import ClientPartition, FederatedDataset
from fedray.data.datasets import load_dataset
from fedray.data.partition import LABEL_SKEW_PARTITIONS, hold_out, natural_partition, partition_labels, split_client_test
from fedray.data.user import MAX_IMPLIED_CLASSES
from fedray.tasks import task_class

_PUBLIC_STREAM = 0x5055  # keeps the public draw independent of the partition's draws with the same seed


def build_federated_dataset(cfg: DataConfig, seed: int) -> FederatedDataset:
    """Load ``cfg.name``, partition its training samples by ``cfg.partition`` (the label-skew ones
    over the task's partition labels, :meth:`fedray.tasks.Task.partition_labels`) and, when
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
        clients = partition_labels(_skewed_labels(cfg, train.y if owned is None else train.y[owned], info.num_classes), cfg, seed)
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
        task=cfg.task,
    )


def _skewed_labels(cfg: DataConfig, targets: np.ndarray, num_classes: int) -> np.ndarray:
    """One int label per sample for :func:`partition_labels`: the task's partition labels. Targets
    without any (multilabel, language modelling) are refused by the label-skew partitions and get one
    label for all samples otherwise (iid and quantity only count the samples). A label far above the
    classes (a user task's stray one) is refused: the partitioners size arrays by the largest label."""
    labels = task_class(cfg.task).partition_labels(targets)
    if labels is None:
        if cfg.partition in LABEL_SKEW_PARTITIONS:
            raise ConfigError(
                "data.partition",
                f"{cfg.partition} skews labels, and {cfg.task} targets have none; use data.partition=natural, iid or quantity",
                within=None,
            )
        return np.zeros(len(targets), dtype=np.int64)
    labels = np.asarray(labels)
    if labels.shape != targets.shape[:1] or not np.issubdtype(labels.dtype, np.integer) or (labels.size and int(labels.min()) < 0):
        raise ConfigError(
            "data.task",
            f"{cfg.task}.partition_labels must give one int label >= 0 per sample, got {labels.dtype} {labels.shape}",
            within=None,
        )
    limit = max(num_classes, MAX_IMPLIED_CLASSES)
    if labels.size and int(labels.max()) >= limit:
        row = int(np.argmax(labels))
        raise ConfigError(
            "data.task",
            f"{cfg.task}.partition_labels gave the label {int(labels[row])} to sample {row}; labels must be below {limit:,}",
            within=None,
        )
    return labels


def hold_out_public(num_samples: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A seeded ``round(fraction · N)``-sample (at least 1) public subset of ``0..N-1`` and the
    remaining indices, both ascending."""
    return hold_out(num_samples, max(1, round(fraction * num_samples)), seed, _PUBLIC_STREAM)
