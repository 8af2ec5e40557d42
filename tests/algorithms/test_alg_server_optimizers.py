"""Server optimizers on the pseudo-gradient (FedAvgM, FedAdagrad, FedAdam, FedYogi), Ray-free:
the update rules against hand-computed steps, buffers, and the family on top of other algorithms."""

from __future__ import annotations

from functools import cache

import pytest
import torch

from fedray.algorithms import RoundResults, get_algorithm_class
from fedray.algorithms.base import weighted_mean
from fedray import load_config
from fedray.data import build_federated_dataset
from fedray.models.weights import parameter_mask


@cache
def digits_info():
    return build_federated_dataset(load_config().data, 0).info


def make_algorithm(*overrides: str, model: list[str] = ()):
    config = load_config(None, [*model, *overrides])
    return get_algorithm_class(config.algorithm.name)(config, digits_info())


def round_results(clients: list[tuple[torch.Tensor, float]]) -> RoundResults:
    """What the workers would reduce for clients uploading ``(y_k, n_k)``."""
    sums = {
        "weights": sum(y.double() * n for y, n in clients),
        "num_samples": torch.tensor(float(sum(n for _, n in clients)), dtype=torch.float64),
    }
    return RoundResults(sums=sums, payloads={}, client_metrics={}, num_clients=len(clients), excluded_clients=[])


def initial_state(algorithm):
    torch.manual_seed(0)
    return algorithm.init_server_state(algorithm.build_model("global"))


def random_round(x: torch.Tensor, seed: int) -> RoundResults:
    g = torch.Generator().manual_seed(seed)
    return round_results([(x + 0.1 * torch.randn(x.shape, generator=g), 3.0), (x + 0.1 * torch.randn(x.shape, generator=g), 5.0)])


def test_fedavgm_with_zero_momentum_and_unit_lr_is_fedavg():
    fedavg = make_algorithm("algorithm.name=fedavg")
    fedavgm = make_algorithm("algorithm.name=fedavgm", "algorithm.server_momentum=0", "algorithm.server_lr=1")
    state_avg, state_m = initial_state(fedavg), initial_state(fedavgm)
    for r in (1, 2, 3):
        results = random_round(state_avg["weights"], r)
        state_avg, _ = fedavg.aggregate(state_avg, r, results)
        state_m, _ = fedavgm.aggregate(state_m, r, results)
        assert torch.allclose(state_m["weights"], state_avg["weights"], atol=1e-7, rtol=0)
    assert torch.equal(state_avg["weights"], weighted_mean(results.sums))  # server_optimizer=none is the plain mean


def test_fedavgm_two_rounds_match_the_hand_computed_heavy_ball_steps():
    beta = 0.4
    algorithm = make_algorithm("algorithm.name=fedavgm", f"algorithm.server_momentum={beta}")
    x0 = initial_state(algorithm)
    first = random_round(x0["weights"], 1)
    x1, _ = algorithm.aggregate(x0, 1, first)
    delta1 = weighted_mean(first.sums).double() - x0["weights"].double()
    assert torch.allclose(x1["weights"].double(), x0["weights"].double() + delta1, atol=1e-6)
    second = random_round(x1["weights"], 2)
    x2, _ = algorithm.aggregate(x1, 2, second)
    delta2 = (second.sums["weights"] / second.sums["num_samples"]) - x1["weights"].double()
    assert torch.allclose(x2["weights"].double(), x1["weights"].double() + delta2 + beta * delta1, atol=1e-6)


def test_fedavgm_ema_form_scales_the_step_by_one_minus_beta():
    algorithm = make_algorithm("algorithm.name=fedavgm", "algorithm.server_momentum=0.7", "algorithm.server_momentum_form=ema")
    x0 = initial_state(algorithm)
    results = random_round(x0["weights"], 1)
    x1, _ = algorithm.aggregate(x0, 1, results)
    delta = results.sums["weights"] / results.sums["num_samples"] - x0["weights"].double()
    assert torch.allclose(x1["weights"].double(), x0["weights"].double() + 0.3 * delta, atol=1e-6)


