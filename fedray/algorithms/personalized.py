"""Personalised-FL machinery shared by FedPer, FedCoSR and Local: split models, personal parts kept
in client state, personalised evaluation.

**Split.** A model's flat weights (the layout of :mod:`fedray.models.weights`) are split by
state-dict key prefixes into a *shared* part φ, which the server aggregates, and a *personal* part
π, which never leaves its client. ``algorithm.personal_prefixes`` picks π (default
``["classifier."]``: the last linear layer, FedPer's and FedCoSR's head); models name their parts
``encoder.`` / ``projector.`` / ``classifier.``, so no model is edited. ``[]`` shares everything.

**State.** A client's π (and whatever a subclass adds: FedCoSR's own φ and last contrastive loss)
is returned as :attr:`ClientUpdate.state`, so the runtime's client state store keeps it across
rounds, resumes and worker failures. A client that has never trained starts from the initial
model θ_0's head π_0, which the server keeps from initialisation (it never holds a client's π).

**Evaluation.** :meth:`PersonalizedAlgorithm.evaluate_client` evaluates each client's personalised
model as it stands at the start of the next round (:meth:`~PersonalizedAlgorithm.load_client_model`:
the current global φ plus the client's own π, for FedCoSR after its local aggregation), on its own
held-out split. This is PFLlib's protocol, which the FedCoSR paper's tables follow: the server
evaluates after round t with round t+1's broadcast. With ``eval.personalized`` each client also
reports its task headline metric right after local training (``post_train_accuracy`` for classification), weighted over the round's
cohort into the round metric ``post_train_personal_accuracy`` (``post_train_personal_<headline>``).

**Global model.** There is no global head, so ``test_accuracy`` (global test set) is that of φ^G
with the untrained π_0: not meaningful for these methods; read ``personal_accuracy``. Every
personalised algorithm therefore requires ``data.client_test_fraction > 0`` and
``eval.personalized: true`` (``requires``, checked before Ray starts).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
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
    evaluation_sums,
    weighted_mean,
    weighted_sums,
)
from fedray.algorithms.local import local_train
from fedray.algorithms.requirements import PERSONAL_TEST_SPLITS
from fedray.algorithms.uploads import MODEL_WEIGHTS
from fedray.config import RunConfig
from fedray.data import DatasetInfo
from fedray.models import FedModel, get_flat_weights, set_flat_weights, state_keys

MODEL_PARTS = ("encoder.", "projector.", "classifier.")


class PersonalizedParams(AlgorithmParams):
    personal_prefixes: list[str] = Field(
        default_factory=lambda: ["classifier."],
        description="state-dict key prefixes of the personal part π (never uploaded); [] shares everything",
    )

    @field_validator("personal_prefixes")
    @classmethod
    def _prefixes_name_model_parts(cls, prefixes: list[str]) -> list[str]:
        for prefix in prefixes:
            if not prefix.startswith(MODEL_PARTS) and prefix + "." not in MODEL_PARTS:
                raise ValueError(f"each prefix must start with a model part {MODEL_PARTS}, got {prefix!r}")
        return prefixes


@dataclass(frozen=True)
class ParameterSplit:
    """Which elements of a model's flat weight vector are shared (φ) and which are personal (π)."""

    shared_index: Tensor  # int64 positions of φ in the flat vector, ascending (CPU)
    personal_index: Tensor  # int64 positions of π (CPU)
    personal_keys: tuple[str, ...]
    _on_device: dict[torch.device, tuple[Tensor, Tensor]] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_model(cls, model: torch.nn.Module, personal_prefixes: tuple[str, ...]) -> "ParameterSplit":
        """The split of ``model``'s flat layout (:func:`fedray.models.state_keys`: floating-point state-dict
        entries in order, less frozen parameters and tied duplicates) whose π is every entry starting
        with one of ``personal_prefixes``."""
        floating = state_keys(model)
        personal_keys = [key for key in floating if key.startswith(personal_prefixes)]  # none when there are no prefixes
        unmatched = [p for p in personal_prefixes if not any(k.startswith(p) for k in personal_keys)]
        if unmatched:
            raise ValueError(
                f"algorithm.personal_prefixes: {unmatched} match no state-dict key of {type(model).__name__} "
                f"(its keys start with {sorted({k.split('.')[0] + '.' for k in model.state_dict()})})"
            )
        return cls.from_keys(model, personal_keys)

    @classmethod
    def from_keys(cls, model: torch.nn.Module, personal_keys: list[str]) -> "ParameterSplit":
        """The split whose π is exactly the floating-point state-dict entries ``personal_keys``
        (FedBN's BatchNorm entries, which no prefix selects)."""
        wanted = set(personal_keys)
        state = model.state_dict()
        floating = [(key, state[key]) for key in state_keys(model)]
        unknown = wanted - {key for key, _ in floating}
        if unknown:
            raise ValueError(f"{sorted(unknown)} are not in the flat layout of {type(model).__name__} (floating-point, not frozen)")
        mask = torch.cat([torch.full((value.numel(),), key in wanted) for key, value in floating])
        return cls(
            shared_index=torch.nonzero(~mask).flatten(),
            personal_index=torch.nonzero(mask).flatten(),
            personal_keys=tuple(key for key, _ in floating if key in wanted),
        )

    @property
    def num_shared(self) -> int:
        return int(self.shared_index.numel())

    @property
    def num_personal(self) -> int:
        return int(self.personal_index.numel())

    def _indices(self, device: torch.device) -> tuple[Tensor, Tensor]:
        """``(shared_index, personal_index)`` on ``device``, copied there once."""
        if device not in self._on_device:
            self._on_device[device] = (self.shared_index.to(device), self.personal_index.to(device))
        return self._on_device[device]

    def shared(self, flat: Tensor) -> Tensor:
        return flat[self._indices(flat.device)[0]]

    def personal(self, flat: Tensor) -> Tensor:
        return flat[self._indices(flat.device)[1]]

    def join(self, shared: Tensor, personal: Tensor) -> Tensor:
        """The flat vector with φ = ``shared`` and π = ``personal``."""
        shared_index, personal_index = self._indices(shared.device)
        flat = torch.empty(self.num_shared + self.num_personal, dtype=shared.dtype, device=shared.device)
        flat[shared_index] = shared
        flat[personal_index] = personal.to(flat.device, shared.dtype)
        return flat

    def load(self, model: FedModel, shared: Tensor, personal: Tensor) -> None:
        """Set ``model``'s weights to φ = ``shared``, π = ``personal``."""
        set_flat_weights(model, self.join(shared, personal))

    def read(self, model: FedModel) -> tuple[Tensor, Tensor]:
        """``(φ, π)`` of ``model`` (detached float32 copies)."""
        flat = get_flat_weights(model)
        return self.shared(flat), self.personal(flat)


