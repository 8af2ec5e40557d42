"""The interface between the runtime and a federated algorithm.

An algorithm is one subclass of :class:`Algorithm`, in one file of this package or in the user's own
module (docs/writing_an_algorithm.md); the runtime finds it by ``algorithm.name``. It answers four questions, Flower-Strategy style:

1. **What does the server send?** :meth:`Algorithm.init_server_state` and :meth:`Algorithm.broadcast`
   (the broadcast is ``ray.put`` once per round and shared by every worker).
2. **What does a client compute?** :meth:`Algorithm.client_update` runs inside a worker actor and
   returns a :class:`ClientUpdate`:

   - ``sums``: tensors the worker adds up over all its clients in float64 before anything leaves the
     worker (e.g. ``n_k · w_k`` and ``n_k`` for FedAvg, per-class prototype sums and counts). A round
     therefore moves O(workers) model-sized results, not O(clients) (docs/architecture.md, principle 3);
   - ``payload``: small per-client values the server rule needs one by one (FedSC's prototypes);
   - ``metrics``: per-client scalars (losses) for ``metrics.parquet``;
   - ``state``: the client's new persistent state (MOON's previous model, personal heads), kept by
     the runtime's client state store; ``None`` leaves the stored state as it was.

3. **How does the server aggregate?** :meth:`Algorithm.aggregate` receives the round's
   :class:`RoundResults` (the float64 sums over the round's finite updates, payloads by client id)
   and returns the new server state plus scalar diagnostics.
4. **How is it evaluated?** :meth:`Algorithm.evaluate_global` (the global model on a shard of the test
   set) and :meth:`Algorithm.evaluate_client` (a client's personalised model on its held-out split),
   both as the task's additive sums (:meth:`fedray.tasks.Task.evaluation_sums`).
   An algorithm without a global model (Hetero-SSFL) names the clients to evaluate instead
   (:meth:`Algorithm.evaluation_clients`); the server then runs :meth:`Algorithm.evaluate_on_test_set`
   for each of them and reports the mean of every metric over the clients that return it.

**The task.** ``self.task`` (:mod:`fedray.tasks`, ``data.task``) owns the base loss every local
objective starts from (``self.task.loss(model(x), y)``, cross-entropy for classification) and the
evaluation sums; an algorithm adds its own terms on top and never branches on the task. An algorithm
whose maths needs class labels or one output per sample says so in ``requires``
(:data:`~fedray.algorithms.requirements.CLASS_LABELS`, :data:`~fedray.algorithms.requirements.PER_SAMPLE_OUTPUTS`).

Hyperparameters are a pydantic model ``Params`` whose fields are the ``algorithm.*`` config keys.
What the algorithm needs from the model and the config (BatchNorm layers, a projection head, feature
taps, per-client test splits) is its ``requires`` (:mod:`fedray.algorithms.requirements`), checked
before Ray starts.
Every random choice inside ``client_update`` must come from ``ctx.generator`` or torch's global RNG,
which the runtime seeds from ``(seed, round, client_id)`` before each client (docs/architecture.md, principle 7).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, ClassVar, Iterator

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict

from fedray.algorithms.declarations import Requirement, Upload
from fedray.config import RunConfig, TrainConfig
from fedray.data import DatasetInfo, FederatedDataset
from fedray.models import FedModel, build_model, get_flat_weights, set_flat_weights
from fedray.models.weights import parameter_mask
from fedray.tasks import Task, build_task

Tensor = torch.Tensor
ServerState = dict[str, Any]
Broadcast = dict[str, Any]


class AlgorithmParams(BaseModel):
    """Base of every algorithm's ``Params``: unknown ``algorithm.*`` keys are errors, and floats must
    be finite unless a field allows ±inf (``Field(allow_inf_nan=True, ge=...)``, e.g. FedU's
    ``dapu_threshold: .inf``); such values survive the JSON-mode dump the config loader stores."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False, ser_json_inf_nan="constants")


