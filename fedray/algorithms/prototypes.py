"""Per-class prototype maths shared by the prototype algorithms (FedProto, FedSC, FedSKC, FedCoSR).

A prototype of class c is the mean feature of the samples of class c. Clients compute sums and
counts; whoever needs means divides, so sums from many clients (or batches) can be added first
(worker-side pre-aggregation) and classes with no samples stay recognisable (count 0).
"""

from __future__ import annotations

from typing import Callable

import torch

Tensor = torch.Tensor


def class_sums(features: Tensor, labels: Tensor, num_classes: int) -> tuple[Tensor, Tensor]:
    """Per-class feature sums ``[C, d]`` and sample counts ``[C]`` of ``features`` ``[n, d]``."""
    sums = torch.zeros(num_classes, features.shape[1], dtype=features.dtype, device=features.device)
    sums.index_add_(0, labels, features)
    counts = torch.bincount(labels, minlength=num_classes).to(features.dtype)
    return sums, counts


def class_means(sums: Tensor, counts: Tensor) -> Tensor:
    """Per-class means ``[C, d]``; rows of classes with count 0 are zero (mask them with ``counts > 0``)."""
    return sums / counts.clamp_min(1).unsqueeze(1)


@torch.no_grad()
def client_class_sums(
    embed: Callable[[Tensor], Tensor],
    x_uint8: Tensor,
    labels: Tensor,
    normalize: Callable[[Tensor], Tensor],
    num_classes: int,
    batch_size: int = 512,
) -> tuple[Tensor, Tensor]:
    """Class sums and counts of ``embed(normalize(x))`` over a client's whole split (no augmentation,
    no gradient), in batches: the prototypes a client uploads after local training."""
    total_sums = total_counts = None
    for start in range(0, int(labels.shape[0]), batch_size):
        features = embed(normalize(x_uint8[start : start + batch_size]))
        sums, counts = class_sums(features, labels[start : start + batch_size], num_classes)
        total_sums = sums if total_sums is None else total_sums + sums
        total_counts = counts if total_counts is None else total_counts + counts
    assert total_sums is not None and total_counts is not None, "a client has at least one sample"
    return total_sums, total_counts
