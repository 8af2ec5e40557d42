"""What makes a sweep's comparison of algorithms *paired*: runs with the same ``seed`` give every algorithm
the same cohorts, the same clients online (``systems.availability``), the same data order and the same
initial weights (fedray/seeding.py: every draw comes from (seed, round, client id); the engine seeds torch
with ``seed`` right before it builds the initial model). Local backend, tiny runs."""

from __future__ import annotations

from pathlib import Path

import torch

import fedray
from fedray.tracking import Callback, read_metrics

REPO = Path(__file__).resolve().parents[2]


class InitialWeights(Callback):
    """Keeps the global weights the server holds before round 1."""

    weights: torch.Tensor | None = None

    def on_run_start(self, run):
        InitialWeights.weights = run.server.checkpoint_state()["server_state"]["weights"].clone()


def run(tmp_path: Path, name: str, algorithm: str, overrides: list[str]) -> tuple[Path, torch.Tensor]:
    config = fedray.load_config(
        REPO / "examples" / "fedavg_digits.yaml",
        [
            f"output.dir={tmp_path}",
            f"output.name={name}",
            "resources.backend=local",
            "resources.num_workers=1",
            "seed=7",
            "data.num_clients=8",
            "train.clients_per_round=3",
            "train.local_epochs=1",
            "train.rounds=3",
            "checkpoint.every=3",
            "output.tensorboard=false",
            "output.plots=false",
            f"algorithm.name={algorithm}",
            *overrides,
        ],
    )
    callback = InitialWeights()
    fedray.run_experiment(config, progress=False, extra_callbacks=[callback])
    return tmp_path / name, InitialWeights.weights


def cohorts(run_dir: Path) -> dict[int, list[int]]:
    """The clients that trained in each round, from the metrics' client rows."""
    by_round: dict[int, list[int]] = {}
    for row in read_metrics(run_dir, "client"):
        by_round.setdefault(int(row["round"]), []).append(int(row["client_id"]))
    return {round: sorted(ids) for round, ids in by_round.items()}


def test_the_same_seed_gives_fedavg_and_fedprox_the_same_cohorts_and_initial_weights(tmp_path):
    fedavg, fedavg_init = run(tmp_path, "fedavg", "fedavg", [])
    fedprox, fedprox_init = run(tmp_path, "fedprox", "fedprox", ["algorithm.mu=0.5"])
    assert sorted(cohorts(fedavg)) == [1, 2, 3]
    assert cohorts(fedavg) == cohorts(fedprox)
    assert torch.equal(fedavg_init, fedprox_init)
    # the runs did differ (the proximal term changed the training): what is equal is what the seed decides
    assert [r["train_loss"] for r in read_metrics(fedavg, "round")] != [r["train_loss"] for r in read_metrics(fedprox, "round")]
    # another seed draws other cohorts and other initial weights: the equality above is the seed's doing
    other, other_init = run(tmp_path, "seed8", "fedavg", ["seed=8"])
    assert cohorts(other) != cohorts(fedavg)
    assert not torch.equal(other_init, fedavg_init)


def test_the_same_seed_gives_the_same_data_order_fedprox_with_mu_0_is_fedavg_bit_for_bit(tmp_path):
    """FedProx with μ = 0 has FedAvg's objective: its clients' losses are FedAvg's exactly only if every
    client saw the same batches in the same order from the same weights."""
    fedavg, _ = run(tmp_path, "fedavg", "fedavg", [])
    fedprox, _ = run(tmp_path, "fedprox", "fedprox", ["algorithm.mu=0"])
    keys = ("round", "client_id", "train_loss")
    assert [{k: r[k] for k in keys} for r in read_metrics(fedavg, "client")] == [
        {k: r[k] for k in keys} for r in read_metrics(fedprox, "client")
    ]
    assert [r["test_accuracy"] for r in read_metrics(fedavg, "round")] == [r["test_accuracy"] for r in read_metrics(fedprox, "round")]


def test_the_same_seed_gives_the_same_clients_online_and_selected_under_availability(tmp_path):
    systems = ["systems.enabled=true", "systems.availability.process=bernoulli", "systems.availability.probability=0.3"]
    fedavg, _ = run(tmp_path, "fedavg", "fedavg", systems)
    fedprox, _ = run(tmp_path, "fedprox", "fedprox", [*systems, "algorithm.mu=0.5"])
    assert cohorts(fedavg) == cohorts(fedprox)
    selected = [(r["round"], r["selected"], r["aggregated"]) for r in read_metrics(fedavg, "round")]
    assert selected == [(r["round"], r["selected"], r["aggregated"]) for r in read_metrics(fedprox, "round")]
    # most clients are offline: fewer than 3 could be selected in some round, so availability did decide
    assert any(s < 3 for _, s, _ in selected)
