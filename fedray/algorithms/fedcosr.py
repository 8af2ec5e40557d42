"""FedCoSR (Huang et al., "FedCoSR: Personalized Federated Learning with Contrastive Shareable
Representations for Label Heterogeneity in Non-IID Data", arXiv:2404.17916); maths and
choices: docs/algorithms_personalized.md.

Each client's model θ^i = [φ^i; π^i] is split (``algorithm.personal_prefixes``, default
``["classifier."]``) into shared representation layers φ and a personal head π. Per round:

* **Server** (Eq. 5, 6). φ^G = Σ_i n^i φ^i / Σ_i n^i over the round's clients; per class c,
  ω̄^G_c = Σ_i n^i_c ω̄^i_c / Σ_i n^i_c over the clients holding c. A class no participant holds
  keeps its previous centroid; a class never seen has none (``centroid_mask`` false).
* **Local aggregation** (Eq. 7–9). λ = clamp(exp(−γ·L_Reg), 0, 1), L_Reg the client's mean
  InfoNCE of its previous local training (unweighted, detached); φ̂ = λ φ^i + (1 − λ) φ^G on every
  φ tensor, π untouched. λ = 1 keeps the local φ (the opposite of FedALA's convention).
* **Local training** (Eq. 10–15): L = CE(π(ω), y) + α·InfoNCE, ω = φ̂(x) (the encoder output),
  where InfoNCE takes the global centroid of the sample's class as the positive and every other
  class's global centroid as a negative, cosine similarity over temperature τ (Eq. 12–13).
* **Upload** (Alg. 1 l.24–25): φ and, from a full no-grad pass of the trained φ over the client's
  training split, the per-class sums n^i_c·ω̄^i_c and counts n^i_c (Eq. 3–4), plus n^i. The sums
  are the centroids times their counts, so workers can add them up (docs/architecture.md, principle 3); rows
  of classes the client does not hold are zero. π, λ and L_Reg never leave the client.

Paper symbol → config key (docs/architecture.md, hyperparameter names): τ_CL → ``algorithm.tau``; α (loss weight) →
``algorithm.contrast_weight``; γ → ``algorithm.gamma``; the paper's Dirichlet β → ``data.alpha``;
η, b, R, T → ``train.lr``, ``train.batch_size``, ``train.local_epochs``, ``train.rounds``; k is the
model's ``feature_dim``. The paper's aggregation weight "τ_{t+1}" is called λ here.

Choices where the paper is silent (each explained in docs/algorithms_personalized.md, 'Ambiguities'):

* **First participation** (the paper's initialisation round): the client takes the global φ and θ_0's
  head π_0 without mixing. In round 1 there are no global centroids, so it trains on CE only and
  records no L_Reg. Under partial participation a client joining later starts from the *current*
  φ^G (not φ_0) and trains with the contrastive term as configured.
* **No L_Reg yet** (the round after the first participation; 'first λ'): by default ("probe") L_Reg
  is the InfoNCE of the unmixed local φ against the received centroids over the client's whole
  training split, without gradient; ``first_round_lambda`` replaces this by a fixed λ (0: take φ^G).
* **Recorded L_Reg**: the mean of the per-batch InfoNCE means over the local epochs. A sample
  whose class has no global centroid is skipped; a batch with no other sample has InfoNCE 0 and is
  left out of the mean (not counted as 0, which would push λ towards 1 for no reason). Computed
  (detached) even when α = 0 (the "w/o CRL" ablation).
* **Invalid L** (negative or non-finite, e.g. after divergence): ``invalid_loss="clamp"`` clamps L
  to [0, ∞] (NaN → ∞, i.e. λ = 0: take the global φ); ``"raise"`` raises.
* **Ablations** (the paper only names them): w/o LA = ``fixed_lambda: 0``; w/o Sep =
  ``personal_prefixes: []``; w/o CRL = ``contrast_weight: 0``. ``fixed_lambda: 1`` with α = 0 is
  Local after the first round.

Evaluation (PFLlib's protocol; the paper does not define it): each client's model after local
aggregation, before training, on its own held-out split (``data.client_test_fraction``,
``eval.personalized``); see :mod:`fedray.algorithms.personalized`.
"""

from __future__ import annotations

import math
from typing import Callable, Literal

import torch
import torch.nn.functional as F
from pydantic import Field

from fedray.algorithms.base import Broadcast, ClientContext, ClientUpdate, RoundResults, ServerState, Tensor
from fedray.algorithms.local import local_train
from fedray.algorithms.losses import cosine_matrix, mean_or_zero, multi_positive_info_nce
from fedray.algorithms.personalized import PersonalizedAlgorithm, PersonalizedParams
from fedray.algorithms.prototypes import class_means, client_class_sums
from fedray.algorithms.uploads import MODEL_WEIGHTS, Upload
from fedray.algorithms.requirements import CLASS_LABELS
from fedray.config import RunConfig
from fedray.data import DatasetInfo
from fedray.models import FedModel


