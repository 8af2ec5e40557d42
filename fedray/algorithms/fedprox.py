"""FedProx (Li et al., MLSys 2020): FedAvg plus a proximal term on the local objective.

Local loss: ``CE(f(x), y) + μ/2 · ‖w − w_global‖²`` (paper Eq. 2), μ = ``algorithm.mu``. With μ = 0
it is exactly FedAvg. Aggregation is FedAvg's sample-weighted mean, optionally followed by a server
optimizer (``algorithm.server_optimizer``, :mod:`fedray.algorithms.server_optimizers`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field

from fedray.algorithms.base import Broadcast, ClientContext, ClientUpdate, weighted_weights_sums
from fedray.algorithms.local import local_train
from fedray.algorithms.losses import proximal_term
from fedray.algorithms.server_optimizers import ServerOptimizedAlgorithm, ServerOptimizerParams
from fedray.models import set_flat_weights


class FedProxParams(ServerOptimizerParams):
    mu: float = Field(0.01, ge=0, description="proximal weight μ")


class FedProx(ServerOptimizedAlgorithm):
    name = "fedprox"
    Params = FedProxParams

    def client_update(self, ctx: ClientContext, broadcast: Broadcast) -> ClientUpdate:
        model = ctx.model
        set_flat_weights(model, broadcast["weights"])
        global_parameters = [p.detach().clone() for p in model.parameters()]
        mu = self.params.mu

        def loss_fn(x: torch.Tensor, y: torch.Tensor):
            ce = F.cross_entropy(model(x), y)
            proximal = proximal_term(model.parameters(), global_parameters)
            return ce + 0.5 * mu * proximal, {"ce": ce.detach(), "proximal": proximal.detach()}

        metrics = local_train(ctx, loss_fn)
        return ClientUpdate(sums=weighted_weights_sums(model, ctx.num_samples), metrics=metrics)