@dataclass
class ClientContext:
    """Everything a client's local step can use, prepared by the worker for one client."""

    client_id: int
    round: int
    model: FedModel  # the worker's model for this client's architecture; weights are the algorithm's to load
    x: Tensor  # on `device`, as stored (uint8 images [n, C, H, W], int64 tokens [n, T] or float32 features [n, D]): the client's training split
    y: Tensor  # [n, ...] targets in the task's stored form (int64 [n] class labels for classification; fedray.tasks)
    info: DatasetInfo
    train: TrainConfig
    lr: float  # train.lr after the per-round decay
    device: torch.device
    generator: torch.Generator  # seeded from (seed, round, client_id)
    augment: Callable[[Tensor, torch.Generator], Tensor]
    state: dict[str, Tensor] | None = None  # the client's stored state from its last participation
    x_test: Tensor | None = None  # the client's held-out split (personalised evaluation)
    y_test: Tensor | None = None
    x_public: Tensor | None = None  # uint8 public images named by Algorithm.public_indices, on `device`
    mean_client_samples: float | None = None  # mean training-split size over all clients (FedDyn's α_k)

    @property
    def num_samples(self) -> int:
        return int(self.y.shape[0])

    def batches(self, epochs: int | None = None, batch_size: int | None = None) -> Iterator[tuple[Tensor, Tensor]]:
        """Shuffled mini-batches ``(x [b, ...] normalised (DatasetInfo.normalize) and augmented, y [b])`` for
        ``epochs`` passes (default ``train.local_epochs``) over the client's data."""
        epochs = self.train.local_epochs if epochs is None else epochs
        batch_size = self.train.batch_size if batch_size is None else batch_size
        for _ in range(epochs):
            order = torch.randperm(self.num_samples, generator=self.generator).to(self.device)
            for start in range(0, self.num_samples, batch_size):
                index = order[start : start + batch_size]
                yield self.augment(self.info.normalize(self.x[index]), self.generator), self.y[index]


@dataclass
class ClientUpdate:
    """What one client returns; see the module docstring for each field."""

    sums: dict[str, Tensor]
    payload: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    state: dict[str, Tensor] | None = None


@dataclass
class RoundResults:
    """A round's client results as the server sees them, after worker-side reduction."""

    sums: dict[str, Tensor]  # float64, summed over the clients whose update was finite
    payloads: dict[int, dict[str, Any]]  # client id → payload, ascending ids
    client_metrics: dict[int, dict[str, float]]
    num_clients: int  # clients whose update was aggregated
    excluded_clients: list[int]  # clients whose update was not finite

    @classmethod
    def merged(cls, parts: list[Any], sums: dict[str, Tensor]) -> "RoundResults":
        """``sums`` with the payloads, client metrics, client counts and excluded clients of ``parts``
        (workers' partials or groups' results: anything with those four fields), ids in ascending order."""
        payloads: dict[int, dict[str, Any]] = {}
        client_metrics: dict[int, dict[str, float]] = {}
        for part in parts:
            payloads.update(part.payloads)
            client_metrics.update(part.client_metrics)
        return cls(
            sums=sums,
            payloads=dict(sorted(payloads.items())),
            client_metrics=dict(sorted(client_metrics.items())),
            num_clients=sum(part.num_clients for part in parts),
            excluded_clients=sorted(client for part in parts for client in part.excluded_clients),
        )


