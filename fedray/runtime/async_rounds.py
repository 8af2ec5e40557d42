"""The rounds of ``train.mode: async``: buffered asynchronous aggregation (FedBuff) on the round
engine's worker pool (docs/guide/systems.md, "Asynchronous aggregation").

Per round, :class:`~fedray.systems.fedbuff.BufferSchedule` runs the simulated clock until the
buffer holds ``systems.fedbuff.buffer_size`` updates; all of them are known at that point, with the
model version each client started from, so they train in one pool call however stale they are: a
worker runs its share of the buffer's clients version by version, each group on its version's
broadcast with the round number that version was broadcast for (t for version t − 1: the seeds,
learning-rate decay and client-state versions of the synchronous round the client would have been
in). :func:`~fedray.systems.fedbuff.buffered_results` weights the groups by staleness and the
algorithm's own ``aggregate`` applies them, so its server learning rate and optimizer act on the
buffered update. With ``privacy`` or ``robust`` on, the engine's server upload path takes the
per-version groups instead (:meth:`fedray.runtime.upload_path.ServerUploadPath.apply_buffer`: central
noise once on the buffer's sum over the fixed denominator K, local DP's noised deltas, a robust rule
over the buffer's staleness-weighted deltas) and accounts each aggregation as one release.

The state a resumed run needs besides the engine's is the clients in training (who, from which
version, until when) and the broadcasts of the versions they started from (:meth:`state_dict`).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from fedray.algorithms import RoundResults
from fedray.config import RunConfig
from fedray.runtime.reduction import PartialResult, merge_partials
from fedray.runtime.scheduler import assign_clients
from fedray.systems.clock import payload_bytes
from fedray.systems.compression import keeps_client_state
from fedray.systems.fedbuff import Buffer, BufferSchedule, buffered_results, staleness_weights

if TYPE_CHECKING:
    from fedray.algorithms import Algorithm
    from fedray.runtime.pool import WorkerPool
    from fedray.runtime.upload_path import ServerUploadPath
    from fedray.runtime.worker import ClientTask
    from fedray.systems import SystemsModel

logger = logging.getLogger(__name__)


class RoundEngineView(Protocol):
    """What the asynchronous rounds use of :class:`fedray.runtime.engine.RoundEngine`, which owns
    them (declared here, so that this module does not import the engine that imports it)."""

    config: RunConfig
    pool: WorkerPool
    algorithm: Algorithm
    systems: SystemsModel | None
    client_costs: np.ndarray
    state_versions: np.ndarray
    plain_broadcast: dict[str, Any]
    upload_path: ServerUploadPath | None
    upload_row: dict[str, float]

    def broadcast(self, round: int) -> Any: ...

    def client_tasks(self, client_ids: list[int]) -> list[ClientTask]: ...

    def aggregate(self, round: int, results: RoundResults, clients: int) -> dict[str, Any]: ...

    def close_round(self, round: int, row: dict[str, Any], results: RoundResults, started: float) -> dict[str, Any]: ...


class BufferedAggregation:
    """The asynchronous rounds of ``engine`` (which must have ``systems.enabled``)."""

    def __init__(self, engine: RoundEngineView) -> None:
        assert engine.systems is not None, "train.mode=async needs systems.enabled (checked with the config)"
        self.engine = engine
        self.systems = engine.systems
        self.schedule = BufferSchedule(engine.config, engine.systems)
        self.staleness_exponent = engine.config.systems.fedbuff.staleness_exponent
        # the broadcast of each model version that clients train from, and its handle in the pool
        self.broadcasts: dict[int, dict[str, Any]] = {}
        self.shared: dict[int, Any] = {}

    def run_round(self, round: int) -> dict[str, Any]:
        """Receive updates until the buffer is full, aggregate them into model version ``round``;
        the round's metrics row (with ``staleness_mean`` / ``staleness_max``) and client rows
        (with each client's ``staleness``)."""
        started = time.perf_counter()
        engine, version = self.engine, round - 1
        self.shared[version] = engine.broadcast(round)  # version round - 1, for the clients that start now
        self.broadcasts[version] = engine.plain_broadcast
        broadcast_bytes = payload_bytes(engine.plain_broadcast)
        if engine.upload_path is not None:  # privacy.target_epsilon: stop before a release past it
            engine.upload_path.check_budget(round)
        buffer = self.schedule.next_buffer(round, broadcast_bytes)
        staleness = version - buffer.versions
        results = self.train(buffer, staleness_weights(staleness, self.staleness_exponent), version)
        if results.excluded_clients:
            logger.warning(
                "round %d: %d non-finite client update(s) excluded: %s", round, len(results.excluded_clients), results.excluded_clients
            )
        row = engine.aggregate(round, results, len(buffer.clients))
        row.update(self.systems.record_round(round, buffer.end_time, buffer.started, buffer.dropped, buffer.late, results, broadcast_bytes))
        row["staleness_mean"] = float(staleness.mean()) if len(staleness) else float("nan")
        row["staleness_max"] = float(staleness.max()) if len(staleness) else float("nan")
        in_training = self.schedule.versions_in_training()
        self.broadcasts = {v: broadcast for v, broadcast in self.broadcasts.items() if v in in_training}
        self.shared = {v: handle for v, handle in self.shared.items() if v in in_training}
        result = engine.close_round(round, row, results, started)
        staleness_of = dict(zip(buffer.clients.tolist(), staleness.tolist()))
        for client_row in result["clients"]:
            client_row["staleness"] = staleness_of[client_row["client_id"]]
        return result

    def train(self, buffer: Buffer, weights: np.ndarray, version: int) -> RoundResults:
        """Train the buffer's clients in one pool call, split across the workers by cost, and combine
        their updates with staleness weights ``weights`` (one per client of ``buffer``) into an
        update of model ``version``."""
        engine = self.engine
        clients = buffer.clients
        version_of = dict(zip(clients.tolist(), buffer.versions.tolist()))
        weight_of = dict(zip(buffer.versions.tolist(), weights.tolist()))  # one staleness per version
        sticky = keeps_client_state(engine.config, type(engine.algorithm))
        assignment = assign_clients(clients, engine.client_costs[clients], engine.pool.size, sticky=sticky)
        calls: list[tuple[Any, ...] | None] = []
        worker_versions: list[list[int]] = []
        for ids in assignment:
            versions = sorted({version_of[cid] for cid in ids})
            groups = [(v + 1, engine.client_tasks([cid for cid in ids if version_of[cid] == v])) for v in versions]
            calls.append((groups, *(self._shared(v) for v in versions)) if ids else None)
            worker_versions.append(versions)
        partials_by_version: dict[int, list[PartialResult]] = {}
        for versions, partials in zip(worker_versions, engine.pool.call_each("run_client_groups", calls)):
            for started_from, partial in zip(versions, partials or []):
                partials_by_version.setdefault(started_from, []).append(partial)  # in worker order
                engine.state_versions[partial.stateful_clients] = started_from + 1
        groups = [
            (merge_partials(partials_by_version[v]), weight_of[v], self.broadcasts[v]["weights"]) for v in sorted(partials_by_version)
        ]
        current = self.broadcasts[version]["weights"]
        if engine.upload_path is None:
            return buffered_results(groups, current, engine.config.systems.fedbuff.mixing)
        results, engine.upload_row = engine.upload_path.apply_buffer(version + 1, groups, current)
        return results

    def _shared(self, version: int) -> Any:
        """The pool's handle on ``version``'s broadcast (shared again after a resume)."""
        if version not in self.shared:
            self.shared[version] = self.engine.pool.share(self.broadcasts[version])
        return self.shared[version]

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The clients in training and the broadcasts of the versions they started from."""
        return {"schedule": self.schedule.state_dict(), "broadcasts": dict(self.broadcasts)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.schedule.load_state_dict(state["schedule"])
        self.broadcasts = {int(v): broadcast for v, broadcast in state["broadcasts"].items()}
        self.shared = {}
