"""FedSC: Federated Learning with Semantic-Aware Collaboration (Wang et al., KDD 2025).

Implemented from the paper as described in docs/algorithms_prototypes.md (FedSC). The official code
does not run the paper's method (docs/algorithms_prototypes.md, 'Ambiguities', FedSC: official
code); the parts of its behaviour worth comparing are reachable through the switches below.

**Client** (round r, :meth:`FedSC.client_update`), with z = f(x) the backbone feature
(``model.encode``) and the server's relational prototypes ℛ and consistent prototypes 𝒪 of round r−1::

    L = CE + lam_rpcl · RPCL + lam_cpdr · CPDR                          (Alg. 1 line 28)
    RPCL(i) = −log Σ_{r∈ℛ^{y_i}} e^{s(z_i,r)/τ} / Σ_{r∈ℛ} e^{s(z_i,r)/τ},  s = cos(z, r) / 𝒰(r)   (Eq. 13–14)
    CPDR    = dist(z_i, o^{y_i})                                         (Eq. 15)

then the client prototypes c_k^j = mean of f(x) over its class-j samples (Eq. 3–4), computed with
the final local model, and the label discrepancy d_k (Eq. 10, computed on the client: it equals the
server computing it from uploaded counts and leaks less). In round 1 (no prototypes) the loss is
CE only, as in the official code.

**Server** (:meth:`FedSC.aggregate`, in the server actor, this round's participants only):

- weights: FedAvg, ``Σ n_k w_k / Σ n_k`` (Alg. 1 line 9), pre-aggregated in the workers (``sums``);
- relational prototypes (Eq. 5, 7–9, :func:`relational_prototypes`): per class j, the plain mean
  g^j over S_j (the participants with class j), φ_k = cos(g^j, c_k^j), each client's M nearest
  clients by |φ_k1 − φ_k| (ties by client id) merged with its own prototype;
- discrepancy weights e_k = σ(n_k/N − d_k/Σd) / Σ (Eq. 11, :func:`discrepancy_weights`);
- consistent prototypes o^j = Σ_{S_j} e_k r_k^j / Σ_{S_j} e_k (Eq. 12, renormalised over S_j).

The client prototypes travel per client as ``payload`` ([C, d] plus presence flags, n_k, d_k):
the neighbour search needs them one by one. Model weights go through the workers' sums.

**Paper symbols → config keys:** τ → ``algorithm.tau`` (0.05), M → ``algorithm.num_neighbors`` (2),
α (Dirichlet) → ``data.alpha``; the implicit loss weights → ``algorithm.lam_rpcl`` /
``algorithm.lam_cpdr`` (1, 1). Eq. 11's a, b are fixed normalisers, not β/α. FedSC uses no β, μ.

**Variants** (default first; paper / code / reasons per switch in docs/algorithms_prototypes.md,
'Ambiguities', FedSC):

- ``cpdr_metric``: ``mse`` (1/(B·d)) Σ‖z − o‖² (the authors' intent) | ``l2`` | ``l1``;
- ``rpcl_variant``: ``multi_positive`` (paper) | ``single_mean_positive`` (the code's form: one
  positive, the mean of the class's prototypes, plain cosine; ``u_mode`` does not apply);
- ``u_mode`` (𝒰 of Eq. 13): ``batch`` (per batch, detached) | ``dataset`` (the client's whole split
  in eval mode, once per local epoch) | ``none`` (𝒰 = 1);
- ``proto_source``: ``eval_pass`` (a separate eval-mode, no-augmentation pass after training) |
  ``last_epoch`` (training-mode, augmented features of the last local epoch, as the code).

With ``lam_rpcl = lam_cpdr = 0`` the run is exactly FedAvg (a test checks this).
"""

from __future__ import annotations

import math
from typing import Callable, Literal

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
from fedray.algorithms.local import local_train
from fedray.algorithms.losses import (
    COSINE_EPS,
    distance_scale,
    prototype_contrastive_loss,
    prototype_distance,
    single_mean_positive_contrastive_loss,
)
from fedray.algorithms.prototypes import class_means, class_sums, client_class_sums
from fedray.algorithms.uploads import MODEL_WEIGHTS, Upload
from fedray.algorithms.requirements import CLASS_LABELS
from fedray.models import FedModel, get_flat_weights, set_flat_weights

ProtoSource = Literal["eval_pass", "last_epoch"]
DistanceScaleMode = Literal["batch", "dataset", "none"]


