"""FedAvg and FedProx, Ray-free: aggregation maths and the local objective."""

from __future__ import annotations

import torch

from fedray.algorithms import RoundResults, get_algorithm_class
from fedray.algorithms.base import ClientUpdate, weighted_weights_sums
from fedray import load_config
from fedray.data import build_federated_dataset
from fedray.models import build_model, get_flat_weights, set_flat_weights
from fedray.runtime.reduction import PartialResult, merge_partials
from fedray.runtime.worker import ClientWorker


def results_of(updates: list[tuple[int, ClientUpdate]]) -> RoundResults:
    partial = PartialResult()
    for client_id, update in updates:
        partial.add(client_id, update)
    return merge_partials([partial])


def make_worker(tmp_path, overrides: list[str]) -> ClientWorker:
    config = load_config(None, ["data.num_clients=6", "train.clients_per_round=3", "train.local_epochs=1"] + overrides)
    data = build_federated_dataset(config.data, config.seed)
    return ClientWorker(config.to_dict(), data, str(tmp_path), use_gpu=False)


def test_fedavg_of_identical_models_is_that_model():
    config = load_config()
    info = build_federated_dataset(config.data, 0).info
    model = build_model(config.model, info)
    results = results_of([(k, ClientUpdate(sums=weighted_weights_sums(model, n))) for k, n in enumerate([3, 50, 7])])
    algorithm = get_algorithm_class("fedavg")(config, info)
    new_state, _ = algorithm.aggregate({"weights": torch.zeros(1)}, 1, results)
    assert torch.allclose(new_state["weights"], get_flat_weights(model), atol=1e-7)


def test_fedavg_is_the_sample_weighted_mean():
    config = load_config()
    info = build_federated_dataset(config.data, 0).info
    first, second = build_model(config.model, info), build_model(config.model, info)
    set_flat_weights(second, get_flat_weights(second) + 1.0)
    results = results_of(
        [(0, ClientUpdate(sums=weighted_weights_sums(first, 1))), (1, ClientUpdate(sums=weighted_weights_sums(second, 3)))]
    )
    new_state, _ = get_algorithm_class("fedavg")(config, info).aggregate({}, 1, results)
    expected = (get_flat_weights(first).double() + 3 * get_flat_weights(second).double()) / 4
    assert torch.allclose(new_state["weights"].double(), expected, atol=1e-6)


def client_result(worker: ClientWorker, broadcast: dict) -> torch.Tensor:
    update = worker.algorithm.client_update(worker.client_context(1, 2, -1), broadcast)
    return update.sums["weights"] / update.sums["num_samples"]


def test_fedprox_with_mu_zero_equals_fedavg(tmp_path):
    fedavg = make_worker(tmp_path, [])
    fedprox = make_worker(tmp_path, ["algorithm.name=fedprox", "algorithm.mu=0"])
    torch.manual_seed(0)
    broadcast = {"weights": get_flat_weights(fedavg.model_for(None))}
    assert torch.equal(client_result(fedavg, broadcast), client_result(fedprox, broadcast))


def test_fedprox_pulls_the_local_model_towards_the_global_one(tmp_path):
    fedavg = make_worker(tmp_path, ["train.lr=0.2", "train.local_epochs=3"])
    fedprox = make_worker(tmp_path, ["train.lr=0.2", "train.local_epochs=3", "algorithm.name=fedprox", "algorithm.mu=5"])
    torch.manual_seed(0)
    global_weights = get_flat_weights(fedavg.model_for(None))
    broadcast = {"weights": global_weights}
    drift_fedavg = (client_result(fedavg, broadcast).float() - global_weights).norm()
    drift_fedprox = (client_result(fedprox, broadcast).float() - global_weights).norm()
    assert 0 < drift_fedprox < drift_fedavg


def test_a_client_update_is_reproducible_on_another_worker(tmp_path):
    first, second = make_worker(tmp_path, []), make_worker(tmp_path, [])
    torch.manual_seed(0)
    broadcast = {"weights": get_flat_weights(first.model_for(None))}
    client_result(second, broadcast)  # a different history on the second worker must not matter
    assert torch.equal(client_result(first, broadcast), client_result(second, broadcast))