class Algorithm:
    """Base class with FedAvg's behaviour for everything a subclass does not override."""

    name: ClassVar[str] = ""
    # Whether client_update returns ClientUpdate.state: such runs need a client state store that every
    # node of a cluster reaches (checked before the first round; see fedray.runtime.state_store).
    keeps_client_state: ClassVar[bool] = False
    # What the model and config must provide (BatchNorm layers, a projection head, per-client test
    # splits...), checked before Ray starts; see fedray.algorithms.requirements.
    requires: ClassVar[frozenset[Requirement]] = frozenset()
    # What client_update uploads (model weights, prototypes, ...), for privacy and robust aggregation;
    # empty: undeclared, refused when they are on. See fedray.algorithms.uploads.
    uploads: ClassVar[frozenset[Upload]] = frozenset()
    # False: clients never upload anything (Local), so that privacy, robust rules, compression and
    # async, which act on uploads, are refused for that reason rather than for undeclared uploads.
    communicates: ClassVar[bool] = True
    Params: ClassVar[type[AlgorithmParams]] = AlgorithmParams

    def __init__(self, config: RunConfig, info: DatasetInfo) -> None:
        self.config = config
        self.info = info
        self.params = self.Params.model_validate(config.algorithm.model_extra or {})
        self.task: Task = build_task(config, info)

    def run_uploads(self) -> frozenset[Upload]:
        """What ``client_update`` uploads with this run's params: ``uploads`` unless a setting leaves
        one of them out (privacy checks and handles these)."""
        return type(self).uploads

    # ----------------------------------------------------------------- models
    def model_key(self, client_id: int | None) -> str:
        """Which model instance a client uses; workers keep one instance per key. Algorithms with
        per-client architectures override this and :meth:`build_model`."""
        return "global"

    def build_model(self, key: str) -> FedModel:
        return build_model(self.config.model, self.info, self.config.data.task)

    @cached_property
    def parameter_mask(self) -> Tensor:
        """CPU ``bool`` over the global model's flat layout: True at parameters, False at float
        buffers (server optimizers, control variates and FedDyn's state live on parameters only)."""
        with torch.device("meta"):  # shapes only: no memory, no draw from the global RNG
            shapes = self.build_model(self.model_key(None))
        return parameter_mask(shapes)

    def public_indices(self, data: FederatedDataset) -> np.ndarray | None:
        """Training-set indices of the unlabelled public images every client sees as
        ``ClientContext.x_public`` (Hetero-SSFL's alignment set). Default: none."""
        return None

    # ----------------------------------------------------------------- server side
    def init_server_state(self, model: FedModel) -> ServerState:
        """The state before round 1, from the seeded initial model."""
        return {"weights": get_flat_weights(model)}

    def broadcast(self, server_state: ServerState, round: int) -> Broadcast:
        """What every client of ``round`` receives (``round`` = the round about to be trained)."""
        return {"weights": server_state["weights"]}

    def aggregate(self, server_state: ServerState, round: int, results: RoundResults) -> tuple[ServerState, dict[str, float]]:
        """New server state and per-round diagnostics. Default: FedAvg (sample-weighted mean)."""
        return {**server_state, "weights": weighted_mean(results.sums)}, {}

    # ----------------------------------------------------------------- client side
    def client_update(self, ctx: ClientContext, broadcast: Broadcast) -> ClientUpdate:
        raise NotImplementedError

    # ----------------------------------------------------------------- evaluation
    def load_global_model(self, model: FedModel, broadcast: Broadcast) -> FedModel:
        """Put the global model described by ``broadcast`` into ``model`` (for evaluation)."""
        set_flat_weights(model, broadcast["weights"])
        return model

    def predict(self, model: FedModel, x: Tensor, broadcast: Broadcast) -> Tensor:
        """Logits for normalised inputs; FedProto-style algorithms override (nearest prototype)."""
        return model(x)

    def evaluate_global(self, model: FedModel, broadcast: Broadcast, x: Tensor, y: Tensor) -> dict[str, Any]:
        """The task's sums (classification: ``correct``, ``loss_sum``, ``count``) of the global model on a test shard."""
        self.load_global_model(model, broadcast)
        return evaluation_sums(self, model, broadcast, x, y, self.config.eval.batch_size)

    def evaluate_client(self, ctx: ClientContext, broadcast: Broadcast) -> dict[str, Any]:
        """The task's sums of the client's own model on its held-out split. Default: the global model, which is
        what FedAvg-style methods deploy on every client."""
        assert ctx.x_test is not None and ctx.y_test is not None
        return self.evaluate_global(ctx.model, broadcast, ctx.x_test, ctx.y_test)

    def evaluation_clients(self, num_clients: int) -> list[int] | None:
        """``None`` (default): the server evaluates the global model with :meth:`evaluate_global`.
        A list: the server evaluates each named client with :meth:`evaluate_on_test_set` instead
        (algorithms with no global model, or whose evaluation needs the training set)."""
        return None

    def evaluate_on_test_set(
        self, ctx: ClientContext, broadcast: Broadcast, train: tuple[Tensor, Tensor], test: tuple[Tensor, Tensor]
    ) -> dict[str, float]:
        """Metrics of one client named by :meth:`evaluation_clients`, given the whole labelled
        training and test sets ``(x uint8, y)`` on the device. The server reports the mean of each
        metric over the clients that return it (so it should include ``test_accuracy``)."""
        raise NotImplementedError(f"{type(self).__name__} names evaluation_clients but does not implement evaluate_on_test_set")