class FedSCParams(AlgorithmParams):
    tau: float = Field(0.05, gt=0, description="RPCL temperature τ (Eq. 14)")
    num_neighbors: int = Field(2, ge=0, description="M: neighbour clients merged into a relational prototype (Eq. 8–9)")
    lam_rpcl: float = Field(1.0, ge=0, description="weight of RPCL (paper: 1)")
    lam_cpdr: float = Field(1.0, ge=0, description="weight of CPDR (paper: 1)")
    cpdr_metric: Literal["mse", "l2", "l1"] = Field("mse", description="Eq. 15 distance")
    rpcl_variant: Literal["multi_positive", "single_mean_positive"] = Field("multi_positive", description="RPCL form")
    u_mode: DistanceScaleMode = Field("batch", description="𝒰 of Eq. 13")
    proto_source: ProtoSource = Field("eval_pass", description="source of client prototypes")


# ----------------------------------------------------------------------------- server maths


def merge_with_neighbours(prototypes: Tensor, gaps: Tensor, num_neighbors: int) -> tuple[Tensor, Tensor]:
    """Each row of ``prototypes`` ``[S, d]`` (rows in ascending client id) averaged with its
    m = min(M, S−1) nearest other rows by ``gaps`` ``[S, S]`` (ties broken by row order, i.e. by
    client id): ``r_a = (c_a + Σ_{b∈𝒩(a)} c_b) / (m + 1)``. Returns the merged rows and the 0/1
    adjacency 𝒜 (𝒜[a, b] = 1 iff b ∈ 𝒩(a) or b = a). FedSC Eq. 8–9 and FedSKC Eq. 1."""
    count = prototypes.shape[0]
    m = min(num_neighbors, count - 1)
    gaps = gaps.clone()
    gaps.fill_diagonal_(float("inf"))
    neighbours = torch.argsort(gaps, dim=1, stable=True)[:, :m]
    adjacency = torch.eye(count, dtype=prototypes.dtype, device=prototypes.device)
    adjacency.scatter_(1, neighbours, 1.0)
    return adjacency @ prototypes / (m + 1), adjacency


def angles_to_global(prototypes: Tensor) -> Tensor:
    """φ_k = cos(g, c_k) with g the unweighted mean of the rows ``[S, d]`` (Eq. 5, 7)."""
    global_prototype = prototypes.mean(dim=0)
    return prototypes @ global_prototype / (prototypes.norm(dim=1) * global_prototype.norm() + COSINE_EPS)


def relational_prototypes(prototypes: Tensor, num_neighbors: int) -> Tensor:
    """One class's relational prototypes r_k (Eq. 5, 7–9) from the client prototypes c_k ``[S, d]``
    of the clients that have the class, in ascending client id: neighbours are the clients whose
    angle to the plain global prototype is closest (the paper's "angle-wise" rule, not the official
    code's pairwise L2)."""
    phi = angles_to_global(prototypes)
    return merge_with_neighbours(prototypes, (phi.unsqueeze(1) - phi.unsqueeze(0)).abs(), num_neighbors)[0]


def label_discrepancy(class_counts: Tensor) -> Tensor:
    """d_k = sqrt(½ Σ_j (n_k^j / n_k − 1/C)²) (Eq. 10): 0 for a uniform label histogram,
    sqrt((1 − 1/C)/2) for a single-class client."""
    counts = class_counts.double()
    return torch.sqrt(0.5 * ((counts / counts.sum() - 1.0 / counts.numel()) ** 2).sum())


def discrepancy_weights(num_samples: Tensor, discrepancies: Tensor) -> Tensor:
    """e_k = σ(a·n_k − b·d_k) / Σ_i σ(a·n_i − b·d_i), a = 1/Σn, b = 1/Σd (Eq. 11), in float64;
    b = 0 when every d is 0 (IID clients)."""
    n, d = num_samples.double(), discrepancies.double()
    b = 1.0 / d.sum() if d.sum() > 0 else 0.0
    scores = torch.sigmoid(n / n.sum() - b * d)
    return scores / scores.sum()


def consistent_prototype(relational: Tensor, weights: Tensor) -> Tensor:
    """o^j = Σ e_k r_k^j / Σ e_k over the clients that have class j (Eq. 12, renormalised over them:
    the paper assumes every client has every class)."""
    weights = weights.to(relational.dtype)
    return (weights.unsqueeze(1) * relational).sum(dim=0) / weights.sum()


