"""Datasets as in-memory arrays (images, token sequences or feature vectors), client partitions and
batched on-device augmentation."""

from fedray.data.augment import crop_flip, get_augmentation, ssl_views
from fedray.data.base import MODALITIES, ArrayDataset, ClientPartition, DatasetInfo, FederatedDataset
from fedray.data.datasets import load_dataset
from fedray.data.federated import build_federated_dataset
from fedray.data.partition import natural_partition, partition_labels, split_client_test
from fedray.data.user import UserData

__all__ = [
    "MODALITIES",
    "ArrayDataset",
    "ClientPartition",
    "DatasetInfo",
    "FederatedDataset",
    "build_federated_dataset",
    "crop_flip",
    "get_augmentation",
    "load_dataset",
    "natural_partition",
    "partition_labels",
    "split_client_test",
    "ssl_views",
    "UserData",
]
