"""MOON: Model-Contrastive Federated Learning (Li, He and Song, CVPR 2021).

**Client:** with z = projector(encoder(x)) of the model being trained, z_glob that of the received
global model and z_prev that of the client's own model after its previous participation (both
frozen, eval mode)::

    L = CE + μ · ℓ_con,
    ℓ_con = −log e^{cos(z, z_glob)/τ} / (e^{cos(z, z_glob)/τ} + e^{cos(z, z_prev)/τ})   (MOON Eq. 3–4)

In a client's first participation there is no previous model, hence no negative, and ℓ_con = 0.

**Server:** FedAvg (sample-weighted mean, pre-aggregated in the workers).

**Per-client state:** the previous local model (its ``encoder.`` and ``projector.`` entries, which
are all z_prev needs) is the client's ``ClientUpdate.state`` and comes back as ``ctx.state`` next
time, so it lives in the runtime's client state store (worker cache + run directory), survives
worker failures and is restored on resume; the driver never holds it.

**Deviation:** MOON's network classifies from the projection head's output; fedray models classify
from the encoder features and the projection head (``model.projection_dim``, required; MOON uses
256 on CIFAR) is a side branch used only by ℓ_con.

**Paper symbols → config keys:** τ → ``algorithm.tau`` (0.5, the paper's value), μ →
``algorithm.mu`` (default 1; the paper uses 5 on CIFAR-10 and 1 on CIFAR-100 / Tiny-ImageNet).
With μ = 0 the run is FedAvg.
"""

from __future__ import annotations

import torch
from pydantic import Field

from fedray.algorithms.base import (
    Algorithm,
    AlgorithmParams,
    Broadcast,
    ClientContext,
    ClientUpdate,
    FrozenCopies,
    Tensor,
    weighted_weights_sums,
)
from fedray.algorithms.local import local_train
from fedray.algorithms.losses import model_contrastive_loss
from fedray.algorithms.requirements import PER_SAMPLE_OUTPUTS, PROJECTION_HEAD
from fedray.algorithms.uploads import MODEL_WEIGHTS
from fedray.config import RunConfig
from fedray.data import DatasetInfo
from fedray.models import FedModel, get_flat_weights, set_flat_weights

REPRESENTATION_PREFIXES = ("encoder.", "projector.")  # the part of a model that z depends on
PREVIOUS_MODEL = "previous_model"  # client-state key: flat encoder + projector weights


class MOONParams(AlgorithmParams):
    tau: float = Field(0.5, gt=0, description="temperature τ of the model-contrastive loss")
    mu: float = Field(1.0, ge=0, description="weight μ of the model-contrastive loss")


class MOON(Algorithm):
    name = "moon"
    keeps_client_state = True
    requires = frozenset({PER_SAMPLE_OUTPUTS, PROJECTION_HEAD})
    uploads = frozenset({MODEL_WEIGHTS})
    Params = MOONParams
    params: MOONParams

    def __init__(self, config: RunConfig, info: DatasetInfo) -> None:
        super().__init__(config, info)
        self._frozen = FrozenCopies()  # worker-local copies for z_glob and z_prev

    def client_update(self, ctx: ClientContext, broadcast: Broadcast) -> ClientUpdate:
        model, params = ctx.model, self.params
        set_flat_weights(model, broadcast["weights"])
        global_model = previous_model = None
        if params.mu > 0:
            global_model = self._frozen.load("global", model, broadcast["weights"])
            if ctx.state is not None:
                previous_model = self._frozen.load("previous", model, ctx.state[PREVIOUS_MODEL], REPRESENTATION_PREFIXES)

        def representation(net: FedModel, x: Tensor) -> Tensor:
            return net.project(net.encode(x))

        def loss_fn(x: Tensor, y: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
            features = model.encode(x)
            base = self.task.loss(model.classify(features), y)
            if global_model is None:
                return base, {self.task.loss_term: base.detach()}
            with torch.no_grad():
                z_global = representation(global_model, x)
                z_previous = None if previous_model is None else representation(previous_model, x)
            contrastive = model_contrastive_loss(model.project(features), z_global, z_previous, params.tau)
            return base + params.mu * contrastive, {self.task.loss_term: base.detach(), "contrastive": contrastive.detach()}

        metrics = local_train(ctx, loss_fn)
        return ClientUpdate(
            sums=weighted_weights_sums(model, ctx.num_samples),
            metrics=metrics,
            state={PREVIOUS_MODEL: get_flat_weights(model, REPRESENTATION_PREFIXES)},
        )
