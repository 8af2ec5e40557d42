"""Flower's Ray simulation (PyPI ``flwr[simulation]``: ``run_simulation`` of a ``ServerApp`` and a
``ClientApp``, Flower's message-API ``FedAvg``) training a workload of benchmarks/peers exactly as the
plain loop of benchmarks/w1_overhead.py (``run_plain``) does:

- one SuperNode per client; the strategy's ``configure_train`` sends round r's messages to fedray's
  seeded cohort ``sample_cohort(seed, r, num_clients, clients_per_round)`` instead of Flower's random
  sample, each message naming its client;
- each ClientApp trains with the plain loop's own ``train_client`` (the same batches, epochs and lr)
  and replies with its weights and ``num-examples``, by which ``FedAvg`` weights them;
- the ServerApp scores the global model on the test set after the rounds the others score
  (``evaluate_fn``, called by Flower after every round, which also clocks the rounds); no federated
  evaluation.

``--workers`` ClientApp actors of 1 CPU each (Flower's default would be 2 CPUs per actor). This module
is imported by name in its process (run_peers.py does not run it as ``__main__``): Flower's Ray
actors unpickle the ClientApp for every message, and one defined in ``__main__`` would travel by
value, losing the actor's prepared data every time. Run by run_peers.py in Flower's virtual
environment.
"""

from __future__ import annotations

import functools
import time
from importlib.metadata import version

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
from flwr.simulation import run_simulation
from w1_overhead import PlainWorkload, accuracy_on_test_set, batch_order_generator, evaluates_after, prepare_workload, train_client
from workloads import peer_main, peer_result

from fedray.seeding import sample_cohort

client_app = ClientApp()


@functools.cache
def actor_workload(overrides: tuple[str, ...]) -> PlainWorkload:
    """The workload in an actor's process, prepared at its first message."""
    torch.set_num_threads(1)  # as the plain loop (benchmarks/w1_overhead.py run_plain)
    return prepare_workload(list(overrides))


@client_app.train()
def train(message: Message, context: Context) -> Message:
    config = message.content["config"]
    workload = actor_workload(tuple(config["overrides"]))
    client, round = int(config["client"]), int(config["server-round"])
    model = workload.model
    model.load_state_dict(message.content["arrays"].to_torch_state_dict())
    x, y = workload.client_data(client)
    train_client(model, x, y, workload, batch_order_generator(client, round))
    reply = RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": MetricRecord({"num-examples": len(y)})})
    return Message(content=reply, reply_to=message)


class SeededCohortFedAvg(FedAvg):
    """Flower's FedAvg training fedray's seeded cohort of each round."""

    def __init__(self, workload: PlainWorkload) -> None:
        super().__init__(fraction_evaluate=0.0)
        self.config, self.num_clients = workload.config, workload.data.num_clients

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> list[Message]:
        while len(nodes := sorted(grid.get_node_ids())) < self.num_clients:  # the SuperNodes, one per client, register at start-up
            time.sleep(0.1)
        messages = []
        for client in sample_cohort(self.config.seed, server_round, self.num_clients, self.config.train.clients_per_round):
            record = RecordDict({"arrays": arrays, "config": ConfigRecord({**config, "server-round": server_round, "client": int(client)})})
            messages.append(Message(content=record, message_type=MessageType.TRAIN, dst_node_id=nodes[client]))
        return messages


def run(overrides: list[str], workers: int) -> dict:
    started = time.perf_counter()
    torch.set_num_threads(1)
    workload = prepare_workload(overrides)  # the initial model and the test set, on the server's side
    config = workload.config
    marks: list[float] = []  # time.perf_counter() at round 1's start and at the end of each round
    scores: list[float] = []

    def score(round: int, arrays: ArrayRecord) -> MetricRecord | None:
        metrics = None
        if round > 0 and evaluates_after(round, config):
            workload.model.load_state_dict(arrays.to_torch_state_dict())
            scores.append(accuracy_on_test_set(workload.model, workload))
            metrics = MetricRecord({"accuracy": scores[-1]})
        marks.append(time.perf_counter())
        return metrics

    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        SeededCohortFedAvg(workload).start(
            grid,
            ArrayRecord(workload.model.state_dict()),
            num_rounds=config.train.rounds,
            train_config=ConfigRecord({"overrides": overrides}),
            evaluate_fn=score,
        )

    run_simulation(
        server_app,
        client_app,
        num_supernodes=workload.data.num_clients,
        backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}, "init_args": {"num_cpus": workers}},
    )
    if len(marks) != config.train.rounds + 1:
        raise SystemExit(f"flower_peer: the simulation stopped after {len(marks) - 1} of {config.train.rounds} rounds (see the log above)")
    return peer_result(started, marks, scores[-1], {"flwr": version("flwr"), "ray": version("ray"), "torch": torch.__version__})


def main(argv: list[str]) -> int:
    return peer_main(run, argv)