# --------------------------------------------------------------------- shared pieces


class FrozenCopies:
    """Worker-local frozen copies of a client's model architecture (eval mode, no gradients), one per
    role (MOON's received global and previous local models, FedNTD's global teacher). Copied from
    the model, not built, so that no random initialisation consumes the client's seeded RNG."""

    def __init__(self) -> None:
        self._copies: dict[str, FedModel] = {}

    def load(self, role: str, model: FedModel, flat: Tensor, prefixes: tuple[str, ...] | None = None) -> FedModel:
        """The frozen copy for ``role``, holding ``flat`` (restricted to ``prefixes``)."""
        if role not in self._copies:
            self._copies[role] = copy.deepcopy(model).eval().requires_grad_(False)
        frozen = self._copies[role]
        set_flat_weights(frozen, flat, prefixes)
        return frozen


def weighted_mean(sums: dict[str, Tensor], key: str = "weights", weight_key: str = "num_samples") -> Tensor:
    """``Σ n_k w_k / Σ n_k`` from worker-reduced sums, back in float32."""
    return (sums[key] / sums[weight_key]).float()


def weighted_sums(flat: Tensor, num_samples: int | float) -> dict[str, Tensor]:
    """The FedAvg contribution of one client's flat vector ``w_k``: ``n_k · w_k`` (float64) and
    ``n_k``, the two sums :func:`weighted_mean` divides."""
    return {"weights": flat.double() * num_samples, "num_samples": torch.tensor(float(num_samples), dtype=torch.float64)}


def weighted_weights_sums(model: FedModel, num_samples: int | float, prefixes: tuple[str, ...] | None = None) -> dict[str, Tensor]:
    """:func:`weighted_sums` of the model's flat weights (restricted to ``prefixes``)."""
    return weighted_sums(get_flat_weights(model, prefixes), num_samples)


@torch.no_grad()
def evaluation_sums(algorithm: Algorithm, model: FedModel, broadcast: Broadcast, x: Tensor, y: Tensor, batch_size: int) -> dict[str, Any]:
    """The task's evaluation sums (:meth:`fedray.tasks.Task.evaluation_sums`) of ``model``'s predictions
    (:meth:`Algorithm.predict`) on ``x`` as stored, added over batches of ``batch_size``."""
    was_training = model.training
    model.eval()
    total: dict[str, Any] = {}
    for start in range(0, int(y.shape[0]), batch_size):
        xb = algorithm.info.normalize(x[start : start + batch_size])
        sums = algorithm.task.evaluation_sums(algorithm.predict(model, xb, broadcast), y[start : start + batch_size])
        total = add_sums(total, sums)
    model.train(was_training)
    return total


def add_sums(total: dict[str, Any], sums: dict[str, Any]) -> dict[str, Any]:
    """``total + sums`` key by key (floats or numpy arrays): evaluation sums of batches, shards, clients."""
    return {key: total[key] + value if key in total else value for key, value in sums.items()}