class FedCoSRParams(PersonalizedParams):
    tau: float = Field(0.5, gt=0, description="InfoNCE temperature τ_CL (Eq. 13)")
    contrast_weight: float = Field(1.0, ge=0, description="weight α of the contrastive term (Eq. 14)")
    gamma: float = Field(1.0, gt=0, description="sensitivity γ of λ = exp(-γ L_Reg) (Eq. 7)")
    fixed_lambda: float | None = Field(None, ge=0, le=1, description="use this λ every round instead of Eq. 7 (0: the w/o LA ablation)")
    first_round_lambda: float | None = Field(None, ge=0, le=1, description="λ while a client has no L_Reg yet (None: probe the InfoNCE)")
    invalid_loss: Literal["clamp", "raise"] = Field(
        "clamp", description="negative or non-finite L_Reg: clamp to [0, inf] (NaN -> inf) or raise"
    )


# --------------------------------------------------------------------- the maths (Eq. 6, 7, 8, 13)


def adaptive_lambda(reg_loss: float, gamma: float, invalid_loss: str = "clamp") -> float:
    """Eq. 7 with the clamp of Alg. 1 l.22: λ = clamp(exp(−γ·L), 0, 1)."""
    if not (math.isfinite(reg_loss) and reg_loss >= 0):
        if invalid_loss == "raise":
            raise ValueError(f"FedCoSR: contrastive loss L_Reg = {reg_loss} is not a finite value >= 0")
        reg_loss = math.inf if math.isnan(reg_loss) else max(reg_loss, 0.0)
    return min(max(math.exp(-gamma * reg_loss), 0.0), 1.0)


def mix_shared(local: Tensor, global_: Tensor, lam: float) -> Tensor:
    """Eq. 8: φ̂ = λ φ^i + (1 − λ) φ^G, element-wise with one scalar λ. Computed in float64 so that
    λ = 1 and λ = 0 give φ^i and φ^G exactly and every element stays between the two."""
    mixed = lam * local.double() + (1.0 - lam) * global_.to(local.device).double()
    return mixed.to(local.dtype)


def centroid_infonce(features: Tensor, labels: Tensor, centroids: Tensor, mask: Tensor, tau: float) -> Tensor:
    """Eq. 12–13: per-sample InfoNCE ``cross_entropy(cos(ω_j, ω̄^G_c) / τ over the classes c with a
    global centroid, y_j)`` — the own class's centroid is the positive, every other class's a
    negative. Classes without a centroid (``mask`` false) are left out (−∞ logits); so are
    samples whose own class has none. Returns the losses of the kept samples ``[b']``. The centroids
    are constants: no gradient reaches them."""
    classes = torch.nonzero(mask).flatten()
    logits = cosine_matrix(features, centroids[classes]) / tau
    return multi_positive_info_nce(logits, classes.unsqueeze(0) == labels.unsqueeze(1))


def aggregate_centroids(centroids: Tensor, mask: Tensor, class_sums: Tensor, class_counts: Tensor) -> tuple[Tensor, Tensor]:
    """Eq. 6 from worker-reduced Σ_i n^i_c ω̄^i_c and Σ_i n^i_c; classes no participant holds keep
    their previous centroid (and mask)."""
    present = class_counts > 0
    new = torch.where(present.unsqueeze(1), class_means(class_sums, class_counts).to(centroids.dtype), centroids)
    return new, mask | present


@torch.no_grad()
def probe_reg_loss(
    encode: Callable[[Tensor], Tensor],
    x_uint8: Tensor,
    labels: Tensor,
    normalize: Callable[[Tensor], Tensor],
    centroids: Tensor,
    mask: Tensor,
    tau: float,
    batch_size: int = 512,
) -> float:
    """InfoNCE of ``encode`` against the centroids over a whole split (no augmentation, no
    gradient): the first-round stand-in for L_Reg ('first λ' in
    docs/algorithms_personalized.md, 'Ambiguities'). 0 when no sample's class has a centroid."""
    total, count = 0.0, 0
    for start in range(0, int(labels.shape[0]), batch_size):
        features = encode(normalize(x_uint8[start : start + batch_size]))
        losses = centroid_infonce(features, labels[start : start + batch_size], centroids, mask, tau)
        total += float(losses.sum())
        count += int(losses.numel())
    return total / max(count, 1)


# --------------------------------------------------------------------- the algorithm