def test_fedadam_first_step_matches_the_closed_form():
    lr, b1, b2, tau = 0.05, 0.9, 0.99, 1e-3
    algorithm = make_algorithm("algorithm.name=fedadam", f"algorithm.server_lr={lr}", f"algorithm.server_tau={tau}")
    x0 = initial_state(algorithm)
    results = random_round(x0["weights"], 1)
    x1, _ = algorithm.aggregate(x0, 1, results)
    delta = results.sums["weights"] / results.sums["num_samples"] - x0["weights"].double()
    expected = x0["weights"].double() + lr * (1 - b1) * delta / ((b2 * tau**2 + (1 - b2) * delta**2).sqrt() + tau)
    assert torch.allclose(x1["weights"].double(), expected, atol=1e-7)
    assert not torch.allclose(x1["weights"], weighted_mean(results.sums))


def test_adaptive_defaults_use_a_server_lr_of_0_01():
    assert make_algorithm("algorithm.name=fedyogi").params.effective_server_lr == 0.01
    assert make_algorithm("algorithm.name=fedavgm").params.effective_server_lr == 1.0


def test_adagrad_second_moment_never_decreases():
    algorithm = make_algorithm("algorithm.name=fedadagrad")
    state = initial_state(algorithm)
    assert torch.allclose(state["server_v"], torch.full_like(state["server_v"], 1e-6))  # v₋₁ = τ²
    for r in (1, 2, 3):
        previous = state["server_v"]
        state, _ = algorithm.aggregate(state, r, random_round(state["weights"], r))
        assert bool((state["server_v"] >= previous).all())


def test_yogi_second_moment_stays_positive_and_moves_toward_delta_squared():
    algorithm = make_algorithm("algorithm.name=fedyogi", "algorithm.server_tau=0.05")
    state = initial_state(algorithm)
    for r in (1, 2, 3):
        x, v = state["weights"].double(), state["server_v"]
        results = random_round(state["weights"], r)
        squared = (results.sums["weights"] / results.sums["num_samples"] - x) ** 2
        state, _ = algorithm.aggregate(state, r, results)
        new_v = state["server_v"]
        assert bool((new_v > 0).all())
        assert bool((new_v[v > squared] < v[v > squared]).all())
        assert bool((new_v[v < squared] > v[v < squared]).all())
        assert bool((v > squared).any()) and bool((v < squared).any())  # both branches were exercised


@pytest.mark.parametrize("name", ["fedavg", "fedavgm", "fedadagrad", "fedadam", "fedyogi"])
def test_buffers_take_the_weighted_mean_under_every_optimizer(name):
    resnet = ["model.name=resnet8", "model.norm=batch"]
    algorithm = make_algorithm(f"algorithm.name={name}", "algorithm.server_lr=0.5", model=resnet)
    state = initial_state(algorithm)
    mask = parameter_mask(algorithm.build_model("global"))
    assert bool((~mask).any())  # BatchNorm running statistics are in the flat layout
    for r in (1, 2):
        results = random_round(state["weights"], r)
        state, _ = algorithm.aggregate(state, r, results)
        mean = weighted_mean(results.sums)
        assert torch.equal(state["weights"][~mask], mean[~mask])
        assert not torch.allclose(state["weights"][mask], mean[mask])  # the parameters took a server step
        assert set(algorithm.broadcast(state, r + 1)) == {"weights"}  # moments stay on the server
        assert all(state[k].numel() == int(mask.sum()) for k in state if k.startswith("server_"))


@pytest.mark.parametrize("name", ["fedprox", "fedrcl"])
def test_the_family_applies_on_top_of_other_weighted_mean_algorithms(name):
    plain = make_algorithm(f"algorithm.name={name}")
    adam = make_algorithm(f"algorithm.name={name}", "algorithm.server_optimizer=adam")
    state = initial_state(adam)
    assert {"server_m", "server_v"} <= set(state)
    results = random_round(state["weights"], 1)
    new, _ = adam.aggregate(state, 1, results)
    expected, _ = make_algorithm("algorithm.name=fedadam").aggregate(state, 1, results)
    assert torch.equal(new["weights"], expected["weights"])
    assert torch.equal(plain.aggregate(initial_state(plain), 1, results)[0]["weights"], weighted_mean(results.sums))


def test_a_fixed_optimizer_name_rejects_another_optimizer():
    with pytest.raises(ValueError, match="algorithm.server_optimizer"):
        load_config(None, ["algorithm.name=fedavgm", "algorithm.server_optimizer=adam"])
