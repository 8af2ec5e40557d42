"""Hetero-SSFL (Makhija, Ho, Ghosh, arXiv 2205.12493): federated self-supervised learning of clients
with different architectures, aligned through kernels on a public set (docs/algorithms_hetero_ssfl.md).

No weights are exchanged and there is no global model. Every client keeps its own model (its own
architecture, ``algorithm.architectures``) and BYOL target in the client state store, and trains it
with local SSL (:mod:`fedray.algorithms.ssl`) plus an alignment term on the public, unlabelled
Representation Alignment Dataset (RAD) X of L images (paper Eq. 2 with its sign fixed: the printed
Eq. 2 minimises +μ·CKA, which pushes clients apart)::

    min_W  ℓ_SSL(W) + μ · (1 - CKA(Φ_k(X_I) Φ_k(X_I)ᵀ, K̄(t-1)[I, I]))          (Eq. 2)

on a RAD mini-batch I per local step (not the whole RAD per epoch as in Alg. 1: backpropagating
through all L images is infeasible), both b×b blocks centred with their own H_b. After local
training each client uploads only ``A_k = Φ_k(X)`` (L × d_k, eval mode, no augmentation); the
server keeps the last upload of every client and forms ``K̄ = Σ_j w_j A_j A_jᵀ`` (Alg. 1),
broadcast once per round. Evaluation is a linear probe on every client's frozen encoder (or on
``algorithm.probe_clients`` of them, a seeded sample fixed for the run, when probing all is too slow):
``probe_accuracy`` (mean over clients, also reported as ``test_accuracy``) and
``probe_accuracy_<architecture>`` (mean over that architecture's clients, Table 4).

Paper symbol → config key:

=========================  ===========================================================
μ (alignment weight)       ``algorithm.mu`` (0.5; 0 = local SSL only: no RAD, no upload)
τ (BYOL target decay)      ``algorithm.ema_decay`` (0.99)
L (RAD size)               ``algorithm.rad_size`` (5000; at most the size of the pool)
b_rad (RAD rows per step)  ``algorithm.rad_batch_size`` (200)
w_j (client weights)       ``algorithm.client_weights``: ``uniform`` (paper) | ``by_samples``
d_k (projection width)     ``algorithm.projection_dim`` or an architecture's ``projection_dim``
f_k (backbone)             ``algorithm.architectures`` (list of ``model`` sections; empty: ``model``)
M (clients per round)      ``train.clients_per_round``;  E: ``train.local_epochs``; η: ``train.lr``
=========================  ===========================================================

Variants (recommended default first): ``ssl`` byol | simsiam; ``byol_loss`` normalized | mse;
``alignment_distance`` one_minus_cka | neg_cka (same gradient) | cka_literal (the paper's literal
sign, pushes clients apart; ablation only); ``cka_estimator`` biased | debiased (against the
small-batch bias of CKA); ``consensus_form`` kernel (broadcast the L×L K̄) | factor (broadcast
Ā = [√w_j A_j]_j, L × Σd_j: smaller when Σd_j < L, and the server does no L²-sized product);
``arch_assignment`` round_robin (client k gets architecture k mod A) | blocks (contiguous blocks) |
random (seeded, at least one of each). The sign, the mini-batch estimate, this bias and every other
choice the paper leaves open are explained in docs/algorithms_hetero_ssfl.md, 'Ambiguities'.

The RAD (the paper does not say where its L = 5000 images come from): ``rad_size`` seeded random
images of the training split, labels dropped. By default they may overlap the clients' data; with
``data.public_fraction > 0`` they are drawn from the held-out public split instead, disjoint from
every client.

Deviations, each for a reason:

- **No K̄(0).** Alg. 1 aligns round 1 to the kernel of every client's random initial model. That
  needs all N models embedded before any training, a step fedray's round loop does not have, and the
  target carries no learned structure; so round 1 trains without the term
  (``align_start_round`` ≥ 2, default 2).
- **Clients that never trained** are left out of K̄ until their first upload (rather than entering with
  their initial model); the weights are renormalised over the clients in K̄. CKA is scale-invariant,
  so with every client uploaded this is exactly the paper's K̄.
- Not implemented: the RBF kernel, ``alignment_granularity="epoch"``, ``exclude_self``, an external
  ``rad_source``, per-client SSL methods (see docs/algorithms_hetero_ssfl.md).
"""

