"""FedProc (Mu et al., FGCS 2023): prototypical contrastive federated learning.

Global class prototypes (the server's mean of the clients' class-mean features) are anchors: a
local InfoNCE pulls each feature toward its class prototype and away from the other classes', and
its weight against cross-entropy changes over the rounds. The paper could not be checked and there
is no official code; this follows the widely copied third-party ``fedproc.py`` (FPL / RethinkFL
code bases), with the unverified choices behind switches.

**Client.** f = ``model.encode(x)``; for a sample whose class y has a global prototype::

    ℓ = −log [ exp(cos(f, P^y)/τ) / Σ_{c with a prototype} exp(cos(f, P^c)/τ) ]
    L = α_t · mean ℓ + (1 − α_t) · CE

The mean runs over the batch's samples that have a prototype (:func:`prototype_contrastive_loss`
with one prototype per class); the others add no contrastive gradient. ``schedule: linear_decay``
(third-party code) uses α_t = 1 − (t − 1)/(T − 1) for rounds t = 1..T (T = ``train.rounds``; 0 when
T = 1), so the last round is CE only; ``constant`` uses α_t = ``algorithm.mu``. While no class has a
prototype (round 1) the loss is CE alone: the third-party code's α₁·0 + 0·CE would train nothing.

**Upload.** FedAvg's weighted weights plus per-class features of the final local model (eval mode,
no augmentation): with ``proto_weighting: clients`` the client's class means and a 0/1 indicator of
the classes it holds, with ``samples`` its class feature sums and counts. All are sums, reduced in
the workers.

**Server.** Weights: the weighted mean, or a server optimizer (``algorithm.server_optimizer``).
Prototypes: ``clients`` (third-party code) the unweighted mean of the class means over this round's
clients holding the class; ``samples`` the sample-weighted mean. A class no participant holds has
no prototype next round. Broadcast: weights, prototypes ``[C, d]``, ``has_prototype`` ``[C]`` and α_t.

Symbols → config keys: τ → ``algorithm.tau`` (1: the third-party code's untempered cosine, whose
gradients are weak, as FedRCL's Table 1 shows for FedProc early on), the schedule →
``algorithm.schedule`` (``linear_decay`` | ``constant``), the constant weight → ``algorithm.mu``
(0.5), the prototype mean → ``algorithm.proto_weighting`` (``clients`` | ``samples``). The paper's
"hybrid local network" (possibly a projection layer) is not modelled: the features are the encoder's.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field

from fedray.algorithms.base import Broadcast, ClientContext, ClientUpdate, RoundResults, ServerState, Tensor
from fedray.algorithms.fedavg import FedAvg, FedAvgParams
from fedray.algorithms.fedsc import eval_pass_class_sums
from fedray.algorithms.local import LossFn
from fedray.algorithms.losses import prototype_contrastive_loss
from fedray.algorithms.prototypes import class_means
from fedray.algorithms.uploads import Upload
from fedray.algorithms.requirements import CLASS_LABELS
from fedray.models import FedModel


class FedProcParams(FedAvgParams):
    tau: float = Field(1.0, gt=0, description="temperature τ of the prototype InfoNCE (1: untempered, third-party code)")
    schedule: Literal["linear_decay", "constant"] = Field(
        "linear_decay", description="contrastive weight α_t: 1 − (t−1)/(T−1), or algorithm.mu every round"
    )
    mu: float = Field(0.5, ge=0, le=1, description="constant contrastive weight (schedule: constant)")
    proto_weighting: Literal["clients", "samples"] = Field(
        "clients", description="global prototype: mean of client class means, or sample-weighted mean"
    )


def prototype_upload(class_sums: Tensor, class_counts: Tensor, weighting: str) -> dict[str, Tensor]:
    """A client's prototype sums: class means and a holds-the-class indicator (``clients``), or
    class feature sums and counts (``samples``); float64, reduced in the workers."""
    if weighting == "clients":
        return {"proto_sum": class_means(class_sums, class_counts).double(), "proto_weight": (class_counts > 0).double()}
    return {"proto_sum": class_sums.double(), "proto_weight": class_counts.double()}


class FedProc(FedAvg):
    name = "fedproc"
    requires = FedAvg.requires | {CLASS_LABELS}
    uploads = FedAvg.uploads | {
        Upload(
            "prototypes",
            sums=("proto_sum", "proto_weight"),
            clipped=(("proto_sum", "clip_prototypes"), ("proto_weight", "clip_counts")),
            compressed=("proto_sum",),
            robust=(("proto_sum", "proto_weight"),),
        )
    }
    Params = FedProcParams
    params: FedProcParams

    def contrastive_weight(self, round: int) -> float:
        """α_t of round ``round``."""
        if self.params.schedule == "constant":
            return self.params.mu
        rounds = self.config.train.rounds
        return 0.0 if rounds == 1 else 1.0 - (round - 1) / (rounds - 1)

    # ----------------------------------------------------------------- server side
    def init_server_state(self, model: FedModel) -> ServerState:
        return {
            **super().init_server_state(model),
            "prototypes": torch.zeros(self.info.num_classes, model.feature_dim),
            "has_prototype": torch.zeros(self.info.num_classes, dtype=torch.bool),
        }

    def broadcast(self, server_state: ServerState, round: int) -> Broadcast:
        return {
            "weights": server_state["weights"],
            "prototypes": server_state["prototypes"],
            "has_prototype": server_state["has_prototype"],
            "alpha_t": self.contrastive_weight(round),
        }

    def aggregate(self, server_state: ServerState, round: int, results: RoundResults) -> tuple[ServerState, dict[str, float]]:
        weight = results.sums["proto_weight"]
        new_state = {
            **server_state,
            **self.server_step(server_state, results),
            "prototypes": class_means(results.sums["proto_sum"], weight).float(),
            "has_prototype": weight > 0,
        }
        return new_state, {"prototype_classes": float((weight > 0).sum())}

    # ----------------------------------------------------------------- client side
    def local_loss(self, ctx: ClientContext, broadcast: Broadcast) -> LossFn:
        present = broadcast["has_prototype"].to(ctx.device)
        if not bool(present.any()):
            return super().local_loss(ctx, broadcast)  # no anchors yet: CE alone
        model, alpha_t, tau = ctx.model, float(broadcast["alpha_t"]), self.params.tau
        prototypes = broadcast["prototypes"].to(ctx.device)[present]
        prototype_classes = torch.nonzero(present).flatten()

        def loss_fn(x: Tensor, y: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
            features = model.encode(x)
            ce = F.cross_entropy(model.classify(features), y)
            contrastive = prototype_contrastive_loss(features, y, prototypes, prototype_classes, tau, None)
            return alpha_t * contrastive + (1 - alpha_t) * ce, {"ce": ce.detach(), "contrastive": contrastive.detach()}

        return loss_fn

    def client_update(self, ctx: ClientContext, broadcast: Broadcast) -> ClientUpdate:
        update = super().client_update(ctx, broadcast)
        class_sums, class_counts = eval_pass_class_sums(ctx.model, ctx.model.encode, ctx)
        update.sums.update(prototype_upload(class_sums, class_counts, self.params.proto_weighting))
        return update
