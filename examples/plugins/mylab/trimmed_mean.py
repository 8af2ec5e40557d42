"""Coordinate-wise trimmed mean (Yin et al., "Byzantine-robust distributed learning", ICML 2018, Eq. 3):
a non-linear aggregation, so the workers cannot pre-reduce it.

For every coordinate j, the server sorts the round's K client values w_k[j], drops the
``β·K`` smallest and the ``β·K`` largest (β = ``algorithm.trim_fraction``) and averages the rest
(unweighted). With β = 0 it is the unweighted mean; as β → 0.5 it approaches the coordinate-wise median.

A sum of the clients' weights cannot tell which values are extreme, so each client sends its whole
weight vector as a per-client ``payload`` instead of ``sums``: a round moves O(clients) model-sized
tensors to the server instead of O(workers). Fine for tens of clients per round; for thousands,
prefer an aggregation the workers can sum.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field

from fedray import Algorithm, AlgorithmParams, ClientContext, ClientUpdate, RoundResults
from fedray.algorithms.local import local_train
from fedray.models import get_flat_weights, set_flat_weights


class TrimmedMeanParams(AlgorithmParams):
    trim_fraction: float = Field(0.1, ge=0, lt=0.5, description="share β of clients trimmed at each end, per coordinate")


class TrimmedMean(Algorithm):
    name = "mylab_trimmed_mean"
    Params = TrimmedMeanParams

    def client_update(self, ctx: ClientContext, broadcast) -> ClientUpdate:
        set_flat_weights(ctx.model, broadcast["weights"])
        metrics = local_train(ctx, lambda x, y: (F.cross_entropy(ctx.model(x), y), {}))
        # Nothing to add up in the worker: the server needs every client's vector.
        return ClientUpdate(sums={}, payload={"weights": get_flat_weights(ctx.model)}, metrics=metrics)

    def aggregate(self, server_state, round: int, results: RoundResults):
        stacked = torch.stack([payload["weights"] for payload in results.payloads.values()])  # [K, P]
        k = stacked.shape[0]
        trim = int(self.params.trim_fraction * k)
        kept = stacked.sort(dim=0).values[trim : k - trim]  # [K - 2·trim, P]
        return {**server_state, "weights": kept.mean(dim=0)}, {"trimmed_clients": float(2 * trim)}
