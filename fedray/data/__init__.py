"""Datasets as in-memory arrays, client partitions and batched on-device augmentation."""

from fedray.data.augment import crop_flip, get_augmentation, ssl_views
from fedray.data.base import ArrayDataset, ClientPartition, DatasetInfo, FederatedDataset
from fedray.data.datasets import load_dataset
from fedray.data.federated import build_federated_dataset
from fedray.data.partition import partition_labels, split_client_test

__all__ = [
    "ArrayDataset",
    "ClientPartition",
    "DatasetInfo",
    "FederatedDataset",
    "build_federated_dataset",
    "crop_flip",
    "get_augmentation",
    "load_dataset",
    "partition_labels",
    "split_client_test",
    "ssl_views",
]
