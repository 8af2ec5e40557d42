"""The client worker: a long-lived actor that trains many virtual clients one after another
(docs/architecture.md, principle 1).

It holds the dataset on its device once (principle 4), one model per architecture key, and a client
state cache backed by the run's client state store (principle 5; :mod:`fedray.runtime.state_store`). It is a plain class; the server wraps it with
``ray.remote`` and pins it to a placement-group bundle with a fractional GPU.

With ``train.vectorize`` (``on``, or ``auto`` where the algorithm and model allow it) a round's
clients are trained in groups of ``resources.vectorize_group`` (or as many as fit), each group as
one batched computation (:mod:`fedray.algorithms.vectorized`); each client's update then takes the
same upload path and reduction as the loop's, in the same order.
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import logging
import os
import warnings
from typing import Any

import numpy as np
import torch

from fedray.algorithms import Algorithm, ClientContext, ClientUpdate, get_algorithm_class
from fedray.algorithms.vectorized import (
    VECTORIZED,
    automatic_group_size,
    check_vectorizable,
    is_out_of_memory,
    loop_reason,
    refusal,
    train_group,
)
from fedray.aggregation.attacks import backdoor_test_set, poisoning_problem
from fedray.config import ConfigError, RunConfig
from fedray.data import FederatedDataset, get_augmentation
from fedray.models import FedModel
from fedray.runtime.errors import first_line
from fedray.runtime.reduction import PartialResult, tensors_to
from fedray.seeding import seed_client
from fedray.runtime.state_store import ClientStateStore, client_state_location
from fedray.runtime.upload_path import ClientUploadPath
from fedray.runtime.user_code import call_algorithm
from fedray.systems.compression import Residuals, split_client_state

logger = logging.getLogger(__name__)

# (client id, state version to load, state versions the kept checkpoints refer to)
ClientTask = tuple[int, int, tuple[int, ...]]
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)


def build_algorithm(config: RunConfig, data: FederatedDataset) -> Algorithm:
    """The run's algorithm; with ``train.vectorize=on``, a :class:`~fedray.config.ConfigError` when
    the algorithm, the config or the model (built on the meta device: shapes and module types only)
    cannot be vectorised, so that :func:`fedray.runtime.experiment.prepare_data` refuses the run before Ray."""
    algorithm = get_algorithm_class(config.algorithm.name)(config, data.info)
    poisoning = poisoning_problem(config, data.info)  # robust.attack=backdoor on data without images, ...
    if poisoning is not None:
        raise ConfigError(None, poisoning)
    if config.train.vectorize == "on":
        check_vectorizable(config, algorithm, _model_shapes(algorithm))
    return algorithm


def _model_shapes(algorithm: Algorithm) -> FedModel | None:
    """The algorithm's global model on the meta device (no memory, no draw from torch's RNG), or
    None where it cannot be built there (the worker checks the real model then)."""
    try:
        with torch.device("meta"):
            return algorithm.build_model(algorithm.model_key(None))
    except Exception:  # noqa: BLE001 - prepare_data reports a model that does not build
        return None


def _as_tensor(array: np.ndarray, device: torch.device) -> torch.Tensor:
    with warnings.catch_warnings():  # object-store arrays are read-only; we never write to them
        warnings.simplefilter("ignore", UserWarning)
        return torch.as_tensor(array).to(device)


def keep_freed_memory() -> None:
    """Make glibc's malloc keep freed memory in this process for reuse instead of handing it back to
    the OS. By default blocks above a (dynamic, at most 32 MB) threshold are mmap-ed and unmapped on
    every free, and the heap is trimmed whenever 128 KB at its top are free, so every forward pass
    page-faults its activations in again: measured on Fashion-MNIST with ``cnn_small``, a third of an
    evaluation's time went to the kernel zeroing pages, and two workers faulting at once slowed each
    other down (docs/performance.md). A worker's memory stays at its peak instead. No-op where the C
    library is not glibc."""
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return
    one_gib = 1 << 30
    mallopt(_M_MMAP_THRESHOLD, one_gib)  # blocks up to this size come from the heap, not from mmap
    mallopt(_M_TRIM_THRESHOLD, one_gib)  # free memory at the heap's top is returned above this only


def update_hash(update: ClientUpdate) -> str:
    """The ``update_hash`` of a client row (``output.record_update_hashes``; ``fedray replay``,
    :mod:`fedray.runtime.replay`): the SHA-256 (hex) of a client's update as it leaves the client,
    after the worker's upload path (attack, clipping, local noise, compression) and before
    pre-aggregation: what :meth:`PartialResult.add` receives. Hashed in order: every tensor of
    ``sums`` by sorted name, as float64 (the dtype the worker sums in), then every value of
    ``payload`` by sorted name in its own dtype (nested dicts by sorted key, lists in order, other
    values by their ``repr``), each preceded by its name, dtype and shape."""
    digest = hashlib.sha256()
    for name in sorted(update.sums):
        _hash_into(digest, f"sums/{name}", update.sums[name].detach().to(torch.float64))
    for name in sorted(update.payload):
        _hash_into(digest, f"payload/{name}", update.payload[name])
    return digest.hexdigest()


def _hash_into(digest: Any, name: str, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}\n".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(value, np.ndarray):
        array = np.ascontiguousarray(value)
        digest.update(f"{name}:{array.dtype}:{array.shape}\n".encode())
        digest.update(array.tobytes())
    elif isinstance(value, dict):
        for key in sorted(value, key=str):
            _hash_into(digest, f"{name}/{key}", value[key])
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _hash_into(digest, f"{name}[{index}]", item)
    else:
        digest.update(f"{name}:{type(value).__name__}:{value!r}\n".encode())


def select_device(use_gpu: bool) -> torch.device:
    return torch.device("cuda") if use_gpu and torch.cuda.is_available() else torch.device("cpu")


class ClientWorker:
    def __init__(
        self,
        config: dict[str, Any],
        data: FederatedDataset,
        run_dir: str,
        use_gpu: bool,
    ) -> None:
        keep_freed_memory()  # a setting of the process: once, not on every reset
        self.device = select_device(use_gpu)
        # torch's global RNG as a new process has it: what builds a worker's models draws from it
        self.initial_rng_state = torch.random.get_rng_state()
        self._start_run(config, data, run_dir)

    def reset(self, config: dict[str, Any], data: FederatedDataset, run_dir: str) -> None:
        """Make this worker that of a new run, exactly as if it had just been started for it (see
        ``Server.reset``): new config, data and client state store, no models, the initial RNG."""
        torch.random.set_rng_state(self.initial_rng_state)
        self._start_run(config, data, run_dir)

    def _start_run(self, config: dict[str, Any], data: FederatedDataset, run_dir: str) -> None:
        self.config = RunConfig.model_validate(config)
        torch.set_num_threads(max(1, int(self.config.resources.cpus_per_worker)))
        self.data = data
        self.algorithm = build_algorithm(self.config, data)
        augmentation = self.config.data.augmentation
        self.augment = get_augmentation(data.info.augmentation if augmentation == "auto" else augmentation)
        self.x_train = _as_tensor(data.train.x, self.device)
        self.y_train = _as_tensor(data.train.y, self.device)
        self.x_test = _as_tensor(data.test.x, self.device)
        self.y_test = _as_tensor(data.test.y, self.device)
        public = self.algorithm.public_indices(data)
        self.x_public = None if public is None else self.x_train[torch.as_tensor(public, device=self.device)]
        self.mean_client_samples = float(np.mean(data.clients.sizes))
        self.models: dict[str, FedModel] = {}
        self.upload_path = ClientUploadPath.for_run(self.config, self.algorithm, data.num_clients)  # None: privacy, robust, compression off
        self.state_store = ClientStateStore(client_state_location(self.config.output, run_dir))
        self.training_path: str | None = None  # train.vectorize: "vectorized" or "loop: <reason>", decided at the first round
        self.vectorize_group: int | None = self.config.resources.vectorize_group  # None: sized at the first round
        self.vectorized_groups = 0  # groups trained vectorised so far in this run

    # ------------------------------------------------------------------ helpers
    def model_for(self, client_id: int | None) -> FedModel:
        key = self.algorithm.model_key(client_id)
        if key not in self.models:
            self.models[key] = self.algorithm.build_model(key).to(self.device)
        return self.models[key]

    def client_context(self, round: int, client_id: int, state_version: int) -> ClientContext:
        """What ``Algorithm.client_update`` gets for ``client_id`` in ``round``: its data on this
        worker's device, its seeded generator and its state as stored in ``state_version``."""
        return self.client_context_and_residuals(round, client_id, state_version)[0]

    def client_context_and_residuals(self, round: int, client_id: int, state_version: int) -> tuple[ClientContext, Residuals]:
        """:meth:`client_context`, whose state leaves out the client's error-feedback residuals
        (``systems.compression``), and those residuals (empty: it has none)."""
        cfg = self.config
        state, residuals = split_client_state(self.state_store.load(client_id, state_version, self.device))
        train_index = torch.as_tensor(self.data.clients.client(client_id), device=self.device)
        x, y = self.x_train[train_index], self.y_train[train_index]
        if self.upload_path is not None:  # robust.attack label_flip/backdoor: a malicious client trains on poisoned data
            x, y = self.upload_path.poisoned_data(round, client_id, x, y)
        x_test = y_test = None
        if self.data.client_test is not None:
            test_index = torch.as_tensor(self.data.client_test.client(client_id), device=self.device)
            x_test, y_test = self.x_train[test_index], self.y_train[test_index]
        context = ClientContext(
            client_id=client_id,
            round=round,
            model=self.model_for(client_id),
            x=x,
            y=y,
            info=self.data.info,
            train=cfg.train,
            lr=cfg.train.lr * cfg.train.lr_decay ** (round - 1),
            device=self.device,
            generator=seed_client(cfg.seed, round, client_id),
            augment=self.augment,
            state=state,
            x_test=x_test,
            y_test=y_test,
            x_public=self.x_public,
            mean_client_samples=self.mean_client_samples,
        )
        return context, residuals

    # ------------------------------------------------------------------ remote methods
    def run_clients(self, round: int, tasks: list[ClientTask], broadcast: dict[str, Any]) -> PartialResult:
        """Train the given clients in order and return their reduced updates."""
        broadcast = tensors_to(broadcast, self.device)  # one host-to-device copy a round, not one a client
        partial = PartialResult()
        if self.config.train.vectorize != "off" and self.vectorized():
            tasks = self.run_clients_vectorized(round, tasks, broadcast, partial)  # what is left: auto's fallback
        for client_id, state_version, checkpoint_versions in tasks:
            ctx, residuals = self.client_context_and_residuals(round, client_id, state_version)
            update = call_algorithm(self.algorithm, "client_update", round, client_id, ctx, broadcast)
            self.add_update(partial, round, (client_id, state_version, checkpoint_versions), ctx, residuals, update, broadcast)
        return partial.to_cpu()

    def add_update(
        self,
        partial: PartialResult,
        round: int,
        task: ClientTask,
        ctx: ClientContext,
        residuals: Residuals,
        update: ClientUpdate,
        broadcast: dict[str, Any],
    ) -> None:
        """Put one client's update through the upload path into ``partial`` and store its new state."""
        client_id, state_version, checkpoint_versions = task
        if update.state is not None and not self.algorithm.keeps_client_state:
            raise TypeError(f"algorithm {self.algorithm.name} returned client state but does not set keeps_client_state = True")
        if self.upload_path is not None:
            if update.state is None and self.upload_path.keeps_residuals:  # stored anew next to the new residual
                update = dataclasses.replace(update, state=ctx.state)
            update = self.upload_path.apply(round, client_id, update, broadcast, residuals)
        added = partial.add(client_id, update)
        if self.config.output.record_update_hashes:  # fedray replay compares a re-executed update with it
            partial.client_metrics[client_id]["update_hash"] = update_hash(update)
        if added and update.state is not None:
            self.state_store.save(client_id, round, update.state, keep=(state_version, *checkpoint_versions))
            partial.stateful_clients.append(client_id)

    # ------------------------------------------------------------------ vectorised training
    def vectorized(self) -> bool:
        """Whether this run trains its clients vectorised (``train.vectorize`` on or auto), decided
        once, at the first round, on the algorithm, the config and the real model; ``auto`` logs
        which path it took. ``on`` with a model that cannot be vectorised is a ConfigError (found
        before Ray by :func:`build_algorithm` wherever the model builds on the meta device)."""
        if self.training_path is None:
            reason = loop_reason(self.config, self.algorithm)
            if reason is None:  # only a vectorisable algorithm's model is built here: its clients' own ("global")
                reason = loop_reason(self.config, self.algorithm, self.model_for(None))
            if reason is not None and self.config.train.vectorize == "on":
                raise refusal(reason)
            self.training_path = VECTORIZED if reason is None else f"loop: {reason}"
            logger.info("train.vectorize=%s: clients train %s", self.config.train.vectorize, self.training_path)
        return self.training_path == VECTORIZED

    def group_size(self) -> int:
        """``resources.vectorize_group``, or the automatic size (:func:`automatic_group_size`), once a run."""
        if self.vectorize_group is None:
            model = self.model_for(None)
            sample = self.data.info.dummy_input().to(self.device)
            self.vectorize_group = automatic_group_size(
                model, sample, self.config.train.batch_size, self.device, self.config.resources.gpus_per_worker
            )
            logger.info("train.vectorize: groups of at most %d clients (from the memory estimate)", self.vectorize_group)
        return self.vectorize_group

    def run_clients_vectorized(
        self, round: int, tasks: list[ClientTask], broadcast: dict[str, Any], partial: PartialResult
    ) -> list[ClientTask]:
        """:meth:`run_clients`'s training in groups of consecutive tasks, each trained as one batched
        computation; every client's update is then added in the tasks' order, as the loop adds it.
        Returns the tasks left to the loop: none, unless ``train.vectorize=auto`` and the run's first
        group failed (a model that ``vmap`` cannot batch, which the checks did not foresee): the run
        then trains as the loop from that group on, and says why.

        A group that runs out of memory is halved (the group size too, for the rest of the run) and
        trained again from fresh contexts (the same seeded draws)."""
        position = 0
        while position < len(tasks):
            group = tasks[position : position + self.group_size()]
            contexts = [self.client_context_and_residuals(round, client_id, version) for client_id, version, _ in group]
            try:
                updates = train_group(self.algorithm, [ctx for ctx, _ in contexts], broadcast)
            except Exception as error:
                if is_out_of_memory(error) and len(group) > 1:
                    del contexts
                    if self.device.type == "cuda":
                        torch.cuda.empty_cache()
                    self.vectorize_group = max(1, len(group) // 2)
                    logger.warning(
                        "train.vectorize: a group of %d clients ran out of memory; groups of %d from now on",
                        len(group),
                        self.vectorize_group,
                    )
                    continue
                if self.config.train.vectorize != "auto" or self.vectorized_groups > 0:
                    raise
                self.training_path = f"loop: vectorised training failed ({type(error).__name__}: {first_line(error)})"
                logger.warning("train.vectorize=auto: clients train %s", self.training_path)
                return tasks[position:]
            self.vectorized_groups += 1
            for task, (ctx, residuals), update in zip(group, contexts, updates, strict=True):
                self.add_update(partial, round, task, ctx, residuals, update, broadcast)
            position += len(group)
        return []

    def run_client_groups(self, groups: list[tuple[int, list[ClientTask]]], *broadcasts: dict[str, Any]) -> list[PartialResult]:
        """:meth:`run_clients` for each ``(round, tasks)`` of ``groups`` with ``broadcasts[i]``, one
        partial per group: clients that started from different model versions (``train.mode: async``,
        :mod:`fedray.runtime.async_rounds`) trained in one call. The broadcasts travel as arguments of
        their own, which Ray resolves from the object store as it does one round's broadcast."""
        return [self.run_clients(round, tasks, broadcast) for (round, tasks), broadcast in zip(groups, broadcasts, strict=True)]

    def evaluate_global(self, round: int, broadcast: dict[str, Any], shard: int, num_shards: int) -> dict[str, float]:
        """Evaluation sums of the global model after ``round`` on test rows ``shard::num_shards``."""
        model = self.model_for(None)
        return call_algorithm(
            self.algorithm,
            "evaluate_global",
            round,
            None,
            model,
            tensors_to(broadcast, self.device),
            self.x_test[shard::num_shards],
            self.y_test[shard::num_shards],
        )

    def evaluate_backdoor(self, round: int, broadcast: dict[str, Any], shard: int, num_shards: int) -> dict[str, float]:
        """:meth:`evaluate_global` on the triggered test set of ``robust.attack: backdoor``
        (:func:`fedray.aggregation.attacks.backdoor_test_set`), whose accuracy is the attack success rate."""
        robust = self.config.robust
        x, y = backdoor_test_set(self.x_test[shard::num_shards], self.y_test[shard::num_shards], robust.trigger_size, robust.target_class)
        model = self.model_for(None)
        return call_algorithm(self.algorithm, "evaluate_global", round, None, model, tensors_to(broadcast, self.device), x, y)

    def evaluate_clients(self, round: int, tasks: list[ClientTask], broadcast: dict[str, Any]) -> dict[int, dict[str, float]]:
        """Evaluation sums of each client's personalised model on its held-out split."""
        broadcast = tensors_to(broadcast, self.device)
        results = {}
        for client_id, state_version, _ in tasks:
            ctx = self.client_context(round, client_id, state_version)
            results[client_id] = call_algorithm(self.algorithm, "evaluate_client", round, client_id, ctx, broadcast)
        return results

    def evaluate_clients_on_test_set(self, round: int, tasks: list[ClientTask], broadcast: dict[str, Any]) -> dict[int, dict[str, float]]:
        """Metrics of each client's own model on the global test set (algorithms without a global
        model; see ``Algorithm.evaluation_clients``)."""
        train, test = (self.x_train, self.y_train), (self.x_test, self.y_test)
        broadcast = tensors_to(broadcast, self.device)
        results = {}
        for client_id, state_version, _ in tasks:
            ctx = self.client_context(round, client_id, state_version)
            results[client_id] = call_algorithm(self.algorithm, "evaluate_on_test_set", round, client_id, ctx, broadcast, train, test)
        return results

    def pid(self) -> int:
        return os.getpid()

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def placement_group_id(self) -> str | None:
        """Hex id of the placement group this worker runs in (None outside one); lets a caller
        that passed ``placement=`` (a Tune trial) check that its workers landed in its group."""
        import ray

        group = ray.util.get_current_placement_group()
        return None if group is None else group.id.hex()
