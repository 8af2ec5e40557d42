"""An in-process federation for Ray-free algorithm tests: a real :class:`ClientWorker` (its client
state store in a temporary directory) trains the clients, and the algorithm's own server rule
aggregates the worker's reduced sums, as the server actor would."""

from __future__ import annotations

import torch

from fedray.algorithms.base import ServerState
from fedray import load_config
from fedray.data import build_federated_dataset
from fedray.runtime.reduction import merge_partials
from fedray.runtime.state_store import NO_STATE
from fedray.runtime.worker import ClientWorker


class Federation:
    def __init__(self, tmp_path, overrides: list[str]) -> None:
        config = load_config(None, ["data.num_clients=6", "train.clients_per_round=3", "train.local_epochs=1", *overrides])
        data = build_federated_dataset(config.data, config.seed)
        self.worker = ClientWorker(config.to_dict(), data, str(tmp_path), use_gpu=False)
        self.algorithm = self.worker.algorithm
        self.num_clients = data.num_clients
        self.versions = [NO_STATE] * data.num_clients  # round of each client's stored state
        torch.manual_seed(config.seed)
        self.state: ServerState = self.algorithm.init_server_state(self.algorithm.build_model("global"))

    def run_round(self, round: int, clients: list[int]) -> dict[str, float]:
        """Train ``clients`` on the current broadcast and aggregate; returns the server's diagnostics."""
        tasks = [(cid, self.versions[cid], ()) for cid in clients]  # (client, version to load, versions the checkpoints keep)
        partial = self.worker.run_clients(round, tasks, self.algorithm.broadcast(self.state, round))
        for cid in partial.stateful_clients:
            self.versions[cid] = round
        self.state, metrics = self.algorithm.aggregate(self.state, round, merge_partials([partial]))
        return metrics

    def client_state(self, client_id: int) -> dict[str, torch.Tensor] | None:
        return self.worker.state_store.load(client_id, self.versions[client_id], torch.device("cpu"))


def assert_same_round_as(tmp_path, overrides: list[str], reference: list[str], clients: tuple[int, ...] = (0, 2, 5)) -> None:
    """One round of ``overrides`` gives bit-identical global weights to one of ``reference``."""
    first, second = Federation(tmp_path / "first", overrides), Federation(tmp_path / "second", reference)
    first.run_round(1, list(clients))
    second.run_round(1, list(clients))
    assert torch.equal(first.state["weights"], second.state["weights"])
