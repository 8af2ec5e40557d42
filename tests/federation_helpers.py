"""An in-process federation for Ray-free algorithm tests: the server's round loop (cohort, split across
workers, reduction, aggregation, personalised evaluation with the next round's broadcast) run in this
process on real :class:`ClientWorker` objects, one per ``resources.num_workers``, their client state
store in a temporary directory. It records every :class:`RoundResults`: exactly what reaches the server."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from fedray import load_config
from fedray.algorithms.base import RoundResults, ServerState
from fedray.data import build_federated_dataset
from fedray.runtime.reduction import merge_partials
from fedray.runtime.scheduler import assign_clients, client_forward_flops
from fedray.runtime.state_store import NO_STATE
from fedray.runtime.worker import ClientWorker
from fedray.seeding import sample_cohort

#: Six clients, three per round, one local epoch, one worker; the test's overrides come after.
SMALL = ["data.num_clients=6", "train.clients_per_round=3", "train.local_epochs=1", "resources.num_workers=1"]


class Federation:
    def __init__(self, run_dir: Path, overrides: list[str]) -> None:
        self.config = load_config(None, [*SMALL, *overrides])
        self.run_dir = run_dir
        data = build_federated_dataset(self.config.data, self.config.seed)
        self.workers = [ClientWorker(self.config.to_dict(), data, str(run_dir), use_gpu=False)
                        for _ in range(self.config.resources.num_workers)]
        self.worker = self.workers[0]
        self.algorithm = self.worker.algorithm
        self.num_clients = data.num_clients
        self.client_flops = client_forward_flops(self.algorithm, data)
        self.client_costs = data.clients.sizes * self.config.train.local_epochs * self.client_flops
        self.test_sizes = None if data.client_test is None else data.client_test.sizes
        self.versions = np.full(self.num_clients, NO_STATE, dtype=np.int64)  # round of each client's stored state
        torch.manual_seed(self.config.seed)
        self.initial_model = self.algorithm.build_model("global")
        self.state: ServerState = self.algorithm.init_server_state(self.initial_model)
        self.results: list[RoundResults] = []
        self.rows: list[dict] = []

    def tasks(self, ids) -> list[tuple[int, int, tuple[int, ...]]]:
        """(client, version to load, versions the checkpoints keep) of each client in ``ids``."""
        return [(int(c), int(self.versions[c]), ()) for c in ids]

    def run_round(self, round: int, clients: list[int] | None = None) -> dict[str, float]:
        """Train ``clients`` (default: the round's seeded cohort) on the current broadcast, split across
        the workers as the server splits them, and aggregate; returns the server's diagnostics (and the
        personalised metrics with ``eval.personalized``)."""
        if clients is None:
            clients = sample_cohort(self.config.seed, round, self.num_clients, self.config.train.clients_per_round)
        clients = np.asarray(clients)
        assignment = assign_clients(clients, self.client_costs[clients], len(self.workers), sticky=self.algorithm.keeps_client_state)
        broadcast = self.algorithm.broadcast(self.state, round)
        partials = [w.run_clients(round, self.tasks(ids), broadcast) for w, ids in zip(self.workers, assignment) if ids]
        for partial in partials:
            self.versions[partial.stateful_clients] = round
        results = merge_partials(partials)
        self.results.append(results)
        self.state, metrics = self.algorithm.aggregate(self.state, round, results)
        if self.config.eval.personalized and self.test_sizes is not None:
            metrics = {**metrics, **self.personal_metrics(round)}
        self.rows.append({"round": round, **metrics})
        return metrics

    def run(self, rounds: int) -> "Federation":
        for round in range(1, rounds + 1):
            self.run_round(round)
        return self

    def client_sums(self, round: int) -> dict[int, dict[str, float]]:
        """Each client's evaluation sums after ``round``, as the server gathers them."""
        broadcast = self.algorithm.broadcast(self.state, round + 1)
        clients = np.flatnonzero(self.test_sizes > 0)
        per_client = {}
        costs = self.test_sizes[clients] * self.client_flops[clients]
        for worker, ids in zip(self.workers, assign_clients(clients, costs, len(self.workers))):
            per_client.update(worker.evaluate_clients(round, self.tasks(ids), broadcast))
        return per_client

    def personal_metrics(self, round: int) -> dict[str, float]:
        """The FedCoSR paper's metrics as PFLlib computes them: Acc = Σ correct / Σ n_test,
        Std = np.std(per-client acc, ddof=0)."""
        sums = self.client_sums(round)
        accuracies = [s["correct"] / s["count"] for s in sums.values()]
        return {
            "personal_accuracy": sum(s["correct"] for s in sums.values()) / sum(s["count"] for s in sums.values()),
            "personal_accuracy_std": float(np.std(accuracies, ddof=0)),
        }

    def client_state(self, client_id: int) -> dict[str, torch.Tensor] | None:
        return self.worker.state_store.load(client_id, int(self.versions[client_id]), torch.device("cpu"))


def assert_same_round_as(tmp_path, overrides: list[str], reference: list[str], clients: tuple[int, ...] = (0, 2, 5)) -> None:
    """One round of ``overrides`` gives bit-identical global weights to one of ``reference``."""
    first, second = Federation(tmp_path / "first", overrides), Federation(tmp_path / "second", reference)
    first.run_round(1, list(clients))
    second.run_round(1, list(clients))
    assert torch.equal(first.state["weights"], second.state["weights"])