class FedCoSR(PersonalizedAlgorithm):
    name = "fedcosr"
    requires = PersonalizedAlgorithm.requires | {CLASS_LABELS}
    uploads = frozenset(
        {
            MODEL_WEIGHTS,
            Upload(
                "class representations",
                sums=("centroid_sums", "centroid_counts"),
                clipped=(("centroid_sums", "clip_prototypes"), ("centroid_counts", "clip_counts")),
                compressed=("centroid_sums",),
                robust=(("centroid_sums", "centroid_counts"),),
            ),
        }
    )
    Params = FedCoSRParams
    params: FedCoSRParams

    def __init__(self, config: RunConfig, info: DatasetInfo) -> None:
        super().__init__(config, info)
        if config.model.projection_dim is not None:
            raise ValueError(
                "FedCoSR's representation is the encoder output (the head's input); "
                f"model.projection_dim must be null, got {config.model.projection_dim}"
            )

    # ----------------------------------------------------------------- server side
    def init_server_state(self, model: FedModel) -> ServerState:
        return {
            **super().init_server_state(model),
            "centroids": torch.zeros(self.info.num_classes, model.feature_dim),
            "centroid_mask": torch.zeros(self.info.num_classes, dtype=torch.bool),
        }

    def aggregate(self, server_state: ServerState, round: int, results: RoundResults) -> tuple[ServerState, dict[str, float]]:
        new_state, metrics = super().aggregate(server_state, round, results)
        new_state["centroids"], new_state["centroid_mask"] = aggregate_centroids(
            server_state["centroids"], server_state["centroid_mask"], results.sums["centroid_sums"], results.sums["centroid_counts"]
        )
        lambdas = [m["lambda"] for m in results.client_metrics.values() if "lambda" in m]
        if lambdas:
            metrics["lambda_mean"] = sum(lambdas) / len(lambdas)
        metrics["classes_with_centroid"] = float(new_state["centroid_mask"].sum())
        return new_state, metrics

    # ----------------------------------------------------------------- client side
    def load_client_model(self, ctx: ClientContext, broadcast: Broadcast) -> dict[str, float]:
        """θ̂ = [λ φ^i + (1 − λ) φ^G; π^i] (Eq. 7–9); [φ^G; π_0] at a client's first participation."""
        if ctx.state is None:
            self.split.load(ctx.model, broadcast["weights"], broadcast["initial_personal"])
            return {}
        local_shared, personal = ctx.state["shared"], ctx.state["personal"]
        self.split.load(ctx.model, local_shared, personal)  # the unmixed model, for the probe
        lam, diagnostics = self.aggregation_weight(ctx, broadcast)
        self.split.load(ctx.model, mix_shared(local_shared, broadcast["weights"], lam), personal)
        return {"lambda": lam, **diagnostics}

    def aggregation_weight(self, ctx: ClientContext, broadcast: Broadcast) -> tuple[float, dict[str, float]]:
        """λ^i for this round and diagnostics (the probed L_Reg when there was no recorded one)."""
        params = self.params
        assert ctx.state is not None
        if params.fixed_lambda is not None:
            return params.fixed_lambda, {}
        if "reg_loss" in ctx.state:
            return adaptive_lambda(float(ctx.state["reg_loss"]), params.gamma, params.invalid_loss), {}
        if params.first_round_lambda is not None:
            return params.first_round_lambda, {}
        model = ctx.model
        was_training = model.training
        model.eval()
        probe = probe_reg_loss(
            model.encode,
            ctx.x,
            ctx.y,
            self.info.normalize,
            broadcast["centroids"].to(ctx.device),
            broadcast["centroid_mask"].to(ctx.device),
            params.tau,
            self.config.eval.batch_size,
        )
        model.train(was_training)
        return adaptive_lambda(probe, params.gamma, params.invalid_loss), {"probe_reg_loss": probe}

    def client_update(self, ctx: ClientContext, broadcast: Broadcast) -> ClientUpdate:
        params = self.params
        model = ctx.model
        metrics = self.load_client_model(ctx, broadcast)
        centroids = broadcast["centroids"].to(ctx.device)
        mask = broadcast["centroid_mask"].to(ctx.device)
        contrastive = bool(mask.any())  # false in round 1: CE only (the paper's initialisation round)
        reg_losses: list[Tensor] = []  # per batch with a sample whose class has a centroid

        def loss_fn(x: Tensor, y: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
            features = model.encode(x)
            ce = F.cross_entropy(model.classify(features), y)
            if not contrastive:
                return ce, {"ce": ce.detach()}
            with torch.set_grad_enabled(params.contrast_weight > 0):  # α = 0: the loss is exactly CE
                per_sample = centroid_infonce(features, y, centroids, mask, params.tau)
                reg = mean_or_zero(per_sample, features)
            if per_sample.numel() > 0:
                reg_losses.append(reg.detach())
            loss = ce + params.contrast_weight * reg if params.contrast_weight > 0 else ce
            return loss, {"ce": ce.detach(), "contrastive": reg.detach()}

        metrics.update(local_train(ctx, loss_fn))
        metrics.update(self.post_train_metrics(ctx, broadcast))
        shared, personal = self.split.read(model)
        state = {"shared": shared, "personal": personal}
        if reg_losses:
            state["reg_loss"] = torch.stack(reg_losses).mean()

        model.eval()
        class_sums, class_counts = client_class_sums(
            model.encode, ctx.x, ctx.y, self.info.normalize, self.info.num_classes, self.config.eval.batch_size
        )
        model.train()
        sums = {
            **self.shared_sums(shared, ctx.num_samples),
            "centroid_sums": class_sums.double(),
            "centroid_counts": class_counts.double(),
        }
        return ClientUpdate(sums=sums, metrics=metrics, state=state)
