"""MNIST and Fashion-MNIST in their original IDX format, plain or gzipped, read where they lie.

An IDX file is a 4-byte magic number ``0, 0, type, ndim`` (type ``0x08`` = unsigned byte), ``ndim``
big-endian int32 sizes, then the values in row-major order. Both datasets ship as the same four
files (``{train,t10k}-{images-idx3,labels-idx1}-ubyte``, usually with ``.gz``), found either directly
in a directory (as Debian's ``dataset-fashion-mnist`` installs them under
``/usr/share/datasets/fashion-mnist``) or in torchvision's ``<root>/<Class>/raw/`` layout.

torchvision's own IDX parser (``torchvision.datasets.mnist.read_sn3_pascalvincent_tensor``) reads
neither gzipped files nor reports a bad header other than by a bare ``assert``, hence this reader.
"""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np

from fedray.data.base import ArrayDataset
from fedray.data.user import label_range_problem

IDX_STEMS = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
_UBYTE = 0x08


class IdxFormatError(ValueError):
    """A file that is not a well-formed unsigned-byte IDX file; the message names the file."""


def read_idx(path: Path) -> np.ndarray:
    """The uint8 array stored in the IDX file ``path`` (gzip-compressed when it ends in ``.gz``)."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as handle:
            data = handle.read()
    except (OSError, EOFError) as error:  # gzip.BadGzipFile is an OSError
        raise IdxFormatError(f"{path}: cannot be read ({error})") from None
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != _UBYTE or not 1 <= data[3] <= 4:
        raise IdxFormatError(
            f"{path}: not an unsigned-byte IDX file (magic number {data[:4].hex() or 'missing'}, "
            f"expected 000008 followed by the number of dimensions)"
        )
    ndim = data[3]
    header_size = 4 + 4 * ndim
    if len(data) < header_size:
        raise IdxFormatError(f"{path}: truncated header ({len(data)} bytes)")
    shape = struct.unpack(f">{ndim}i", data[4:header_size])
    expected = header_size + int(np.prod(shape))
    if len(data) != expected:
        raise IdxFormatError(f"{path}: {len(data)} bytes, but its header {tuple(shape)} needs {expected} (truncated or corrupt file)")
    return np.frombuffer(data, dtype=np.uint8, offset=header_size).reshape(shape)


def idx_file(directory: Path, stem: str) -> Path | None:
    """``directory/stem.gz`` or ``directory/stem``, whichever exists (gzipped first)."""
    for candidate in (directory / f"{stem}.gz", directory / stem):
        if candidate.is_file():
            return candidate
    return None


def has_idx_files(directory: Path) -> bool:
    """Whether all four files are in ``directory`` (plain or gzipped)."""
    return all(idx_file(directory, stem) is not None for pair in IDX_STEMS.values() for stem in pair)


def read_idx_split(directory: Path, split: str, num_classes: int) -> ArrayDataset:
    """The ``train`` or ``test`` split from ``directory``: uint8 images ``[N, 1, 28, 28]`` and int64
    labels ``[N]``. Raises :class:`IdxFormatError` naming the file when the two do not match or a
    label is not below ``num_classes``."""
    images_path, labels_path = (idx_file(directory, stem) for stem in IDX_STEMS[split])
    assert images_path is not None and labels_path is not None, "call has_idx_files first"
    images, labels = read_idx(images_path), read_idx(labels_path)
    if images.ndim != 3 or labels.ndim != 1 or images.shape[0] != labels.shape[0]:
        raise IdxFormatError(f"{images_path} {images.shape} and {labels_path} {labels.shape} are not N images and N labels")
    problem = label_range_problem(labels, num_classes)
    if problem is not None:
        raise IdxFormatError(f"{labels_path}: {problem}")
    return ArrayDataset(np.ascontiguousarray(images[:, None]), labels.astype(np.int64))