class PersonalizedAlgorithm(Algorithm):
    """Shared φ aggregated by the sample-weighted mean (FedAvg), personal π kept per client.

    As it stands this is FedPer; subclasses change :meth:`load_client_model` (how a client's model
    is formed at the start of a round) and :meth:`client_update` (the local objective and upload).
    """

    Params = PersonalizedParams
    keeps_client_state = True
    requires = frozenset({PERSONAL_TEST_SPLITS})
    #: n_k·φ_k and n_k, φ_k comparable with the broadcast φ (``broadcast["weights"]``): the weights'
    #: sums of a weighted-mean algorithm, so privacy, robust rules, compression and async apply to φ
    uploads = frozenset({MODEL_WEIGHTS})

    def __init__(self, config: RunConfig, info: DatasetInfo) -> None:
        super().__init__(config, info)
        with torch.device("meta"):  # shapes only: no memory, no draw from the global RNG
            shapes = self.build_model(self.model_key(None))
        self.split = self.make_split(shapes)

    def make_split(self, model: FedModel) -> ParameterSplit:
        """φ/π of ``model`` (a shapes-only copy): by ``personal_prefixes`` unless a subclass selects
        π otherwise (FedBN: by module type)."""
        return ParameterSplit.from_model(model, self.personal_prefixes())

    def personal_prefixes(self) -> tuple[str, ...]:
        return tuple(self.params.personal_prefixes)

    # ----------------------------------------------------------------- server side
    def init_server_state(self, model: FedModel) -> ServerState:
        """φ^G = φ_0, plus θ_0's head π_0 for clients that have not trained yet."""
        shared, personal = self.split.read(model)
        return {"weights": shared, "initial_personal": personal}

    def broadcast(self, server_state: ServerState, round: int) -> Broadcast:
        return dict(server_state)

    def aggregate(self, server_state: ServerState, round: int, results: RoundResults) -> tuple[ServerState, dict[str, float]]:
        """φ^G = Σ n_k φ_k / Σ n_k (nothing to aggregate when φ is empty, as for Local)."""
        new_state = dict(server_state)
        if "weights" in results.sums:
            new_state["weights"] = weighted_mean(results.sums)
        return new_state, post_train_metric(results, self.task.headline)

    # ----------------------------------------------------------------- client side
    def load_client_model(self, ctx: ClientContext, broadcast: Broadcast) -> dict[str, float]:
        """Put the client's model for this round into ``ctx.model``: the global φ and the client's
        own π (π_0 if it has none yet). Returns per-client diagnostics for the metrics."""
        personal = broadcast["initial_personal"] if ctx.state is None else ctx.state["personal"]
        self.split.load(ctx.model, broadcast["weights"], personal)
        return {}

    def client_update(self, ctx: ClientContext, broadcast: Broadcast) -> ClientUpdate:
        metrics = self.load_client_model(ctx, broadcast)
        metrics.update(local_train(ctx, lambda x, y: (self.task.loss(ctx.model(x), y), {})))
        metrics.update(self.post_train_metrics(ctx, broadcast))
        shared, personal = self.split.read(ctx.model)
        return ClientUpdate(sums=self.shared_sums(shared, ctx.num_samples), metrics=metrics, state={"personal": personal})

    def shared_sums(self, shared: Tensor, num_samples: int) -> dict[str, Tensor]:
        """What leaves the client for Eq. (FedAvg) aggregation: ``n_k · φ_k`` and ``n_k``; nothing
        when φ is empty."""
        if self.split.num_shared == 0:
            return {}
        return weighted_sums(shared, num_samples)

    def post_train_metrics(self, ctx: ClientContext, broadcast: Broadcast) -> dict[str, float]:
        """Accuracy of the freshly trained model on the client's held-out split (``eval.personalized``)."""
        if not self.config.eval.personalized or ctx.x_test is None or ctx.y_test is None or ctx.y_test.numel() == 0:
            return {}
        sums = evaluation_sums(self, ctx.model, broadcast, ctx.x_test, ctx.y_test, self.config.eval.batch_size)
        return {f"post_train_{self.task.headline}": self.task.metrics(sums)[self.task.headline], "test_samples": sums["count"]}

    # ----------------------------------------------------------------- evaluation
    def load_global_model(self, model: FedModel, broadcast: Broadcast) -> FedModel:
        """φ^G with the initial head π_0 (there is no global head; see the module docstring)."""
        self.split.load(model, broadcast["weights"], broadcast["initial_personal"])
        return model

    def evaluate_client(self, ctx: ClientContext, broadcast: Broadcast) -> dict[str, float]:
        """The client's personalised model (:meth:`load_client_model`) on its held-out split."""
        assert ctx.x_test is not None and ctx.y_test is not None
        self.load_client_model(ctx, broadcast)
        return evaluation_sums(self, ctx.model, broadcast, ctx.x_test, ctx.y_test, self.config.eval.batch_size)


def post_train_metric(results: RoundResults, headline: str) -> dict[str, float]:
    """``post_train_personal_<headline>``: the round's clients' headline metric right after local
    training, weighted by their held-out samples (for accuracy: Σ correct / Σ count)."""
    key = f"post_train_{headline}"
    reported = [m for m in results.client_metrics.values() if key in m]
    if not reported:
        return {}
    weighted = sum(m[key] * m["test_samples"] for m in reported)
    return {f"post_train_personal_{headline}": weighted / sum(m["test_samples"] for m in reported)}