# ----------------------------------------------------------------------------- client helpers


class LocalEpochClock:
    """Tells a loss function which local epoch its step belongs to (``local_train`` iterates
    ``ctx.batches``: ⌈n / B⌉ steps per epoch)."""

    def __init__(self, ctx: ClientContext) -> None:
        self.steps_per_epoch = math.ceil(ctx.num_samples / ctx.train.batch_size)
        self.step = 0

    def tick(self) -> tuple[int, bool]:
        """(epoch index of this step, whether it is the epoch's first step)."""
        epoch, first = divmod(self.step, self.steps_per_epoch)
        self.step += 1
        return epoch, first == 0


@torch.no_grad()
def embed_client_data(model: FedModel, embed: Callable[[Tensor], Tensor], ctx: ClientContext, batch_size: int = 512) -> Tensor:
    """``embed`` of the client's whole training split in eval mode, no augmentation, no gradient."""
    was_training = model.training
    model.eval()
    parts = [embed(ctx.info.normalize(ctx.x[s : s + batch_size])) for s in range(0, ctx.num_samples, batch_size)]
    model.train(was_training)
    return torch.cat(parts)


def eval_pass_class_sums(model: FedModel, embed: Callable[[Tensor], Tensor], ctx: ClientContext) -> tuple[Tensor, Tensor]:
    """Per-class sums and counts of ``embed`` over the client's split with the final local model in
    eval mode, without augmentation: fedray's default prototype source for FedSC and FedSKC
    (docs/algorithms_prototypes.md, 'Ambiguities': proto_source)."""
    was_training = model.training
    model.eval()
    sums, counts = client_class_sums(embed, ctx.x, ctx.y, ctx.info.normalize, ctx.info.num_classes)
    model.train(was_training)
    return sums, counts


class LastEpochClassSums:
    """Accumulates per-class sums of training-mode outputs during the last local epoch
    (``proto_source="last_epoch"``, the official code's prototype source)."""

    def __init__(self, num_classes: int) -> None:
        self.num_classes = num_classes
        self.sums: Tensor | None = None
        self.counts: Tensor | None = None

    def add(self, outputs: Tensor, labels: Tensor) -> None:
        sums, counts = class_sums(outputs.detach(), labels, self.num_classes)
        self.sums = sums if self.sums is None else self.sums + sums
        self.counts = counts if self.counts is None else self.counts + counts

    def result(self) -> tuple[Tensor, Tensor]:
        assert self.sums is not None and self.counts is not None, "the last epoch has at least one step"
        return self.sums, self.counts


# ----------------------------------------------------------------------------- algorithm


