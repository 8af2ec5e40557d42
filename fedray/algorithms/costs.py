"""What a client's training costs in compute: the forward FLOPs per sample of each client's model, the
factor by which the scheduler balances workers (:mod:`fedray.runtime.scheduler`) and the systems
model's clock times clients (:mod:`fedray.systems`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fedray.data import FederatedDataset
from fedray.models import forward_flops

if TYPE_CHECKING:
    from fedray.algorithms.base import Algorithm


def client_forward_flops(algorithm: Algorithm, data: FederatedDataset, exact: bool = False) -> np.ndarray:
    """``[num_clients]`` forward FLOPs per image of each client's model: the per-sample factor of
    the scheduler's costs. It matters where clients' models differ: Hetero-SSFL's round-robin widths
    (16 and 32) differ ~3.7× in compute and, with home worker ``client_id mod W``, would otherwise put
    every wide client on one worker while the other waits. Where every client has the same model the
    costs need no FLOPs and this is all ones, unless ``exact`` (the systems model's clock needs them)."""
    keys = [algorithm.model_key(client_id) for client_id in range(data.num_clients)]
    if len(set(keys)) == 1 and not exact:  # one model scales every cost alike; spare the FLOP counter's ~2 s first use
        return np.ones(data.num_clients)
    flops = {key: forward_flops(algorithm.build_model(key), data.info) for key in dict.fromkeys(keys)}
    return np.array([flops[key] for key in keys], dtype=np.float64)
