"""FedDecorr (Shi et al., ICLR 2023): decorrelating representations against dimensional collapse.

Heterogeneous clients collapse their representations into few dimensions. FedDecorr penalises the
correlations between feature dimensions within each batch. With Z ``[N, d]`` the batch's
pre-classifier features (``model.encode``), standardised per column (unbiased variance + 1e-8) into
Ẑ, and M = ẐᵀẐ::

    L = CE + β · mean_{i≠j}(M_ij²) / N                (0 for a batch of one sample)

This is the official code's form (``bytedance/FedDecorr`` ``loss.py``); the paper writes
(1/d²)‖K‖_F² with the correlation matrix K, about N times smaller and with the constant diagonal.
Published β values were tuned with the code's form. The scale depends on the batch size, so β does
not transfer across batch sizes. Computed in float32.

Clients upload FedAvg's weighted sums (reduced in the workers); the server is FedAvg or a server
optimizer (``algorithm.server_optimizer``: FedRCL's Table 5 runs FedAvgM/FedADAM + FedDecorr).

Symbols → config keys: β → ``algorithm.beta`` (0.1, the official CIFAR-10 script; 0.05 on CIFAR-100,
0.01 in FedRCL's table). β = 0 is FedAvg.
"""

from __future__ import annotations

import torch
from pydantic import Field

from fedray.algorithms.base import Broadcast, ClientContext
from fedray.algorithms.fedavg import FedAvg, FedAvgParams
from fedray.algorithms.local import LossFn
from fedray.algorithms.losses import decorrelation_loss
from fedray.algorithms.requirements import PER_SAMPLE_OUTPUTS


class FedDecorrParams(FedAvgParams):
    beta: float = Field(0.1, ge=0, description="decorrelation weight β")


class FedDecorr(FedAvg):
    name = "feddecorr"
    requires = FedAvg.requires | {PER_SAMPLE_OUTPUTS}
    Params = FedDecorrParams
    params: FedDecorrParams

    def local_loss(self, ctx: ClientContext, broadcast: Broadcast) -> LossFn:
        model, beta = ctx.model, self.params.beta
        if beta == 0:
            return super().local_loss(ctx, broadcast)

        def loss_fn(x: torch.Tensor, y: torch.Tensor):
            features = model.encode(x)
            base = self.task.loss(model.classify(features), y)
            decorrelation = decorrelation_loss(features)
            return base + beta * decorrelation, {self.task.loss_term: base.detach(), "decorrelation": decorrelation.detach()}

        return loss_fn
