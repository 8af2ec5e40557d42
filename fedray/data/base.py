"""The in-memory form of a federated dataset.

A dataset is held as two dense arrays, the inputs and the targets (in the task's form, :mod:`fedray.tasks`:
int64 labels ``[N]`` for classification), that the runtime places in Ray's object store once; a client is
a slice of an index array. The inputs are of one of three modalities (:data:`MODALITIES`):

- ``image``: uint8 ``[N, C, H, W]``;
- ``tokens``: int64 token ids ``[N, T]`` (sequences of equal length, left-padded with id 0);
- ``features``: float32 ``[N, D]`` feature vectors.

Normalisation to float happens on the device, per batch (:meth:`DatasetInfo.normalize`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np
import torch

from fedray.tasks import task_class


MODALITIES = ("image", "tokens", "features")
# The array form of each modality's inputs: (dtype, number of dimensions including N).
_ARRAY_FORMS = {"image": (np.dtype(np.uint8), 4), "tokens": (np.dtype(np.int64), 2), "features": (np.dtype(np.float32), 2)}


def modality_of(x: np.ndarray) -> str:
    """The modality whose array form ``x`` has (see the module docstring); ``ValueError`` if none."""
    for modality, (dtype, ndim) in _ARRAY_FORMS.items():
        if x.dtype == dtype and x.ndim == ndim:
            return modality
    raise ValueError(f"x must be uint8 [N, C, H, W] (image), int64 [N, T] (tokens) or float32 [N, D] (features), got {x.dtype} {x.shape}")


@dataclass(frozen=True)
class ArrayDataset:
    """Inputs ``x`` of one modality (:func:`modality_of`), targets ``y`` (``[N, ...]`` in the task's
    stored form, :mod:`fedray.tasks`: int64 labels ``[N]`` for classification) and, for data with a
    natural partition, each sample's client id ``client_ids`` (``[N]``, ints or strings)."""

    x: np.ndarray
    y: np.ndarray
    client_ids: np.ndarray | None = None

    def __post_init__(self) -> None:
        modality_of(self.x)
        if not _has_row_major_strides(self.x):
            # A view such as digits' [N, 1, 8, 8] from a transpose: a Ray worker gets it row-major (the
            # object store's copy), and torch picks conv kernels by strides, so an in-process worker
            # must see the same layout to give bit-identical results.
            object.__setattr__(self, "x", self.x.copy(order="C"))
        if self.y.ndim == 0 or self.y.shape[0] != self.x.shape[0]:
            raise ValueError(f"y must have {self.x.shape[0]} rows (one target per sample), got shape {self.y.shape}")
        if self.client_ids is not None and self.client_ids.shape != self.y.shape[:1]:
            raise ValueError(f"client_ids must have shape {self.y.shape[:1]}, got {self.client_ids.shape}")

    def __len__(self) -> int:
        return int(self.y.shape[0])

    @property
    def modality(self) -> str:
        return modality_of(self.x)

    def subset(self, indices: np.ndarray) -> "ArrayDataset":
        """The samples at ``indices``, client ids included."""
        client_ids = None if self.client_ids is None else self.client_ids[indices]
        return ArrayDataset(self.x[indices], self.y[indices], client_ids)


