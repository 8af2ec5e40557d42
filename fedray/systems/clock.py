"""The simulated clock's arithmetic: what a client moves over the network and how long its round takes.

A client's round (``systems``; Bonawitz et al. 2019, §2) is download, then local training, then upload:

    T_c = B_down / bw_down,c + n_c · E · F_c · k / s_c + B_up,c / bw_up,c

with n_c its training samples, E = ``train.local_epochs``, F_c its model's forward FLOPs per sample, k =
``systems.train_flops_per_forward`` (forward + backward ≈ 3 forward passes), s_c its FLOP/s and bw its
bandwidths in bytes/s (:mod:`fedray.systems.devices`). B_down is the bytes of the round's broadcast and
B_up,c the bytes of what the client's algorithm uploads (:func:`upload_bytes`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fedray.algorithms import RoundResults
from fedray.systems.devices import Devices

#: Bytes per element of a client's ``sums`` on the wire: the float32 of its model. The runtime forms
#: n_k · w_k in float64 only so that workers reduce exactly; a device would send w_k (and n_k).
SUMS_BYTES_PER_ELEMENT = 4
SCALAR_BYTES = 8


def payload_bytes(value: Any) -> int:
    """Bytes of the tensors and arrays in ``value`` (nested dicts, lists and tuples), each at its own
    element size; a Python number counts :data:`SCALAR_BYTES`, anything else nothing."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, dict):
        return sum(payload_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(payload_bytes(v) for v in value)
    return SCALAR_BYTES if isinstance(value, (int, float)) else 0


#: The client metric in which the upload path reports the bytes a client sent when they differ from
#: what its ``sums`` and payload hold (``systems.compression``: :mod:`fedray.systems.compression`).
UPLOAD_BYTES_METRIC = "upload_bytes"


def sums_bytes(sums: dict[str, torch.Tensor]) -> int:
    """Bytes of one client's ``sums`` on the wire: :data:`SUMS_BYTES_PER_ELEMENT` for floating tensors."""
    return sum(t.numel() * (SUMS_BYTES_PER_ELEMENT if t.is_floating_point() else t.element_size()) for t in sums.values())


def upload_bytes(results: RoundResults) -> dict[int, int]:
    """Bytes each aggregated client of ``results`` uploaded: one of each ``sums`` tensor (at
    :data:`SUMS_BYTES_PER_ELEMENT` for floating tensors) plus its payload (weights, prototypes,
    representations, control-variate deltas alike), or, where the upload path measured the client's
    compressed upload, its :data:`UPLOAD_BYTES_METRIC`."""
    shared_sums_bytes = sums_bytes(results.sums)
    excluded = set(results.excluded_clients)
    return {
        client_id: int(metrics[UPLOAD_BYTES_METRIC])
        if UPLOAD_BYTES_METRIC in metrics
        else shared_sums_bytes + payload_bytes(results.payloads.get(client_id, {}))
        for client_id, metrics in results.client_metrics.items()
        if client_id not in excluded
    }


def client_durations(
    devices: Devices,
    client_ids: np.ndarray,
    train_flops: np.ndarray,
    download_bytes: float,
    upload_bytes: float,
) -> np.ndarray:
    """T_c (module docstring) in simulated seconds for each of ``client_ids``; ``train_flops[i]`` is
    n_c · E · F_c · k of ``client_ids[i]``."""
    download = download_bytes / devices.download_bytes_per_second[client_ids]
    compute = train_flops / devices.flops_per_second[client_ids]
    upload = upload_bytes / devices.upload_bytes_per_second[client_ids]
    return download + compute + upload
