"""FedSKC: Federated Learning with Non-IID Data via Structural Knowledge Collaboration (Wang et al.,
ICWS 2025).

Implemented from the paper as recorded in docs/algorithms_prototypes.md (FedSKC). The "structural
knowledge" lives in logit space: c_k^j = SiLU(mean over client k's class-j samples of the logits
h(f(x))), a C-vector per class.

**Client** (:meth:`FedSKC.client_update`), with l = h(f(x)) the logits and c̃ the global knowledge
of round r−1::

    L = CE + λ_LCL(r) · LCL                                           (Alg. 1 line 37)
    LCL(i) = −log e^{s(l_i, c̃^{y_i})/τ} / Σ_j e^{s(l_i, c̃^j)/τ},  s = cos(l, c̃^j) / 𝒰_j   (Eq. 2–3)

CE only in round 1 (no knowledge yet; the official code uses uninitialised anchors there). Then
the knowledge c_k^j of the final local model.

**Server** (:meth:`FedSKC.aggregate`, in the server actor):

1. global knowledge c̃^j (Eq. 1, :func:`global_knowledge`): each client's knowledge averaged with
   its M nearest clients' (Euclidean; ties by client id), then averaged over the clients with class j;
2. GDA (Eq. 4, :func:`gda_weights`): d_k = Σ_j ‖c_k^j − c̃^j‖₂, a_k = d_k/Σd, b_k = N_k/ΣN,
   e_k ∝ σ(N_k − a_k d_k + b_k), w = Σ e_k w_k;
3. GPR (Eq. 5, :func:`period_review`), from round 2: ρ = relative change of Σ_j Var(c̃^j) (over
   the classes present in both rounds), w ← β·w + (1−β)·ρ·(w_prev − w), w_prev the model broadcast
   at the start of the round.

**Why the weights travel per client.** e_k needs this round's c̃, known only after every client
has uploaded, and the normalisers Σd, ΣN over the cohort; nothing known at broadcast time gives
them, so the workers cannot pre-multiply. With ``gda_mode`` ``paper`` or ``normalized`` each client
therefore sends its flat weights (float32) in ``payload`` (O(clients) model-sized transfers per
round, fine for the papers' 8 clients per round); with ``gda_mode="fedavg"`` the weights go through
the workers' ``sums`` as in FedAvg.

**Paper symbols → config keys:** τ → ``algorithm.tau`` (0.08), 𝓜 → ``algorithm.num_neighbors`` (1),
β → ``algorithm.beta`` (0.95; the code hard-codes 0.99), α (Dirichlet) → ``data.alpha``; λ_LCL →
``algorithm.lam_lcl`` (1). Eq. 4's a_k, b_k are data-derived, not tunable. FedSKC uses no μ.

**Variants** (default first; paper / code / reasons per switch in docs/algorithms_prototypes.md,
'Ambiguities', FedSKC):

- ``gda_mode``: ``paper`` (literal Eq. 4; with thousands of samples per client the sigmoids
  saturate and the weights are exactly uniform) | ``normalized`` (non-paper: e_k ∝
  σ(b_k − d_k/Σd)) | ``fedavg`` (what the code effectively runs);
- ``gpr_mode``: ``paper`` (literal Eq. 5, which also shrinks w by β each round) | ``residual``
  (w ← w + (1−β)·ρ·(w_prev − w), the non-shrinking reading) | ``off``. ρ is unbounded, and
  no clamp is applied because the paper has none: after a near-flat round-1 knowledge, ρ can reach
  the thousands and GPR then extrapolates far past w_prev (docs/algorithms_prototypes.md);
- ``knowledge_transform``: ``silu`` (paper) | ``none`` (code);
- ``lcl_variant``: ``paper`` | ``code`` (positive counted twice, plain cosine; ``u_mode`` does not
  apply); ``lcl_warmup_rounds``: 0 (paper) or W for λ_LCL(r) = lam_lcl · min(r/W, 1) (code: 100);
- ``u_mode`` (𝒰_j of Eq. 2): ``batch`` | ``dataset`` | ``none`` (as FedSC). When logits and
  knowledge are both near 0 (early rounds), 𝒰 is small and 1/𝒰 makes LCL very sharp;
  ``none`` (𝒰 = 1) avoids that;
- ``proto_source``: ``eval_pass`` | ``last_epoch`` (as FedSC).

With ``lam_lcl = 0``, ``gda_mode="fedavg"`` and ``gpr_mode="off"`` the run is exactly FedAvg (a test
checks this).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field, field_validator

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
from fedray.algorithms.fedsc import (
    DistanceScaleMode,
    LastEpochClassSums,
    LocalEpochClock,
    ProtoSource,
    embed_client_data,
    eval_pass_class_sums,
    merge_with_neighbours,
)
from fedray.algorithms.local import local_train
from fedray.algorithms.losses import distance_scale, duplicated_positive_anchor_loss, prototype_contrastive_loss
from fedray.algorithms.prototypes import class_means
from fedray.algorithms.uploads import MODEL_WEIGHTS, Upload
from fedray.algorithms.requirements import CLASS_LABELS
from fedray.models import FedModel, get_flat_weights, set_flat_weights

GdaMode = Literal["paper", "normalized", "fedavg"]
GprMode = Literal["paper", "residual", "off"]


class FedSKCParams(AlgorithmParams):
    tau: float = Field(0.08, gt=0, description="LCL temperature τ (Eq. 3)")
    num_neighbors: int = Field(1, ge=0, description="𝓜: neighbour clients merged per knowledge vector (Eq. 1)")
    beta: float = Field(0.95, ge=0, le=1, description="GPR coefficient β (Eq. 5)")
    lam_lcl: float = Field(1.0, ge=0, description="weight of LCL (paper: 1)")
    lcl_warmup_rounds: int = Field(0, ge=0, description="linear LCL ramp over this many rounds (0: none; code: 100)")
    lcl_variant: Literal["paper", "code"] = Field("paper", description="LCL form: paper | official code")
    u_mode: DistanceScaleMode = Field("batch", description="𝒰_j of Eq. 2")
    knowledge_transform: Literal["silu", "none"] = Field("silu", description="c = SiLU(mean logits) (paper) | mean logits")
    gda_mode: GdaMode = Field("paper", description="GDA weights (Eq. 4)")
    gpr_mode: GprMode = Field("paper", description="GPR form (Eq. 5)")
    proto_source: ProtoSource = Field("eval_pass", description="source of the client knowledge")

    @field_validator("gpr_mode", mode="before")
    @classmethod
    def _yaml_off_is_false(cls, value: object) -> object:
        """YAML 1.1 reads a bare ``off`` (``gpr_mode: off``, ``--set algorithm.gpr_mode=off``) as false."""
        return "off" if value is False else value


# ----------------------------------------------------------------------------- server maths


def global_knowledge(knowledge: Tensor, num_neighbors: int) -> Tensor:
    """c̃^j from the knowledge vectors c_k^j ``[S, C]`` of the clients with class j (ascending client
    id): each merged with its 𝓜' = min(𝓜, S−1) Euclidean nearest (Eq. 1), then averaged."""
    merged, _ = merge_with_neighbours(knowledge, torch.cdist(knowledge, knowledge), num_neighbors)
    return merged.mean(dim=0)