class FedSC(Algorithm):
    name = "fedsc"
    requires = frozenset({CLASS_LABELS})
    uploads = frozenset(
        {
            MODEL_WEIGHTS,
            Upload(
                "prototypes",
                payload=("prototypes", "class_present", "num_samples", "discrepancy"),
                clipped=(("prototypes", "clip_prototypes"),),
                constant=("class_present", "num_samples", "discrepancy"),  # every class, uniform e_k (Eq. 11)
                compressed=("prototypes",),
            ),
        }
    )
    Params = FedSCParams
    params: FedSCParams

    def init_server_state(self, model: FedModel) -> ServerState:
        dim, num_classes = model.feature_dim, self.info.num_classes
        return {
            "weights": get_flat_weights(model),
            "relational_prototypes": torch.zeros(0, dim),  # ℛ: [P, d], rows grouped by class
            "relational_classes": torch.zeros(0, dtype=torch.long),  # [P]: the class of each row
            "relational_clients": torch.zeros(0, dtype=torch.long),  # [P]: the client of each row
            "consistent_prototypes": torch.zeros(num_classes, dim),  # 𝒪: [C, d]
            "consistent_present": torch.zeros(num_classes, dtype=torch.bool),  # [C]
        }

    def broadcast(self, server_state: ServerState, round: int) -> Broadcast:
        return {key: value for key, value in server_state.items() if key != "relational_clients"}

    def aggregate(self, server_state: ServerState, round: int, results: RoundResults) -> tuple[ServerState, dict[str, float]]:
        payloads = list(results.payloads.values())  # ascending client id
        clients = torch.tensor(list(results.payloads), dtype=torch.long)
        prototypes = torch.stack([p["prototypes"] for p in payloads]).double()  # [K, C, d]
        present = torch.stack([p["class_present"] for p in payloads])  # [K, C]
        num_samples = torch.stack([p["num_samples"] for p in payloads]).double()
        discrepancies = torch.stack([p["discrepancy"] for p in payloads]).double()
        weights = discrepancy_weights(num_samples, discrepancies)

        num_classes, dim = prototypes.shape[1], prototypes.shape[2]
        relational, relational_classes, relational_clients = [], [], []
        consistent = torch.zeros(num_classes, dim, dtype=torch.float64)
        for j in range(num_classes):
            holders = torch.nonzero(present[:, j]).flatten()
            if holders.numel() == 0:
                continue
            merged = relational_prototypes(prototypes[holders, j], self.params.num_neighbors)
            consistent[j] = consistent_prototype(merged, weights[holders])
            relational.append(merged)
            relational_classes.append(torch.full((holders.numel(),), j, dtype=torch.long))
            relational_clients.append(clients[holders])
        state = {
            "weights": weighted_mean(results.sums),
            "relational_prototypes": torch.cat(relational).float(),
            "relational_classes": torch.cat(relational_classes),
            "relational_clients": torch.cat(relational_clients),
            "consistent_prototypes": consistent.float(),
            "consistent_present": present.any(dim=0),
        }
        metrics = {
            "relational_prototypes": float(state["relational_prototypes"].shape[0]),
            "discrepancy_mean": float(discrepancies.mean()),
            "aggregation_weight_min": float(weights.min()),
            "aggregation_weight_max": float(weights.max()),
        }
        return state, metrics

    def client_update(self, ctx: ClientContext, broadcast: Broadcast) -> ClientUpdate:
        params, model = self.params, ctx.model
        set_flat_weights(model, broadcast["weights"])
        relational = broadcast["relational_prototypes"].to(ctx.device)
        relational_classes = broadcast["relational_classes"].to(ctx.device)
        consistent = broadcast["consistent_prototypes"].to(ctx.device)
        consistent_present = broadcast["consistent_present"].to(ctx.device)
        use_rpcl = params.lam_rpcl > 0 and relational.shape[0] > 0
        use_cpdr = params.lam_cpdr > 0 and bool(consistent_present.any())
        clock = LocalEpochClock(ctx)
        last_epoch = LastEpochClassSums(ctx.info.num_classes) if params.proto_source == "last_epoch" else None
        dataset_scale: Tensor | None = None

        def loss_fn(x: Tensor, y: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
            nonlocal dataset_scale
            epoch, first_step = clock.tick()
            if use_rpcl and params.u_mode == "dataset" and first_step:
                dataset_scale = distance_scale(embed_client_data(model, model.encode, ctx), relational)
            features = model.encode(x)
            ce = F.cross_entropy(model.classify(features), y)
            loss, terms = ce, {"ce": ce.detach()}
            if use_rpcl:
                if params.rpcl_variant == "single_mean_positive":
                    rpcl = single_mean_positive_contrastive_loss(features, y, relational, relational_classes, params.tau)
                else:
                    scale = distance_scale(features, relational) if params.u_mode == "batch" else dataset_scale
                    rpcl = prototype_contrastive_loss(features, y, relational, relational_classes, params.tau, scale)
                loss = loss + params.lam_rpcl * rpcl
                terms["rpcl"] = rpcl.detach()
            if use_cpdr:
                keep = consistent_present[y]
                cpdr = prototype_distance(features[keep], consistent[y[keep]], params.cpdr_metric)
                loss = loss + params.lam_cpdr * cpdr
                terms["cpdr"] = cpdr.detach()
            if last_epoch is not None and epoch == ctx.train.local_epochs - 1:
                last_epoch.add(features, y)
            return loss, terms

        metrics = local_train(ctx, loss_fn)
        sums, counts = last_epoch.result() if last_epoch is not None else eval_pass_class_sums(model, model.encode, ctx)
        payload = {
            "prototypes": class_means(sums, counts).float(),  # c_k^j; zero rows where class_present is False
            "class_present": counts > 0,
            "num_samples": torch.tensor(float(ctx.num_samples)),
            "discrepancy": label_discrepancy(torch.bincount(ctx.y, minlength=ctx.info.num_classes)).float(),
        }
        return ClientUpdate(sums=weighted_weights_sums(model, ctx.num_samples), payload=payload, metrics=metrics)
