"""FedAvg (McMahan et al., AISTATS 2017): local SGD on cross-entropy, sample-weighted averaging.

Server: ``w ← Σ_k n_k w_k / Σ_k n_k`` over the round's clients (the default
:meth:`Algorithm.aggregate`). The weighted sums are reduced inside each worker.
"""

from __future__ import annotations

import torch.nn.functional as F

from fedray.algorithms.base import Algorithm, Broadcast, ClientContext, ClientUpdate, weighted_weights_sums
from fedray.algorithms.local import local_train
from fedray.models import set_flat_weights


class FedAvg(Algorithm):
    name = "fedavg"

    def client_update(self, ctx: ClientContext, broadcast: Broadcast) -> ClientUpdate:
        set_flat_weights(ctx.model, broadcast["weights"])
        metrics = local_train(ctx, lambda x, y: (F.cross_entropy(ctx.model(x), y), {}))
        return ClientUpdate(sums=weighted_weights_sums(ctx.model, ctx.num_samples), metrics=metrics)