@dataclass(frozen=True)
class DatasetInfo:
    """What models and training need to know about a dataset.

    ``channels`` and ``image_size`` describe images and are 0 for the other modalities; every
    modality has ``input_shape``, one sample's shape (``(C, H, W)``, ``(T,)`` or ``(D,)``; filled in
    from ``channels`` and ``image_size`` for images). ``mean``/``std`` are per channel on the 0..1
    scale for images, per feature (of the training set) for features, and empty for tokens.
    ``vocab_size`` is the number of token ids (tokens only).

    ``num_classes`` is the size of the model's output (per sample, or per position for language
    modelling): the classes of a classification, the outputs of a regression, the labels of a
    multilabel task, the vocabulary of a language model. ``target_mean``/``target_std`` are a
    regression's per-output training-set statistics (:class:`fedray.tasks.Regression`), else empty.

    ``columns``: for a table, the columns the inputs and targets were read from, by role (``inputs``,
    ``targets`` and, with ``data.client_column``, ``client``; :attr:`fedray.data.UserData.columns`),
    so that a run can record what it learnt from; empty for other data. Left out of comparisons and
    hashes: it describes where the data came from, not what a model needs.
    """

    name: str
    num_classes: int
    channels: int
    image_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    augmentation: str  # default augmentation: "none" or "crop_flip" (images only)
    modality: str = "image"
    input_shape: tuple[int, ...] = ()
    vocab_size: int | None = None
    target_mean: tuple[float, ...] = ()
    target_std: tuple[float, ...] = ()
    columns: dict[str, tuple[str, ...]] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.modality not in MODALITIES:
            raise ValueError(f"modality must be one of {MODALITIES}, got {self.modality!r}")
        if self.modality == "image" and not self.input_shape:
            object.__setattr__(self, "input_shape", (self.channels, self.image_size, self.image_size))
        if self.modality == "tokens" and self.vocab_size is None:
            raise ValueError("a tokens dataset needs vocab_size")

    @property
    def seq_len(self) -> int:
        """Tokens per sequence (tokens only)."""
        return self.input_shape[0]

    @property
    def num_features(self) -> int:
        """Features per sample (features only)."""
        return self.input_shape[0]

    def describe(self) -> str:
        """The inputs in words, for messages: "1×8×8 images", "30 features", "sequences of 80 tokens
        (vocabulary 102)"."""
        if self.modality == "image":
            return f"{'×'.join(map(str, self.input_shape))} images"
        if self.modality == "features":
            return f"{self.num_features} features"
        return f"sequences of {self.seq_len} tokens (vocabulary {self.vocab_size})"

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """A batch as stored → the model's input, on the tensor's device: uint8 images ``[B, C, H, W]``
        → float32 normalised per channel; float32 features ``[B, D]`` → standardised with the training
        set's per-feature mean and std; int64 tokens ``[B, T]`` unchanged."""
        if self.modality == "tokens":
            return x
        mean, std = _stats_tensors(self.mean, self.std, x.device, self.modality == "image")
        if self.modality == "image":
            return (x.float() / 255.0 - mean) / std
        return (x - mean) / std

    def dummy_input(self, batch_size: int = 1) -> torch.Tensor:
        """A zero batch of ``batch_size`` model inputs (as :meth:`normalize` returns them), e.g. for
        counting a model's FLOPs or checking that it accepts the data."""
        dtype = torch.long if self.modality == "tokens" else torch.float32
        return torch.zeros(batch_size, *self.input_shape, dtype=dtype)


@functools.cache
def _stats_tensors(
    mean: tuple[float, ...], std: tuple[float, ...], device: torch.device, per_channel: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and std tensors shaped ``[1, C, 1, 1]`` (per image channel) or ``[1, D]`` (per feature),
    made once per device (normalize runs every batch)."""
    shape = (1, -1, 1, 1) if per_channel else (1, -1)
    return torch.tensor(mean, device=device).view(shape), torch.tensor(std, device=device).view(shape)


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
        indices = np.concatenate([np.asarray(part, dtype=np.int64) for part in lists]) if lists else np.zeros(0, dtype=np.int64)
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
    """Train/test arrays, the train partition and, optionally, each client's held-out split; ``task``
    is the ``data.task`` whose targets the arrays hold."""

    train: ArrayDataset
    test: ArrayDataset
    info: DatasetInfo
    clients: ClientPartition  # indices into train
    client_test: ClientPartition | None = None  # indices into train, disjoint from `clients`
    public: np.ndarray | None = None  # indices into train held out from every client (data.public_fraction)
    client_names: tuple[str, ...] | None = None  # data.partition=natural: client k's id in the data
    task: str = "classification"

    @property
    def num_clients(self) -> int:
        return self.clients.num_clients

    def label_distribution(self, clients: int | None = None) -> np.ndarray | None:
        """``[clients, labels]`` counts of the task's partition labels (those the label-skew partitions
        skew, :meth:`fedray.tasks.Task.partition_labels`: the classes of a classification, the target
        deciles of a regression) in the training split of each of the first ``clients`` clients (of
        every client by default); None for targets without such labels (multilabel, language modelling)."""
        task = task_class(self.task)
        labels = task.partition_labels(self.train.y)
        if labels is None:
            return None
        clients = self.num_clients if clients is None else min(clients, self.num_clients)
        width = max(self.info.num_classes if task.class_labels else 0, int(labels.max()) + 1 if labels.size else 0)
        counts = np.zeros((clients, width), dtype=np.int64)
        owner = np.repeat(np.arange(clients), self.clients.sizes[:clients])
        np.add.at(counts, (owner, labels[self.clients.indices[: self.clients.offsets[clients]]]), 1)
        return counts


def _has_row_major_strides(array: np.ndarray) -> bool:
    """Whether ``array``'s strides are exactly those of a new C-order array of its shape (numpy's
    ``C_CONTIGUOUS`` flag ignores the strides of size-1 dimensions; torch's kernel choice does not)."""
    expected = array.itemsize
    for size, stride in zip(reversed(array.shape), reversed(array.strides)):
        if stride != expected:
            return False
        expected *= size
    return True
