"""Test harness for algorithm authors (and fedray's own tests): a tiny federation in this process.

:class:`Federation` runs the real round engine (:class:`~fedray.runtime.engine.RoundEngine`) on the
real workers (:class:`~fedray.runtime.worker.ClientWorker`, in a
:class:`~fedray.runtime.pool.LocalPool`): no Ray, nothing mocked, and every round's
:class:`~fedray.algorithms.RoundResults` (exactly what reaches ``Algorithm.aggregate``) is kept::

    from fedray.testing import Federation

    def test_my_algorithm_learns(tmp_path):
        federation = Federation(tmp_path, ["algorithm.name=mylab.algos:MyAlg", "train.lr=0.1"])
        first = federation.run_round(1)
        federation.run(5)
        assert federation.rows[-1]["test_accuracy"] > first["test_accuracy"]
        update = federation.client_update(round=6, client_id=0)   # one client step, by hand

Multi-node clusters and a local S3 server for runtime tests are in :mod:`fedray.testing.cluster` and
:mod:`fedray.testing.s3`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import numpy as np
import torch

from fedray.algorithms import Algorithm, ClientContext, ClientUpdate, RoundResults
from fedray.data import build_federated_dataset
from fedray.models import FedModel
from fedray.plugins import load_config
from fedray.runtime.engine import RoundEngine
from fedray.runtime.pool import LocalPool
from fedray.runtime.worker import ClientWorker

#: Six clients of the digits data, three per round, one local epoch, one worker; a test's overrides come after.
SMALL = ("data.num_clients=6", "train.clients_per_round=3", "train.local_epochs=1", "resources.num_workers=1")


class _RecordingEngine(RoundEngine):
    """The round engine, keeping each round's merged results."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.results: list[RoundResults] = []

    def train(self, round: int, cohort: np.ndarray) -> RoundResults:
        results = super().train(round, cohort)
        self.results.append(results)
        return results


class Federation:
    """A run's engine and workers, in this process, on ``overrides`` applied over :data:`SMALL`.

    The client state store lives in ``run_dir``. ``algorithm`` is the server's instance (its
    ``aggregate`` and ``broadcast``); each worker has its own, as in a real run.
    """

    def __init__(self, run_dir: str | Path, overrides: Iterable[str] = (), defaults: Iterable[str] = SMALL) -> None:
        self.run_dir = Path(run_dir)
        self._overrides, self._defaults = list(overrides), list(defaults)
        self.config = load_config(None, [*self._defaults, *self._overrides])
        self.data = build_federated_dataset(self.config.data, self.config.seed)
        self.pool = LocalPool(self.config, self.data, str(run_dir))
        self.engine = _RecordingEngine(self.config, self.data, str(run_dir), self.pool)
        self.rows: list[dict[str, Any]] = []  # each round's metrics row, as metrics.parquet has it, less its wall time
        torch.manual_seed(self.config.seed)
        self.initial_model: FedModel = self.algorithm.build_model(self.algorithm.model_key(None))  # as the server built it

    @property
    def algorithm(self) -> Algorithm:
        return self.engine.algorithm

    @property
    def state(self) -> dict[str, Any]:
        """The server state after the last round."""
        return self.engine.state

    @property
    def results(self) -> list[RoundResults]:
        """What reached ``aggregate`` in each round so far."""
        return self.engine.results

    @property
    def workers(self) -> list[ClientWorker]:
        return self.pool.workers

    @property
    def worker(self) -> ClientWorker:
        return self.pool.workers[0]

    @property
    def versions(self) -> np.ndarray:
        """``[num_clients]``: the round in which each client last stored state (``NO_STATE``: never)."""
        return self.engine.state_versions

    @property
    def num_clients(self) -> int:
        return self.engine.num_clients

    def run_round(self, round: int, clients: Iterable[int] | None = None) -> dict[str, Any]:
        """Train ``clients`` (default: the round's seeded cohort), aggregate and evaluate as a run
        does; returns the round's metrics row (less its wall time, so that rows compare)."""
        cohort = None if clients is None else np.asarray(list(clients))
        row = {key: value for key, value in self.engine.run_round(round, cohort)["round"].items() if key != "seconds"}
        self.rows.append(row)
        return row

    def run(self, rounds: int) -> "Federation":
        """``rounds`` more rounds, each on its seeded cohort."""
        for round in range(len(self.rows) + 1, len(self.rows) + rounds + 1):
            self.run_round(round)
        return self

    def resumed(self, run_dir: str | Path) -> "Federation":
        """A new federation in ``run_dir`` that continues from this one's last round, as ``fedray run
        --resume`` does from a checkpoint taken now: the engine's checkpoint state is loaded, the rows
        so far carried over. (An algorithm with client state also needs this federation's state files:
        give it the same ``run_dir``.)"""
        resumed = Federation(run_dir, self._overrides, self._defaults)
        resumed.engine.load_checkpoint_state(self.engine.checkpoint_state())
        resumed.rows.extend(self.rows)
        return resumed

    def client_context(self, round: int, client_id: int, worker: int = 0) -> ClientContext:
        """Client ``client_id``'s context in ``round`` on worker ``worker``, with its latest state."""
        return self.workers[worker].client_context(round, client_id, int(self.versions[client_id]))

    def client_update(self, round: int, client_id: int) -> ClientUpdate:
        """One client step by hand: ``client_update`` on the broadcast of ``round`` (not merged)."""
        broadcast = self.algorithm.broadcast(self.state, round)
        return self.worker.algorithm.client_update(self.client_context(round, client_id), broadcast)

    def client_state(self, client_id: int) -> dict[str, torch.Tensor] | None:
        """The state ``client_id`` stored last (None if it has none)."""
        return self.worker.state_store.load(client_id, int(self.versions[client_id]), torch.device("cpu"))

    def client_sums(self, round: int) -> dict[int, dict[str, float]]:
        """Each client's evaluation sums on its held-out split after ``round``, as the server gathers them."""
        sizes = self.engine.client_test_sizes
        if sizes is None:
            raise ValueError("client_sums needs per-client test splits (data.client_test_fraction > 0)")
        clients = np.flatnonzero(sizes > 0)
        costs = sizes[clients] * self.engine.client_flops[clients]
        return self.engine.evaluate_each_client("evaluate_clients", round, clients, costs, self.engine.broadcast(round + 1))
