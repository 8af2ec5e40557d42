"""FedNTD (Lee et al., NeurIPS 2022): federated not-true distillation.

Local training forgets what the global model knows about classes the client lacks. FedNTD distils
the received global model's predictions over the *not-true* classes only (the true class removed,
so the client stays free to learn it). With zˡ the local logits, zᵍ those of the frozen received
model (eval mode, no gradient) and z̃ the C − 1 columns other than y (paper Eq. 4–5)::

    L_NTD = KL( softmax(z̃ᵍ/τ) ‖ softmax(z̃ˡ/τ) )     (batch mean)

    official:  L = CE + β τ² L_NTD           (the authors' ``NTD_Loss``; their configs: τ = 1, β = 1)
    convex:    L = (1 − β) CE + β L_NTD      (FedRCL's baseline: β = 0.3, the FedRCL lab's code)

Clients upload FedAvg's weighted sums (reduced in the workers); the server is FedAvg or a server
optimizer (``algorithm.server_optimizer``). No client state.

Symbols → config keys: β → ``algorithm.beta`` (1), τ → ``algorithm.tau`` (distillation temperature,
1), the combination → ``algorithm.form`` (``official`` | ``convex``; use ``convex`` with β = 0.3 to
reproduce FedRCL's table). β = 0 with ``official`` is FedAvg.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator

from fedray.algorithms.base import Broadcast, ClientContext, FrozenCopies
from fedray.algorithms.fedavg import FedAvg, FedAvgParams
from fedray.algorithms.local import LossFn
from fedray.algorithms.losses import not_true_distillation
from fedray.algorithms.requirements import CLASS_LABELS
from fedray.config import RunConfig
from fedray.data import DatasetInfo


class FedNTDParams(FedAvgParams):
    beta: float = Field(1.0, ge=0, description="distillation weight β")
    tau: float = Field(1.0, gt=0, description="distillation temperature τ")
    form: Literal["official", "convex"] = Field("official", description="official: CE + βτ²·NTD; convex: (1−β)·CE + β·NTD")

    @model_validator(mode="after")
    def _convex_weight(self) -> "FedNTDParams":
        if self.form == "convex" and self.beta > 1:
            raise ValueError(f"algorithm.beta must be in [0, 1] with algorithm.form=convex, got {self.beta}")
        return self


class FedNTD(FedAvg):
    name = "fedntd"
    requires = frozenset({CLASS_LABELS})
    Params = FedNTDParams
    params: FedNTDParams

    def __init__(self, config: RunConfig, info: DatasetInfo) -> None:
        super().__init__(config, info)
        self._frozen = FrozenCopies()  # the worker's copy of the received global model

    def local_loss(self, ctx: ClientContext, broadcast: Broadcast) -> LossFn:
        model, params = ctx.model, self.params
        if params.beta == 0 and params.form == "official":
            return super().local_loss(ctx, broadcast)
        teacher = self._frozen.load("global", model, broadcast["weights"])
        ce_weight, ntd_weight = (1.0, params.beta * params.tau**2) if params.form == "official" else (1 - params.beta, params.beta)

        def loss_fn(x: torch.Tensor, y: torch.Tensor):
            logits = model(x)
            with torch.no_grad():
                global_logits = teacher(x)
            ce = F.cross_entropy(logits, y)
            ntd = not_true_distillation(logits, global_logits, y, params.tau)
            return ce_weight * ce + ntd_weight * ntd, {"ce": ce.detach(), "ntd": ntd.detach()}

        return loss_fn