from __future__ import annotations

from typing import Iterator, Literal

import numpy as np
import torch
from pydantic import Field

from fedray.algorithms.base import Broadcast, ClientContext, ClientUpdate, RoundResults, ServerState, Tensor
from fedray.algorithms.cka import alignment_distance, cka, consensus, consensus_block, gram
from fedray.algorithms.ssl import (
    ONLINE_PREFIXES,
    TARGET_PREFIXES,
    ExtraLoss,
    SiameseAlgorithm,
    SSLParams,
    embed,
    represent,
)
from fedray.algorithms.uploads import Upload
from fedray.config import ModelConfig, RunConfig
from fedray.data import DatasetInfo, FederatedDataset
from fedray.models import FedModel, get_flat_weights, set_flat_weights
from fedray.seeding import derive_seed

# Random streams of their own, so that none of these draws shifts the clients' data order or augmentations.
_RAD_STREAM, _INIT_STREAM, _ARCH_STREAM, _RAD_ORDER_STREAM, _PROBE_STREAM = 0x4144, 0x494E, 0x4152, 0x4F52, 0x5042


class HeteroSSFLParams(SSLParams):
    mu: float = Field(0.5, ge=0, description="alignment weight μ (0: local SSL only)")
    architectures: list[ModelConfig] = Field(
        default_factory=list, description="per-client model sections (empty: the model section for every client)"
    )
    arch_assignment: Literal["round_robin", "blocks", "random"] = "round_robin"
    rad_size: int = Field(5000, gt=0, description="RAD size L (at most the pool it is drawn from)")
    rad_batch_size: int = Field(200, ge=4, description="RAD rows per local step b_rad")
    alignment_distance: Literal["one_minus_cka", "neg_cka", "cka_literal"] = "one_minus_cka"
    cka_estimator: Literal["biased", "debiased"] = "biased"
    client_weights: Literal["uniform", "by_samples"] = "uniform"
    align_start_round: int = Field(2, ge=2, description="first round with the alignment term (no K̄(0))")
    consensus_form: Literal["kernel", "factor"] = "kernel"
    probe_clients: int | None = Field(
        None,
        gt=0,
        description="clients linear-probed at each evaluation: a seeded sample fixed for the run, "
        "spread evenly over the architectures (None: every client, the paper's protocol)",
    )


def architecture_keys(architectures: list[ModelConfig]) -> list[str]:
    """Readable, unique model keys (also the suffix of ``probe_accuracy_<key>``): the model name,
    ``_w<width>`` for the CNNs, ``_p<projection_dim>`` if set, ``_<index>`` if still not unique."""
    labels = []
    for cfg in architectures:
        label = cfg.name if cfg.name.startswith("resnet") else f"{cfg.name}_w{cfg.width}"
        labels.append(label + (f"_p{cfg.projection_dim}" if cfg.projection_dim else ""))
    return [f"{label}_{i}" if labels.count(label) > 1 else label for i, label in enumerate(labels)]


def assign_architectures(num_clients: int, num_architectures: int, rule: str, seed: int) -> np.ndarray:
    """The architecture index of every client under ``rule`` (see the module docstring)."""
    clients = np.arange(num_clients)
    if rule == "round_robin":
        return clients % num_architectures
    if rule == "blocks":
        return clients * num_architectures // num_clients
    if rule == "random":
        rng = np.random.default_rng(derive_seed(seed, _ARCH_STREAM))
        each_once = np.arange(min(num_architectures, num_clients))
        rest = rng.integers(num_architectures, size=num_clients - len(each_once))
        return rng.permutation(np.concatenate([each_once, rest]))
    raise ValueError(f"algorithm.arch_assignment: unknown rule {rule!r} (allowed: round_robin, blocks, random)")