def knowledge_discrepancy(knowledge: Tensor, present: Tensor, global_kn: Tensor) -> Tensor:
    """d_k = Σ_{j: N_k^j > 0} ‖c_k^j − c̃^j‖₂ for ``knowledge`` ``[K, C, C]``, ``present`` ``[K, C]``
    and ``global_kn`` ``[C, C]`` (Eq. 4); ``[K]``."""
    distances = torch.linalg.vector_norm(knowledge - global_kn.unsqueeze(0), dim=2)
    return (distances * present).sum(dim=1)


def gda_weights(num_samples: Tensor, discrepancies: Tensor, mode: GdaMode = "paper") -> Tensor:
    """Aggregation weights e_k (float64, sum 1).

    ``paper`` (Eq. 4): e_k ∝ σ(N_k − a_k·d_k + b_k), a_k = d_k/Σd (0 if Σd = 0), b_k = N_k/ΣN, raw
    N_k; ``normalized``: e_k ∝ σ(b_k − d_k/Σd); ``fedavg``: e_k = N_k/ΣN."""
    n, d = num_samples.double(), discrepancies.double()
    share = n / n.sum()
    if mode == "fedavg":
        return share
    relative = d / d.sum() if d.sum() > 0 else torch.zeros_like(d)
    scores = torch.sigmoid(n - relative * d + share) if mode == "paper" else torch.sigmoid(share - relative)
    return scores / scores.sum()


