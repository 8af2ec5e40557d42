"""Where a run's workers ran: ``workers.json`` in the run directory.

On a multi-node cluster it shows how ``resources.placement_strategy`` spread the worker pool and
where the server restarted a worker it lost (a node that died takes its workers with it; the server
replaces them in their placement-group bundles, which Ray moves to surviving nodes).
"""

from __future__ import annotations

import json
from typing import Any

import ray
from ray.exceptions import RayActorError

from fedray.tracking.callbacks import Callback, RunContext

WORKERS_FILE = "workers.json"


class WorkerPlacement(Callback):
    """Writes ``workers.json``: the driver's node id and, at the start of the run and after every
    round in which a worker was replaced, the node id of each worker::

        {"driver_node_id": "...",
         "placements": [{"after_round": 0, "worker_node_ids": ["...", "..."]}, ...]}

    A worker that died before it could answer is recorded as ``null``.
    """

    def __init__(self) -> None:
        self.record: dict[str, Any] = {}
        self.nodes: dict[Any, str | None] = {}  # worker handle -> node id
        self.worker_restarts = 0

    def on_run_start(self, run: RunContext) -> None:
        self.record = {"driver_node_id": ray.get_runtime_context().get_node_id(), "placements": []}
        self._record_changes(run, run.start_round)

    def on_round_end(self, run: RunContext, row: dict[str, Any], client_rows: list[dict[str, Any]]) -> None:
        if row["worker_restarts"] != self.worker_restarts:  # ask the server only when a worker was replaced
            self.worker_restarts = row["worker_restarts"]
            self._record_changes(run, row["round"])

    def _record_changes(self, run: RunContext, round: int) -> None:
        workers = run.server.worker_handles()
        if list(self.nodes) == workers:
            return
        self.nodes = {worker: self.nodes[worker] if worker in self.nodes else _node_of(worker) for worker in workers}
        self.record["placements"].append({"after_round": round, "worker_node_ids": list(self.nodes.values())})
        (run.run_dir / WORKERS_FILE).write_text(json.dumps(self.record, indent=2))


def _node_of(worker: Any) -> str | None:
    try:
        return ray.get(worker.node_id.remote())
    except RayActorError:
        return None