class HeteroSSFL(SiameseAlgorithm):
    name = "hetero_ssfl"
    uploads = frozenset({Upload("kernel matrices", payload=("representations", "num_samples"), compressed=("representations",))})
    keeps_client_state = True
    Params = HeteroSSFLParams
    params: HeteroSSFLParams

    def __init__(self, config: RunConfig, info: DatasetInfo) -> None:
        super().__init__(config, info)
        if config.eval.personalized:
            raise ValueError("hetero_ssfl: eval.personalized does not apply (every client is linear-probed on the test set)")
        architectures = self.params.architectures or [config.model]
        self.arch_keys = architecture_keys(architectures)
        self.arch_configs = dict(zip(self.arch_keys, architectures))
        self.client_arch = assign_architectures(config.data.num_clients, len(architectures), self.params.arch_assignment, config.seed)
        self._consensus_on_device: tuple[int, Tensor] | None = None  # (round, K̄ or Ā on this worker's device)

    # ----------------------------------------------------------------- models
    def model_key(self, client_id: int | None) -> str:
        return self.arch_keys[0 if client_id is None else int(self.client_arch[client_id])]

    def model_config(self, key: str) -> ModelConfig:
        return self.arch_configs[key]

    def public_indices(self, data: FederatedDataset) -> np.ndarray | None:
        """The RAD: ``rad_size`` seeded training-set indices from ``data.public`` when it exists, else
        from the whole training split; fixed for the run. None when μ = 0 (no alignment at all)."""
        if self.params.mu == 0:
            return None
        pool = data.public if data.public is not None else np.arange(len(data.train))
        rng = np.random.default_rng(derive_seed(self.config.seed, _RAD_STREAM))
        return np.sort(rng.choice(pool, size=min(self.params.rad_size, len(pool)), replace=False))

    def load_client(self, ctx: ClientContext, target: FedModel | None) -> None:
        """Put the client's own weights (and BYOL target) into the worker's models: its stored state,
        or on first participation its initial model, seeded by (seed, client id) only."""
        model = ctx.model
        if ctx.state is None:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(derive_seed(self.config.seed, _INIT_STREAM, ctx.client_id))
                model.load_state_dict(self.build_model(self.model_key(ctx.client_id)).state_dict())
            if target is not None:
                set_flat_weights(target, get_flat_weights(model, TARGET_PREFIXES), TARGET_PREFIXES)
            return
        set_flat_weights(model, ctx.state["online"], ONLINE_PREFIXES)
        if target is not None:
            set_flat_weights(target, ctx.state["target"], TARGET_PREFIXES)

    # ----------------------------------------------------------------- server side
    def init_server_state(self, model: FedModel) -> ServerState:
        """The last upload ``A_j`` and sample count of every client that has uploaded (keys are client
        ids as strings) and the consensus K̄ (or its factor) built from them."""
        return {"representations": {}, "num_samples": {}, "consensus": None}

    def broadcast(self, server_state: ServerState, round: int) -> Broadcast:
        return {"consensus": server_state["consensus"]}

    def aggregate(self, server_state: ServerState, round: int, results: RoundResults) -> tuple[ServerState, dict[str, float]]:
        """Cache this round's uploads (clients not selected did not train and keep their last one) and
        rebuild ``K̄ = Σ_j w_j A_j A_jᵀ / Σ_j w_j`` over every cached client."""
        representations = dict(server_state["representations"])
        num_samples = dict(server_state["num_samples"])
        for client_id, payload in results.payloads.items():
            representations[str(client_id)] = payload["representations"].float()
            num_samples[str(client_id)] = torch.tensor(float(payload["num_samples"]))
        if not representations:  # μ = 0: nothing is uploaded, nothing is aggregated
            return server_state, {}
        clients = sorted(representations, key=int)
        if self.params.client_weights == "by_samples":
            weights = torch.stack([num_samples[c] for c in clients])
        else:
            weights = torch.ones(len(clients))
        kernel = consensus([representations[c] for c in clients], weights / weights.sum(), self.params.consensus_form)
        ckas = [m["cka"] for m in results.client_metrics.values() if "cka" in m]
        metrics = {"clients_in_consensus": float(len(clients))}
        if ckas:
            metrics["mean_cka"] = float(np.mean(ckas))
        return {"representations": representations, "num_samples": num_samples, "consensus": kernel}, metrics

    # ----------------------------------------------------------------- client side
    def client_update(self, ctx: ClientContext, broadcast: Broadcast) -> ClientUpdate:
        target = self.target_model(self.model_key(ctx.client_id), ctx.device)
        self.load_client(ctx, target)
        metrics = self.train_local(ctx, target, self.alignment_term(ctx, broadcast))
        state = {"online": get_flat_weights(ctx.model, ONLINE_PREFIXES)}
        if target is not None:
            state["target"] = get_flat_weights(target, TARGET_PREFIXES)
        payload = {}
        if self.params.mu > 0:  # the only thing that leaves the client: Φ_k on the RAD, never weights
            assert ctx.x_public is not None
            model = ctx.model
            payload = {
                "representations": embed(model, lambda x: represent(model, x), ctx.x_public, self.info, self.config.eval.batch_size),
                "num_samples": float(ctx.num_samples),
            }
        return ClientUpdate(sums={}, payload=payload, metrics=metrics, state=state)

    def alignment_term(self, ctx: ClientContext, broadcast: Broadcast) -> ExtraLoss | None:
        """``μ · d(CKA(Z Zᵀ, K̄[I, I]))`` on the next RAD mini-batch I per call, with Z = Φ_k(X_I) from a
        separate train-mode forward pass of un-augmented images; None when there is no term."""
        if self.params.mu == 0 or broadcast["consensus"] is None or ctx.round < self.params.align_start_round:
            return None
        assert ctx.x_public is not None
        model, params = ctx.model, self.params
        kernel = self._consensus_for(ctx.round, broadcast["consensus"], ctx.device)
        batches = rad_batches(
            ctx.x_public.shape[0],
            params.rad_batch_size,
            derive_seed(self.config.seed, _RAD_ORDER_STREAM, ctx.round, ctx.client_id),
            ctx.device,
        )

        def term() -> tuple[Tensor, dict[str, Tensor]]:
            index = next(batches)
            z = represent(model, self.info.normalize(ctx.x_public[index]))
            similarity = cka(gram(z), consensus_block(kernel, index, params.consensus_form), params.cka_estimator)
            return params.mu * alignment_distance(similarity, params.alignment_distance), {"cka": similarity.detach()}

        return term

    def _consensus_for(self, round: int, matrix: Tensor, device: torch.device) -> Tensor:
        """The round's consensus on this worker's device, moved once per round, not once per client."""
        if self._consensus_on_device is None or self._consensus_on_device[0] != round:
            self._consensus_on_device = (round, matrix.to(device))
        return self._consensus_on_device[1]

    # ----------------------------------------------------------------- evaluation
    def evaluation_clients(self, num_clients: int) -> list[int]:
        """Every client, or ``probe_clients`` of them: a seeded permutation taken one client of each
        architecture at a time, so that every architecture's mean has clients while there are enough."""
        if self.params.probe_clients is None or self.params.probe_clients >= num_clients:
            return list(range(num_clients))
        order = np.random.default_rng(derive_seed(self.config.seed, _PROBE_STREAM)).permutation(num_clients)
        seen_per_architecture = np.zeros(len(self.arch_keys), dtype=int)
        rank_in_architecture = np.empty(num_clients, dtype=int)
        for client_id in order:
            architecture = self.client_arch[client_id]
            rank_in_architecture[client_id] = seen_per_architecture[architecture]
            seen_per_architecture[architecture] += 1
        balanced = sorted(order, key=lambda client_id: rank_in_architecture[client_id])  # stable: keeps the permutation's order
        return sorted(int(c) for c in balanced[: self.params.probe_clients])

    def evaluate_on_test_set(
        self, ctx: ClientContext, broadcast: Broadcast, train: tuple[Tensor, Tensor], test: tuple[Tensor, Tensor]
    ) -> dict[str, float]:
        self.load_client(ctx, target=None)
        result = self.probe(ctx, train, test)
        return {
            "probe_accuracy": result["accuracy"],
            f"probe_accuracy_{self.model_key(ctx.client_id)}": result["accuracy"],
            "test_accuracy": result["accuracy"],
            "test_loss": result["loss"],
        }


def rad_batches(rad_size: int, batch_size: int, seed: int, device: torch.device) -> Iterator[Tensor]:
    """Endless RAD index batches of ``min(batch_size, rad_size)`` rows, cycling through shuffled
    permutations of the RAD (full batches only)."""
    batch_size = min(batch_size, rad_size)
    generator = torch.Generator().manual_seed(seed)
    while True:
        order = torch.randperm(rad_size, generator=generator).to(device)
        for start in range(0, rad_size - batch_size + 1, batch_size):
            yield order[start : start + batch_size]