def knowledge_variance_ratio(knowledge: Tensor, present: Tensor, previous: Tensor, previous_present: Tensor) -> float | None:
    """ρ_r = (Σ_j σ²_{r,j} − Σ_j σ²_{r−1,j}) / Σ_j σ²_{r−1,j}, σ² the population variance of the
    entries of c̃^j, over the classes present in both rounds (Eq. 5). None when there is no such
    class or the previous sum is 0 (GPR is skipped)."""
    common = present & previous_present
    if not bool(common.any()):
        return None
    now = knowledge[common].double().var(dim=1, unbiased=False).sum()
    before = previous[common].double().var(dim=1, unbiased=False).sum()
    if before == 0:
        return None
    return float((now - before) / before)


def period_review(weights: Tensor, previous: Tensor, rho: float, beta: float, mode: GprMode = "paper") -> Tensor:
    """GPR (Eq. 5) on flat floating-point weights (integer buffers are not in the flat layout):
    ``paper`` w ← β·w + (1−β)·ρ·(w_prev − w); ``residual`` w ← w + (1−β)·ρ·(w_prev − w); ``off`` w."""
    if mode == "off":
        return weights
    correction = (1.0 - beta) * rho * (previous - weights)
    return (beta * weights if mode == "paper" else weights) + correction


def knowledge_transform(mean_logits: Tensor, transform: str) -> Tensor:
    """c = SiLU(mean logits) = x·σ(x) (``silu``, the paper's "non-linear normalized transform") or
    the mean logits (``none``)."""
    return F.silu(mean_logits) if transform == "silu" else mean_logits


# ----------------------------------------------------------------------------- algorithm

LOGIT_KNOWLEDGE = Upload(
    "logit knowledge",
    payload=("knowledge", "class_present", "num_samples"),
    clipped=(("knowledge", "clip_logits"),),
    constant=("class_present", "num_samples"),  # every class, uniform b_k (Eq. 4)
    compressed=("knowledge",),
)
#: ``gda_mode`` paper/normalized: each client's flat weights, which GDA weighs one by one (compression
#: encodes them as their update against the broadcast weights, as it does the weights' sums)
WEIGHTS_PER_CLIENT = Upload(
    "model weights per client", payload=("weights",), avoided_by="algorithm.gda_mode=fedavg", model_weights=("weights",)
)


