"""The round engine: owns the algorithm's server state and drives a worker pool, one round at a time.

Per round (the principles are those of docs/architecture.md): draw the cohort from (seed, round);
share the broadcast once (principle 2); split the cohort across workers by cost, sticky first
(principles 5, 6); gather one reduced partial per worker (principle 3); aggregate; evaluate. Where the
workers run is the pool's business (:mod:`fedray.runtime.pool`): in this process, or as Ray actors
that the pool replaces when they die, re-running their clients, which gives the same partial because
everything is seeded per client (principle 7).

It is Ray-free: ``resources.backend: local`` runs it in the driver, and the Ray server actor
(:class:`fedray.runtime.server.Server`) is a thin shell around it.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any

import numpy as np
import torch

from fedray.algorithms import RoundResults
from fedray.algorithms.base import add_sums
from fedray.config import RunConfig
from fedray.data import FederatedDataset
from fedray.runtime.async_rounds import BufferedAggregation
from fedray.runtime.pool import WorkerPool
from fedray.runtime.reduction import PartialResult, merge_partials
from fedray.algorithms.costs import client_forward_flops
from fedray.runtime.scheduler import assign_clients
from fedray.runtime.state_store import NO_STATE
from fedray.runtime.upload_path import ServerUploadPath
from fedray.runtime.user_code import call_algorithm
from fedray.runtime.worker import ClientTask, build_algorithm
from fedray.seeding import sample_cohort
from fedray.systems import SystemsModel
from fedray.systems.clock import payload_bytes
from fedray.systems.compression import keeps_client_state

logger = logging.getLogger(__name__)


class RoundEngine:
    """The rounds of one run on ``pool``; ``data`` is the run's dataset (the one the workers hold)."""

    def __init__(self, config: RunConfig, data: FederatedDataset, run_dir: str, pool: WorkerPool) -> None:
        self.config = config
        self.pool = pool
        self.num_clients = data.num_clients
        self.client_test_sizes = None if data.client_test is None else data.client_test.sizes.astype(np.float64)
        self.client_sizes = data.clients.sizes
        self.client_names = data.client_names  # data.partition=natural: each client's id in the data
        self.run_dir = run_dir
        self.algorithm = build_algorithm(config, data)
        self.client_flops = client_forward_flops(self.algorithm, data)
        self.client_costs = data.clients.sizes * config.train.local_epochs * self.client_flops
        # devices, availability and the simulated clock (systems.enabled; None: every client is ideal)
        self.systems = SystemsModel.for_run(config, data, self.algorithm) if config.systems.enabled else None
        # privacy and robust aggregation between the clients' updates and aggregate (None: off)
        self.upload_path = ServerUploadPath.for_run(config, self.algorithm)
        self.upload_row: dict[str, float] = {}  # the last round's privacy/robustness columns
        torch.manual_seed(config.seed)
        self.state = self.algorithm.init_server_state(self.algorithm.build_model(self.algorithm.model_key(None)))
        # round in which each client last stored state; the same as of each kept checkpoint (oldest
        # first, at most checkpoint.keep), whose client state the workers must not delete
        self.state_versions = np.full(self.num_clients, NO_STATE, dtype=np.int64)
        self.checkpoint_versions: list[np.ndarray] = []
        self.shared_broadcast: Any = None
        self.broadcast_round = 0
        self.plain_broadcast: dict[str, Any] = {}  # the broadcast itself; shared_broadcast is the pool's handle on it
        # train.mode: async runs its rounds (None: synchronous rounds, below)
        self.buffered = BufferedAggregation(self) if config.train.mode == "async" else None

    def client_tasks(self, client_ids: list[int]) -> list[ClientTask]:
        """Each client's :data:`ClientTask`: its id, its stored state's version and the versions the kept checkpoints protect."""
        return [
            (cid, int(self.state_versions[cid]), tuple(sorted({int(kept[cid]) for kept in self.checkpoint_versions} - {NO_STATE})))
            for cid in client_ids
        ]

    def broadcast(self, round: int) -> Any:
        """The broadcast for ``round``, shared with the pool once."""
        if self.shared_broadcast is None or self.broadcast_round != round:
            self.plain_broadcast = self.algorithm.broadcast(self.state, round)
            if self.upload_path is not None:  # adaptive clipping: the round's clip bound travels with it
                self.plain_broadcast = self.upload_path.broadcast(self.plain_broadcast)
            self.shared_broadcast = self.pool.share(self.plain_broadcast)
            self.broadcast_round = round
        return self.shared_broadcast

    def _on_clients(self, method: str, round: int, assignment: list[list[int]], broadcast: Any) -> list[Any]:
        """``ClientWorker.<method>(round, tasks, broadcast)`` with each worker's clients of ``assignment``."""
        return self.pool.call_each(method, [(round, self.client_tasks(ids), broadcast) if ids else None for ids in assignment])

    # ------------------------------------------------------------------ rounds
    def run_round(self, round: int, cohort: np.ndarray | None = None) -> dict[str, Any]:
        """Train and aggregate one round; returns the round's metrics and per-client rows.
        ``cohort``: the clients to train (default: the round's seeded draw); with ``systems.enabled``,
        the clients to select, of whom only those that report in time train (default: a draw among
        the clients online). With ``train.mode: async``, one aggregation of buffered updates
        (:mod:`fedray.runtime.async_rounds`), which chooses its own clients."""
        if self.buffered is not None:
            if cohort is not None:
                raise ValueError("train.mode=async chooses its own clients: run_round takes no cohort")
            return self.buffered.run_round(round)
        started = time.perf_counter()
        cfg = self.config
        plan = None
        if self.systems is not None:  # decided before any client runs: dropped and late clients do not train
            self.broadcast(round)
            broadcast_bytes = payload_bytes(self.plain_broadcast)  # what each client of the round downloads
            plan = self.systems.plan_round(round, broadcast_bytes, cohort)
            cohort = plan.reporting
        elif cohort is None:
            cohort = sample_cohort(cfg.seed, round, self.num_clients, cfg.train.clients_per_round)
        results = self.train(round, np.asarray(cohort))
        row = self.aggregate(round, results, len(cohort))
        if plan is not None:
            row.update(self.systems.finish_round(round, plan, results, broadcast_bytes))
        return self.close_round(round, row, results, started)

    def aggregate(self, round: int, results: RoundResults, clients: int) -> dict[str, Any]:
        """Aggregate ``results`` into the server state; the round's metrics row so far (``clients``:
        how many clients trained)."""
        cfg = self.config
        if results.num_clients > 0:
            self.state, algorithm_metrics = call_algorithm(self.algorithm, "aggregate", round, None, self.state, round, results)
        else:
            algorithm_metrics = {}
        return {
            "round": round,
            "clients": int(clients),
            "excluded_updates": len(results.excluded_clients),
            "worker_restarts": self.pool.restarts,  # cumulative
            "train_loss": _mean([m.get("train_loss") for m in results.client_metrics.values()]),
            "lr": cfg.train.lr * cfg.train.lr_decay ** (round - 1),
            **algorithm_metrics,
            **self.upload_row,
        }

    def close_round(self, round: int, row: dict[str, Any], results: RoundResults, started: float) -> dict[str, Any]:
        """Evaluate after ``round`` when due and return its metrics ``row`` (with its wall time since
        ``started``) and a row per client of ``results``."""
        cfg = self.config
        if round % cfg.eval.every == 0 or round == cfg.train.rounds:
            row.update(self.evaluate(round))
        row["seconds"] = time.perf_counter() - started
        client_rows = [{**self._client_columns(cid), **metrics} for cid, metrics in results.client_metrics.items()]
        return {"round": row, "clients": client_rows}

    def _client_columns(self, client_id: int) -> dict[str, Any]:
        """What a client row says of its client: its id, its training samples and, with a natural
        partition, its id in the data (``client_name``)."""
        columns: dict[str, Any] = {"client_id": client_id, "num_samples": int(self.client_sizes[client_id])}
        if self.client_names is not None:
            columns["client_name"] = self.client_names[client_id]
        return columns

    def train(self, round: int, cohort: np.ndarray) -> RoundResults:
        """Run ``cohort``'s client updates on the pool and merge the workers' partials: what reaches
        the algorithm's ``aggregate`` (after the upload path's noise or robust rule, when on)."""
        if self.upload_path is not None:
            self.upload_path.check_budget(round)
        # which clients a worker sums changes only the float64 rounding of the sums, which has not
        # reached a float32 result in any run measured (docs/performance.md); stickiness pays only
        # where a worker caches client state
        sticky = keeps_client_state(self.config, type(self.algorithm))
        assignment = assign_clients(cohort, self.client_costs[cohort], self.pool.size, sticky=sticky)
        partials: list[PartialResult | None] = self._on_clients("run_clients", round, assignment, self.broadcast(round))
        results = merge_partials([p for p in partials if p is not None])
        if self.upload_path is not None:
            results, self.upload_row = self.upload_path.apply(round, results, self.plain_broadcast["weights"])
        for partial in partials:
            if partial is not None:
                self.state_versions[partial.stateful_clients] = round
        if results.excluded_clients:
            logger.warning(
                "round %d: %d non-finite client update(s) excluded: %s", round, len(results.excluded_clients), results.excluded_clients
            )
        return results

    def evaluate(self, round: int) -> dict[str, float]:
        """Global test metrics of the model after ``round`` (and personalised ones if configured)."""
        broadcast = self.broadcast(round + 1)  # the next round's broadcast holds the new global model
        clients = self.algorithm.evaluation_clients(self.num_clients)
        if clients is not None:
            return self._evaluate_clients_on_test_set(round, clients, broadcast)
        num_workers = self.pool.size
        shards = self.pool.call_each("evaluate_global", [(round, broadcast, i, num_workers) for i in range(num_workers)])
        total = functools.reduce(add_sums, shards, {})
        metrics = {f"test_{name}": value for name, value in self.algorithm.task.metrics(total).items()}
        if self.config.robust.attack == "backdoor":  # the share of triggered non-target test samples classified as the target
            shards = self.pool.call_each("evaluate_backdoor", [(round, broadcast, i, num_workers) for i in range(num_workers)])
            metrics["attack_success_rate"] = self.algorithm.task.metrics(functools.reduce(add_sums, shards, {}))["accuracy"]
        if self.config.eval.personalized:
            metrics.update(self._evaluate_personalized(round, broadcast))
        return metrics

    def evaluate_each_client(
        self, worker_method: str, round: int, clients: np.ndarray, costs: np.ndarray, broadcast: Any
    ) -> dict[int, dict[str, float]]:
        """``ClientWorker.<worker_method>(round, tasks, broadcast)`` over ``clients``, split across the
        workers by ``costs``; the metrics of each client, by ascending client id."""
        parts = self._on_clients(worker_method, round, assign_clients(clients, costs, self.pool.size), broadcast)
        return dict(sorted((cid, metrics) for part in parts if part for cid, metrics in part.items()))

    def _evaluate_clients_on_test_set(self, round: int, clients: list[int], broadcast: Any) -> dict[str, float]:
        """The mean of each metric over the named clients that report it (algorithms without a
        global model evaluate every client's own model on the global test set)."""
        by_client = self.evaluate_each_client(
            "evaluate_clients_on_test_set", round, np.asarray(clients), self.client_flops[clients], broadcast
        )
        per_client = list(by_client.values())
        names = dict.fromkeys(name for metrics in per_client for name in metrics)
        return {name: float(np.mean([m[name] for m in per_client if name in m])) for name in names}

    def _evaluate_personalized(self, round: int, broadcast: Any) -> dict[str, float]:
        """The task's headline metric of every client's own model on its held-out split, pooled over
        the clients (``personal_accuracy``: total correct / total), and its distribution over them:
        ``_std`` (population std, ddof=0), ``_worst`` (the lowest accuracy, the highest RMSE or
        perplexity), ``_p10`` (the value 10 % of the clients are worse than: the 10th percentile of a
        metric where higher is better, the 90th of one where lower is better; numpy's linear
        interpolation), ``_median`` and ``_client_mean`` (the unweighted mean of the clients' values)."""
        assert self.client_test_sizes is not None
        task = self.algorithm.task
        clients = np.flatnonzero(self.client_test_sizes > 0)
        costs = self.client_test_sizes[clients] * self.client_flops[clients]
        per_client = self.evaluate_each_client("evaluate_clients", round, clients, costs, broadcast)
        values = np.array([task.headline_of(sums) for sums in per_client.values()])
        pooled = functools.reduce(add_sums, per_client.values(), {})
        key = f"personal_{task.headline}"
        return {
            key: task.headline_of(pooled),
            f"{key}_std": float(values.std()),
            f"{key}_worst": float(values.min() if task.mode == "max" else values.max()),
            f"{key}_client_mean": float(values.mean()),
            f"{key}_p10": float(np.percentile(values, 10 if task.mode == "max" else 90)),
            f"{key}_median": float(np.median(values)),
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
            "worker_restarts": self.pool.restarts,
            **({"upload_path": self.upload_path.state_dict()} if self.upload_path is not None else {}),
            **({"systems": self.systems.state_dict()} if self.systems is not None else {}),
            **({"fedbuff": self.buffered.state_dict()} if self.buffered is not None else {}),
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
        self.shared_broadcast = None
        if self.upload_path is not None and "upload_path" in state:
            self.upload_path.load_state_dict(state["upload_path"])
        if self.systems is not None:
            self.systems.load_state_dict(state["systems"])
        if self.buffered is not None:
            self.buffered.load_state_dict(state["fedbuff"])

    def worker_handles(self) -> list[Any]:
        return self.pool.handles()


def _mean(values: list[float | None]) -> float:
    present = [v for v in values if v is not None]
    return float(np.mean(present)) if present else float("nan")
