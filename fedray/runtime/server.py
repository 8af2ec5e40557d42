"""The server: owns the algorithm's server state and drives the worker pool, one round at a time.

Per round (the principles are those of docs/architecture.md): draw the cohort from (seed, round);
``ray.put`` the broadcast once (principle 2); split the cohort across workers by cost, sticky first
(principles 5, 6); gather one reduced partial per worker (principle 3); replace any worker that died
and re-run its clients, which gives the same partial because everything is seeded per client
(principle 7); aggregate; evaluate.

It is a plain class that :mod:`fedray.runtime.experiment` wraps with ``ray.remote``.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

import numpy as np
import ray
import torch
from ray.exceptions import ObjectLostError, RayActorError
from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from fedray.config import RunConfig
from fedray.data import FederatedDataset
from fedray.runtime.reduction import PartialResult, merge_partials
from fedray.runtime.scheduler import assign_clients, client_forward_flops
from fedray.seeding import sample_cohort
from fedray.runtime.state_store import NO_STATE
from fedray.runtime.worker import ClientTask, ClientWorker, build_algorithm

logger = logging.getLogger(__name__)


class WorkerPoolError(RuntimeError):
    """Workers kept dying past ``resources.max_worker_restarts``."""


def start_worker(
    config: RunConfig,
    index: int,
    data: ray.ObjectRef,
    run_dir: str,
    placement_group: PlacementGroup | None,
    first_worker_bundle: int,
    runtime_env: dict[str, Any] | None = None,
) -> Any:
    """Start client worker ``index`` in its bundle of ``placement_group``; returns its actor handle.
    ``runtime_env`` is for a caller whose own environment the worker would not inherit (the driver's,
    when the config names user modules)."""
    resources = config.resources
    options: dict[str, Any] = {"num_cpus": resources.cpus_per_worker, "num_gpus": resources.gpus_per_worker}
    if placement_group is not None:
        options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
            placement_group, placement_group_bundle_index=first_worker_bundle + index
        )
    if runtime_env is not None:
        options["runtime_env"] = runtime_env
    return (
        ray.remote(ClientWorker)
        .options(**options)
        .remote(config.to_dict(), data, run_dir, resources.gpus_per_worker > 0)
    )


class Server:
    def __init__(
        self,
        config: dict[str, Any],
        data_ref: list[ray.ObjectRef],
        run_dir: str,
        placement_group: PlacementGroup | None,
        first_worker_bundle: int,
        workers: list[Any],
    ) -> None:
        """``workers``: the pool's actors, one per worker bundle, started by the driver (with
        :func:`start_worker`) so that they boot while this actor does; the server replaces the ones
        that die."""
        self.placement_group = placement_group
        self.first_worker_bundle = first_worker_bundle
        self._start_run(config, data_ref, run_dir)
        self.workers = list(workers)

    def reset(self, config: dict[str, Any], data_ref: list[ray.ObjectRef], run_dir: str) -> None:
        """Make this server and its workers those of a new run, exactly as if they had just been
        started for it (a Tune trial reusing the warm pool of the previous trial). ``config`` must
        have the same ``resources`` as the one the workers were started with."""
        self._start_run(config, data_ref, run_dir)
        ray.get([worker.reset.remote(self.config.to_dict(), self.data_ref[0], run_dir) for worker in self.workers])

    def _start_run(self, config: dict[str, Any], data_ref: list[ray.ObjectRef], run_dir: str) -> None:
        self.config = RunConfig.model_validate(config)
        self.data_ref = data_ref  # a list, so that Ray passes the reference on instead of the data
        data: FederatedDataset = ray.get(data_ref[0])
        self.num_clients = data.num_clients
        self.client_test_sizes = None if data.client_test is None else data.client_test.sizes.astype(np.float64)
        self.run_dir = run_dir
        self.algorithm = build_algorithm(self.config, data)
        self.client_flops = client_forward_flops(self.algorithm, data)
        self.client_costs = data.clients.sizes * self.config.train.local_epochs * self.client_flops
        torch.manual_seed(self.config.seed)
        self.state = self.algorithm.init_server_state(self.algorithm.build_model(self.algorithm.model_key(None)))
        # round in which each client last stored state; the same as of each kept checkpoint (oldest
        # first, at most checkpoint.keep), whose client state the workers must not delete
        self.state_versions = np.full(self.num_clients, NO_STATE, dtype=np.int64)
        self.checkpoint_versions: list[np.ndarray] = []
        self.worker_restarts = 0
        self.broadcast_ref: ray.ObjectRef | None = None
        self.broadcast_round = 0

    # ------------------------------------------------------------------ workers
    def _start_worker(self, index: int) -> Any:
        """A new worker in bundle ``index``'s place (it inherits this actor's ``runtime_env``)."""
        return start_worker(self.config, index, self.data_ref[0], self.run_dir, self.placement_group, self.first_worker_bundle)

    def _on_all_workers(self, call: Callable[[Any, Any], ray.ObjectRef], work: list[Any]) -> list[Any]:
        """``call(worker, work[i])`` on every worker with work; a worker that dies is replaced and its
        work re-run. A result lost with its node after the worker finished (``ObjectLostError``, as
        ``ray.wait`` saw it ready on a node that then died) counts as the worker dying. Returns the
        results in worker order (None where there was no work)."""
        pending = {i: call(self.workers[i], item) for i, item in enumerate(work) if item}
        results: list[Any] = [None] * len(work)
        while pending:
            by_ref = {ref: i for i, ref in pending.items()}
            [ready], _ = ray.wait(list(by_ref), num_returns=1)
            index = by_ref[ready]
            del pending[index]
            try:
                results[index] = ray.get(ready)
            except (RayActorError, ObjectLostError) as error:
                self.worker_restarts += 1
                if self.worker_restarts > self.config.resources.max_worker_restarts:
                    raise WorkerPoolError(
                        f"worker {index} died and resources.max_worker_restarts="
                        f"{self.config.resources.max_worker_restarts} is used up: {error}"
                    ) from error
                logger.warning("worker %d died (%s); replacing it and re-running its clients", index, type(error).__name__)
                ray.kill(self.workers[index])  # a no-op for a dead actor; stops one whose node lost only the result
                self.workers[index] = self._start_worker(index)
                pending[index] = call(self.workers[index], work[index])
        return results

    def _tasks(self, client_ids: list[int]) -> list[ClientTask]:
        return [
            (cid, int(self.state_versions[cid]), tuple(sorted({int(kept[cid]) for kept in self.checkpoint_versions} - {NO_STATE})))
            for cid in client_ids
        ]

    def _broadcast(self, round: int) -> ray.ObjectRef:
        """The broadcast for ``round``, put in the object store once."""
        if self.broadcast_ref is None or self.broadcast_round != round:
            self.broadcast_ref = ray.put(self.algorithm.broadcast(self.state, round))
            self.broadcast_round = round
        return self.broadcast_ref

    # ------------------------------------------------------------------ rounds
    def run_round(self, round: int) -> dict[str, Any]:
        """Train and aggregate one round; returns the round's metrics and per-client rows."""
        started = time.perf_counter()
        cfg = self.config
        cohort = sample_cohort(cfg.seed, round, self.num_clients, cfg.train.clients_per_round)
        # which clients a worker sums changes only the float64 rounding of the sums, which has not
        # reached a float32 result in any run measured (docs/performance.md); stickiness pays only
        # where a worker caches client state
        assignment = assign_clients(cohort, self.client_costs[cohort], len(self.workers), sticky=self.algorithm.keeps_client_state)
        broadcast = self._broadcast(round)
        partials: list[PartialResult | None] = self._on_all_workers(
            lambda worker, ids: worker.run_clients.remote(round, self._tasks(ids), broadcast), assignment
        )
        results = merge_partials([p for p in partials if p is not None])
        for partial in partials:
            if partial is not None:
                self.state_versions[partial.stateful_clients] = round
        if results.excluded_clients:
            logger.warning("round %d: %d non-finite client update(s) excluded: %s", round, len(results.excluded_clients), results.excluded_clients)
        if results.num_clients > 0:
            self.state, algorithm_metrics = self.algorithm.aggregate(self.state, round, results)
        else:
            algorithm_metrics = {}
        row: dict[str, Any] = {
            "round": round,
            "clients": int(len(cohort)),
            "excluded_updates": len(results.excluded_clients),
            "worker_restarts": self.worker_restarts,  # cumulative
            "train_loss": _mean([m.get("train_loss") for m in results.client_metrics.values()]),
            "lr": cfg.train.lr * cfg.train.lr_decay ** (round - 1),
            **algorithm_metrics,
        }
        if round % cfg.eval.every == 0 or round == cfg.train.rounds:
            row.update(self.evaluate(round))
        row["seconds"] = time.perf_counter() - started
        client_rows = [{"client_id": cid, **metrics} for cid, metrics in results.client_metrics.items()]
        return {"round": row, "clients": client_rows}

    def evaluate(self, round: int) -> dict[str, float]:
        """Global test metrics of the model after ``round`` (and personalised ones if configured)."""
        broadcast = self._broadcast(round + 1)  # the next round's broadcast holds the new global model
        clients = self.algorithm.evaluation_clients(self.num_clients)
        if clients is not None:
            return self._evaluate_clients_on_test_set(round, clients, broadcast)
        num_workers = len(self.workers)
        shards = self._on_all_workers(
            lambda worker, shard: worker.evaluate_global.remote(broadcast, shard[0], num_workers),
            [(i,) for i in range(num_workers)],
        )
        total = {key: sum(s[key] for s in shards) for key in ("correct", "loss_sum", "count")}
        metrics = {"test_accuracy": total["correct"] / total["count"], "test_loss": total["loss_sum"] / total["count"]}
        if self.config.eval.personalized:
            metrics.update(self._evaluate_personalized(round, broadcast))
        return metrics

    def _evaluate_each_client(
        self, worker_method: str, round: int, clients: np.ndarray, costs: np.ndarray, broadcast: ray.ObjectRef
    ) -> dict[int, dict[str, float]]:
        """``ClientWorker.<worker_method>(round, tasks, broadcast)`` over ``clients``, split across the
        workers by ``costs``; the metrics of each client, by ascending client id."""
        assignment = assign_clients(clients, costs, len(self.workers))
        parts = self._on_all_workers(
            lambda worker, ids: getattr(worker, worker_method).remote(round, self._tasks(ids), broadcast), assignment
        )
        return dict(sorted((cid, metrics) for part in parts if part for cid, metrics in part.items()))

    def _evaluate_clients_on_test_set(self, round: int, clients: list[int], broadcast: ray.ObjectRef) -> dict[str, float]:
        """The mean of each metric over the named clients that report it (algorithms without a
        global model evaluate every client's own model on the global test set)."""
        by_client = self._evaluate_each_client(
            "evaluate_clients_on_test_set", round, np.asarray(clients), self.client_flops[clients], broadcast
        )
        per_client = list(by_client.values())
        names = dict.fromkeys(name for metrics in per_client for name in metrics)
        return {name: float(np.mean([m[name] for m in per_client if name in m])) for name in names}

    def _evaluate_personalized(self, round: int, broadcast: ray.ObjectRef) -> dict[str, float]:
        """The personalised-FL accuracy (total correct / total) and fairness (std of per-client
        accuracies) over every client's held-out split."""
        assert self.client_test_sizes is not None
        clients = np.flatnonzero(self.client_test_sizes > 0)
        costs = self.client_test_sizes[clients] * self.client_flops[clients]
        per_client = self._evaluate_each_client("evaluate_clients", round, clients, costs, broadcast)
        accuracies = np.array([s["correct"] / s["count"] for s in per_client.values()])
        correct = sum(s["correct"] for s in per_client.values())
        count = sum(s["count"] for s in per_client.values())
        return {
            "personal_accuracy": correct / count,
            "personal_accuracy_std": float(accuracies.std()),
            "personal_accuracy_worst": float(accuracies.min()),
            "personal_accuracy_client_mean": float(accuracies.mean()),
        }

    # ------------------------------------------------------------------ checkpoints
    def checkpoint_state(self) -> dict[str, Any]:
        """Everything a resumed run needs (tensors and plain values only: loadable with weights_only).

        ``kept_state_versions`` [k, num_clients] holds the client-state versions of the k earlier
        checkpoints that stay on disk next to this one (``checkpoint.keep`` - 1 at most), so that a
        run resumed from this checkpoint keeps protecting their client state too."""
        earlier = self.checkpoint_versions[len(self.checkpoint_versions) - self.config.checkpoint.keep + 1 :]
        return {
            "server_state": self.state,
            "state_versions": torch.from_numpy(self.state_versions.copy()),
            "kept_state_versions": torch.from_numpy(np.stack(earlier) if earlier else np.empty((0, self.num_clients), np.int64)),
            "worker_restarts": self.worker_restarts,
        }

    def checkpoint_written(self) -> None:
        """The driver saved the last :meth:`checkpoint_state`: its client-state versions are now
        protected, with those of the ``checkpoint.keep`` - 1 checkpoints before it."""
        self.checkpoint_versions = [*self.checkpoint_versions, self.state_versions.copy()][-self.config.checkpoint.keep :]

    def load_checkpoint_state(self, state: dict[str, Any]) -> None:
        self.state = state["server_state"]
        self.state_versions = state["state_versions"].numpy().astype(np.int64)
        earlier = state.get("kept_state_versions", torch.empty(0, self.num_clients, dtype=torch.int64)).numpy()
        self.checkpoint_versions = [row.astype(np.int64) for row in earlier] + [self.state_versions.copy()]
        self.broadcast_ref = None

    def global_state(self) -> dict[str, Any]:
        return self.state

    def worker_handles(self) -> list[Any]:
        return list(self.workers)


def _mean(values: list[float | None]) -> float:
    present = [v for v in values if v is not None]
    return float(np.mean(present)) if present else float("nan")
