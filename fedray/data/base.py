"""The in-memory form of a federated dataset.

A dataset is held as two dense arrays (uint8 images ``[N, C, H, W]`` and int64 labels ``[N]``) that the
runtime places in Ray's object store once; a client is a slice of an index array. Normalisation to
float happens on the device, per batch (:meth:`DatasetInfo.normalize`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class ArrayDataset:
    """Images ``x`` (uint8, ``[N, C, H, W]``) and labels ``y`` (int64, ``[N]``)."""

    x: np.ndarray
    y: np.ndarray

    def __post_init__(self) -> None:
        if self.x.dtype != np.uint8 or self.x.ndim != 4:
            raise ValueError(f"x must be uint8 [N, C, H, W], got {self.x.dtype} {self.x.shape}")
        if self.y.shape != (self.x.shape[0],):
            raise ValueError(f"y must have shape ({self.x.shape[0]},), got {self.y.shape}")

    def __len__(self) -> int:
        return int(self.y.shape[0])


@dataclass(frozen=True)
class DatasetInfo:
    """What models and training need to know about a dataset."""

    name: str
    num_classes: int
    channels: int
    image_size: int
    mean: tuple[float, ...]  # per channel, on the 0..1 scale
    std: tuple[float, ...]
    augmentation: str  # default augmentation: "none" or "crop_flip"

    def normalize(self, x_uint8: torch.Tensor) -> torch.Tensor:
        """uint8 ``[B, C, H, W]`` → normalised float32, on the tensor's device."""
        mean, std = _channel_stats(self.mean, self.std, x_uint8.device)
        return (x_uint8.float() / 255.0 - mean) / std


@functools.cache
def _channel_stats(mean: tuple[float, ...], std: tuple[float, ...], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``[1, C, 1, 1]`` mean and std tensors, made once per device (normalize runs every batch)."""
    return (
        torch.tensor(mean, device=device).view(1, -1, 1, 1),
        torch.tensor(std, device=device).view(1, -1, 1, 1),
    )


@dataclass(frozen=True)
class ClientPartition:
    """Per-client index lists stored as one flat array plus offsets (CSR), so that 100,000 clients
    cost two arrays, not 100,000 objects. Client ``k`` owns ``indices[offsets[k]:offsets[k+1]]``."""

    indices: np.ndarray  # int64
    offsets: np.ndarray  # int64, [num_clients + 1]

    @classmethod
    def from_lists(cls, lists: list[np.ndarray]) -> "ClientPartition":
        sizes = np.array([len(part) for part in lists], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        indices = (
            np.concatenate([np.asarray(part, dtype=np.int64) for part in lists])
            if lists
            else np.zeros(0, dtype=np.int64)
        )
        return cls(indices=indices, offsets=offsets)

    @property
    def num_clients(self) -> int:
        return int(self.offsets.shape[0] - 1)

    @property
    def sizes(self) -> np.ndarray:
        return np.diff(self.offsets)

    def client(self, k: int) -> np.ndarray:
        return self.indices[self.offsets[k] : self.offsets[k + 1]]


@dataclass(frozen=True)
class FederatedDataset:
    """Train/test arrays, the train partition and, optionally, each client's held-out split."""

    train: ArrayDataset
    test: ArrayDataset
    info: DatasetInfo
    clients: ClientPartition  # indices into train
    client_test: ClientPartition | None = None  # indices into train, disjoint from `clients`
    public: np.ndarray | None = None  # indices into train held out from every client (data.public_fraction)

    @property
    def num_clients(self) -> int:
        return self.clients.num_clients

    def label_distribution(self, clients: int | None = None) -> np.ndarray:
        """``[clients, num_classes]`` label counts of the training split of each of the first
        ``clients`` clients (of every client by default)."""
        clients = self.num_clients if clients is None else min(clients, self.num_clients)
        counts = np.zeros((clients, self.info.num_classes), dtype=np.int64)
        owner = np.repeat(np.arange(clients), self.clients.sizes[:clients])
        np.add.at(counts, (owner, self.train.y[self.clients.indices[: self.clients.offsets[clients]]]), 1)
        return counts
