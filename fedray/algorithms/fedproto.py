"""FedProto (Tan et al., AAAI 2022), as the FedSC / FedSKC papers use it: a baseline with a shared
global model plus global class prototypes.

**Client:** with z = f(x) (``model.encode``) and C̄ the global prototypes of round r−1::

    L = CE(h(z), y) + λ · MSE(z, C̄^{y})          (FedProto's local objective: supervised loss + λ · prototype regulariser)

MSE is the mean of squared differences over the whole batch × feature dim, as FedProto's code
(``ld · nn.MSELoss``) and PFLlib's ``clientproto.py``: λ·Σ_i ‖z_i − C̄^{y_i}‖²/(B·d) with B the batch
size. A sample whose class has no global prototype has its own feature as target there, i.e. a zero
residual: it adds nothing to the sum but still counts in B (:func:`prototype_alignment`). Round 1 is
CE only. After training the client computes its per-class feature sums and counts with the final
local model (eval mode, no augmentation).

**Server:** C̄^j = Σ_k n_k^j c_k^j / Σ_k n_k^j (FedProto's class-count-weighted prototype aggregation). That is
a ratio of sums, so class sums and counts are pre-aggregated in the workers (``sums``) like the
weights, which are averaged with FedAvg.

**Deviation from the FedProto paper:** FedProto proper exchanges only prototypes (no weight
averaging, heterogeneous local models, personalised evaluation). The FedSC and FedSKC papers
evaluate one global model on the full test set for every baseline, so this baseline averages the
weights as well; the prototype-only variant is not
implemented.

**Inference** (``algorithm.inference``): ``classifier`` (default, the global model's classifier) or
``nearest_prototype`` (FedProto's rule: the class of the nearest global prototype in feature space,
implemented in :meth:`FedProto.predict` with logits −‖z − C̄^j‖²; classes without a prototype are
never predicted).

**Paper symbols → config keys:** λ → ``algorithm.mu`` (default 1, FedProto's ``ld``).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field

from fedray.algorithms.base import (
    Algorithm,
    AlgorithmParams,
    Broadcast,
    ClientContext,
    ClientUpdate,
    RoundResults,
    ServerState,
    Tensor,
    weighted_mean,
    weighted_weights_sums,
)
from fedray.algorithms.fedsc import eval_pass_class_sums
from fedray.algorithms.local import local_train
from fedray.algorithms.prototypes import class_means
from fedray.algorithms.uploads import MODEL_WEIGHTS, Upload
from fedray.algorithms.requirements import CLASS_LABELS
from fedray.models import FedModel, get_flat_weights, set_flat_weights


class FedProtoParams(AlgorithmParams):
    mu: float = Field(1.0, ge=0, description="prototype-alignment weight λ")
    inference: Literal["classifier", "nearest_prototype"] = Field("classifier", description="how the global model predicts")


def nearest_prototype_logits(features: Tensor, prototypes: Tensor, present: Tensor) -> Tensor:
    """Logits −‖z − C̄^j‖² ``[B, C]`` whose argmax is the nearest prototype; −inf for absent classes."""
    logits = -torch.cdist(features, prototypes).pow(2)
    return logits.masked_fill(~present.unsqueeze(0), float("-inf"))


def prototype_alignment(features: Tensor, labels: Tensor, prototypes: Tensor, present: Tensor) -> Tensor:
    """FedProto's prototype regulariser: Σ_i ‖z_i − C̄^{y_i}‖² / (B·d) over the samples whose class
    has a global prototype, B being the whole batch (``features`` ``[B, d]``, ``labels`` ``[B]``,
    ``prototypes`` ``[C, d]``, ``present`` ``[C]``). Samples of a class without a prototype count as a
    zero residual, as in FedProto's and PFLlib's code, which substitute the sample's own feature for
    the missing prototype; no gradient flows into the prototypes."""
    keep = present[labels].unsqueeze(1).to(features.dtype)
    residual = (features - prototypes[labels].detach()) * keep  # zero (value and gradient) without a prototype
    return residual.pow(2).mean()


class FedProto(Algorithm):
    name = "fedproto"
    requires = frozenset({CLASS_LABELS})
    uploads = frozenset(
        {
            MODEL_WEIGHTS,
            Upload(
                "prototypes",
                sums=("class_sums", "class_counts"),
                clipped=(("class_sums", "clip_prototypes"), ("class_counts", "clip_counts")),
                compressed=("class_sums",),
                robust=(("class_sums", "class_counts"),),
            ),
        }
    )
    Params = FedProtoParams
    params: FedProtoParams

    def init_server_state(self, model: FedModel) -> ServerState:
        return {
            "weights": get_flat_weights(model),
            "prototypes": torch.zeros(self.info.num_classes, model.feature_dim),  # C̄: [C, d]
            "prototype_present": torch.zeros(self.info.num_classes, dtype=torch.bool),
        }

    def broadcast(self, server_state: ServerState, round: int) -> Broadcast:
        return dict(server_state)

    def aggregate(self, server_state: ServerState, round: int, results: RoundResults) -> tuple[ServerState, dict[str, float]]:
        counts = results.sums["class_counts"]
        state = {
            "weights": weighted_mean(results.sums),
            "prototypes": class_means(results.sums["class_sums"], counts).float(),
            "prototype_present": counts > 0,
        }
        return state, {"prototype_classes": float((counts > 0).sum())}

    def client_update(self, ctx: ClientContext, broadcast: Broadcast) -> ClientUpdate:
        model, mu = ctx.model, self.params.mu
        set_flat_weights(model, broadcast["weights"])
        prototypes = broadcast["prototypes"].to(ctx.device)
        present = broadcast["prototype_present"].to(ctx.device)
        use_alignment = mu > 0 and bool(present.any())

        def loss_fn(x: Tensor, y: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
            features = model.encode(x)
            ce = F.cross_entropy(model.classify(features), y)
            if not use_alignment:
                return ce, {"ce": ce.detach()}
            alignment = prototype_alignment(features, y, prototypes, present)
            return ce + mu * alignment, {"ce": ce.detach(), "prototype_loss": alignment.detach()}

        metrics = local_train(ctx, loss_fn)
        class_sums, class_counts = eval_pass_class_sums(model, model.encode, ctx)
        sums = {**weighted_weights_sums(model, ctx.num_samples), "class_sums": class_sums, "class_counts": class_counts}
        return ClientUpdate(sums=sums, metrics=metrics)

    def predict(self, model: FedModel, x: Tensor, broadcast: Broadcast) -> Tensor:
        present = broadcast["prototype_present"]
        if self.params.inference == "classifier" or not bool(present.any()):
            return model(x)
        return nearest_prototype_logits(model.encode(x), broadcast["prototypes"].to(x.device), present.to(x.device))