class FedSKC(Algorithm):
    name = "fedskc"
    requires = frozenset({CLASS_LABELS})
    uploads = frozenset({MODEL_WEIGHTS, LOGIT_KNOWLEDGE, WEIGHTS_PER_CLIENT})
    Params = FedSKCParams
    params: FedSKCParams

    def run_uploads(self) -> frozenset[Upload]:
        """The weights go through the sums with ``gda_mode="fedavg"``, per client otherwise."""
        if self.params.gda_mode == "fedavg":
            return frozenset({MODEL_WEIGHTS, LOGIT_KNOWLEDGE})
        return frozenset({LOGIT_KNOWLEDGE, WEIGHTS_PER_CLIENT})

    def init_server_state(self, model: FedModel) -> ServerState:
        num_classes = self.info.num_classes
        return {
            "weights": get_flat_weights(model),
            "knowledge": torch.zeros(num_classes, num_classes),  # c̃: [C, C], row j = class j
            "knowledge_present": torch.zeros(num_classes, dtype=torch.bool),
        }

    def broadcast(self, server_state: ServerState, round: int) -> Broadcast:
        return dict(server_state)

    def aggregate(self, server_state: ServerState, round: int, results: RoundResults) -> tuple[ServerState, dict[str, float]]:
        params = self.params
        payloads = list(results.payloads.values())  # ascending client id
        knowledge = torch.stack([p["knowledge"] for p in payloads]).double()  # [K, C, C]
        present = torch.stack([p["class_present"] for p in payloads])  # [K, C]
        num_samples = torch.stack([p["num_samples"] for p in payloads]).double()

        num_classes = knowledge.shape[1]
        global_kn = torch.zeros(num_classes, num_classes, dtype=torch.float64)
        for j in range(num_classes):
            holders = torch.nonzero(present[:, j]).flatten()
            if holders.numel() > 0:
                global_kn[j] = global_knowledge(knowledge[holders, j], params.num_neighbors)
        global_present = present.any(dim=0)

        discrepancies = knowledge_discrepancy(knowledge, present, global_kn)
        weights_e = gda_weights(num_samples, discrepancies, params.gda_mode)
        if params.gda_mode == "fedavg":
            weights = weighted_mean(results.sums).double()
        else:
            weights = sum(e * p["weights"].double() for e, p in zip(weights_e, payloads))

        rho = knowledge_variance_ratio(global_kn, global_present, server_state["knowledge"], server_state["knowledge_present"])
        if rho is not None:
            weights = period_review(weights, server_state["weights"].double(), rho, params.beta, params.gpr_mode)

        state = {"weights": weights.float(), "knowledge": global_kn.float(), "knowledge_present": global_present}
        metrics = {
            "discrepancy_mean": float(discrepancies.mean()),
            "aggregation_weight_min": float(weights_e.min()),
            "aggregation_weight_max": float(weights_e.max()),
            "variance_ratio": float("nan") if rho is None else rho,
        }
        return state, metrics

    def lcl_weight(self, round: int) -> float:
        """λ_LCL(r): ``lam_lcl``, ramped linearly over ``lcl_warmup_rounds`` when that is > 0."""
        warmup = self.params.lcl_warmup_rounds
        return self.params.lam_lcl * (min(round / warmup, 1.0) if warmup > 0 else 1.0)

    def client_update(self, ctx: ClientContext, broadcast: Broadcast) -> ClientUpdate:
        params, model = self.params, ctx.model
        set_flat_weights(model, broadcast["weights"])
        present = broadcast["knowledge_present"].to(ctx.device)
        anchors = broadcast["knowledge"].to(ctx.device)[present]  # [C', C]
        anchor_classes = torch.nonzero(present).flatten()
        lam = self.lcl_weight(ctx.round)
        use_lcl = lam > 0 and anchors.shape[0] > 0
        clock = LocalEpochClock(ctx)
        last_epoch = LastEpochClassSums(ctx.info.num_classes) if params.proto_source == "last_epoch" else None
        dataset_scale: Tensor | None = None

        def loss_fn(x: Tensor, y: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
            nonlocal dataset_scale
            epoch, first_step = clock.tick()
            if use_lcl and params.u_mode == "dataset" and first_step:
                dataset_scale = distance_scale(embed_client_data(model, model, ctx), anchors)
            logits = model(x)
            ce = F.cross_entropy(logits, y)
            loss, terms = ce, {"ce": ce.detach()}
            if use_lcl:
                if params.lcl_variant == "code":
                    lcl = duplicated_positive_anchor_loss(logits, y, anchors, anchor_classes, params.tau)
                else:
                    scale = distance_scale(logits, anchors) if params.u_mode == "batch" else dataset_scale
                    lcl = prototype_contrastive_loss(logits, y, anchors, anchor_classes, params.tau, scale)
                loss = loss + lam * lcl
                terms["lcl"] = lcl.detach()
            if last_epoch is not None and epoch == ctx.train.local_epochs - 1:
                last_epoch.add(logits, y)
            return loss, terms

        metrics = local_train(ctx, loss_fn)
        sums, counts = last_epoch.result() if last_epoch is not None else eval_pass_class_sums(model, model, ctx)
        payload = {
            "knowledge": knowledge_transform(class_means(sums, counts), params.knowledge_transform).float(),
            "class_present": counts > 0,
            "num_samples": torch.tensor(float(ctx.num_samples)),
        }
        if params.gda_mode == "fedavg":
            return ClientUpdate(sums=weighted_weights_sums(model, ctx.num_samples), payload=payload, metrics=metrics)
        payload["weights"] = get_flat_weights(model)
        return ClientUpdate(sums={}, payload=payload, metrics=metrics)
