"""FedLC (Zhang et al., ICML 2022): federated learning with logit calibration.

Under label skew, softmax cross-entropy overfits a client's majority classes. FedLC subtracts a
class-dependent margin from every logit before the softmax (paper Eq. 8–9, the form of the
FedRCL lab's and ``bytedance/FedDecorr``'s codes)::

    L = −log [ exp(z_y − τ n_{k,y}^{−1/4}) / Σ_c exp(z_c − τ n_{k,c}^{−1/4}) ]

with n_{k,c} the count of class c in client k's training split, so locally rarer classes get larger
margins. The denominator runs over all classes (the paper's display excludes y′ = y; both
reference codes use the full sum). Classes the client lacks have margin ∞ and drop out of the
softmax (``absent_classes: exclude``, as both codes' ``pow(0, −1/4) = inf``); ``clamp`` uses
n ← max(n, 1e-8) instead. Inference uses the raw logits. Clients upload FedAvg's weighted sums
(reduced in the workers); the server is FedAvg, or a server optimizer (``algorithm.server_optimizer``:
FedRCL's Table 5 runs FedAvgM + FedLC and FedADAM + FedLC).

Symbols → config keys: τ → ``algorithm.calibration_tau`` (1.0, FedRCL's setting; the FedDecorr
repository uses 0.1). τ here scales a margin, it is not a temperature, so it does not take the
project's ``algorithm.tau``. τ = 0 is FedAvg.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from fedray.algorithms.base import Broadcast, ClientContext
from fedray.algorithms.fedavg import FedAvg, FedAvgParams
from fedray.algorithms.local import LossFn
from fedray.algorithms.losses import logit_calibrated_cross_entropy
from fedray.algorithms.requirements import CLASS_LABELS


class FedLCParams(FedAvgParams):
    calibration_tau: float = Field(1.0, ge=0, description="calibration strength τ of the margin τ·n_c^(−1/4) (0: FedAvg)")
    absent_classes: Literal["exclude", "clamp"] = Field(
        "exclude", description="classes with no local sample: out of the softmax, or count clamped to 1e-8"
    )


class FedLC(FedAvg):
    name = "fedlc"
    requires = frozenset({CLASS_LABELS})
    Params = FedLCParams
    params: FedLCParams

    def local_loss(self, ctx: ClientContext, broadcast: Broadcast) -> LossFn:
        model, params = ctx.model, self.params
        counts = torch.bincount(ctx.y, minlength=self.info.num_classes)  # the training split only

        def loss_fn(x: torch.Tensor, y: torch.Tensor):
            return logit_calibrated_cross_entropy(model(x), y, counts, params.calibration_tau, params.absent_classes), {}

        return loss_fn
