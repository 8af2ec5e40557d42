"""FedProx (Li et al., MLSys 2020): FedAvg plus a proximal term on the local objective.

Local loss: ``CE(f(x), y) + μ/2 · ‖w − w_global‖²`` (paper Eq. 2), μ = ``algorithm.mu``. With μ = 0
it is exactly FedAvg. Aggregation is FedAvg's sample-weighted mean, optionally followed by a server
optimizer (``algorithm.server_optimizer``, :mod:`fedray.algorithms.server_optimizers`).
"""

from __future__ import annotations

from typing import ClassVar

import torch
from pydantic import Field

from fedray.algorithms.base import Broadcast, ClientContext, Tensor
from fedray.algorithms.fedavg import FedAvg, FedAvgParams
from fedray.algorithms.local import LossFn
from fedray.algorithms.losses import proximal_term


class FedProxParams(FedAvgParams):
    mu: float = Field(0.01, ge=0, description="proximal weight μ")


class FedProx(FedAvg):
    name = "fedprox"
    Params = FedProxParams
    params: FedProxParams
    vectorizable: ClassVar[bool] = True  # its own vectorized_loss (train.vectorize)

    def local_loss(self, ctx: ClientContext, broadcast: Broadcast) -> LossFn:
        model, mu = ctx.model, self.params.mu
        global_parameters = [p.detach().clone() for p in model.parameters()]

        def loss_fn(x: torch.Tensor, y: torch.Tensor):
            base = self.task.loss(model(x), y)
            proximal = proximal_term(model.parameters(), global_parameters)
            return base + 0.5 * mu * proximal, {self.task.loss_term: base.detach(), "proximal": proximal.detach()}

        return loss_fn

    def vectorized_loss(
        self, base: Tensor, params: dict[str, Tensor], start: dict[str, Tensor], inputs: dict[str, Tensor]
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """:meth:`local_loss`'s objective for the vectorised loop: the proximal term of the client's
        parameters to the broadcast ones (``start``), a pure function of both."""
        proximal = proximal_term(params.values(), start.values())
        return base + 0.5 * self.params.mu * proximal, {self.task.loss_term: base, "proximal": proximal}
