"""SCAFFOLD (option II), Ray-free: round 1 is FedAvg, the server rule, c = mean of the stored c_i,
c_i⁺ = mean raw gradient along the local steps, no control variates on buffers."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fedray.algorithms import RoundResults
from fedray.algorithms.scaffold import effective_local_steps
from fedray.config import ConfigError
from fedray import load_config
from fedray.models import set_flat_weights
from fedray.models.weights import parameter_mask, parameter_views

from fedray.testing import Federation


def test_round_one_equals_fedavg(tmp_path):
    scaffold = Federation(tmp_path / "s", ["algorithm.name=scaffold"])
    fedavg = Federation(tmp_path / "a", ["algorithm.name=fedavg"])
    assert torch.equal(scaffold.state["weights"], fedavg.state["weights"])
    scaffold.run_round(1, [0, 2, 5])
    fedavg.run_round(1, [0, 2, 5])
    assert torch.allclose(scaffold.state["weights"], fedavg.state["weights"], atol=1e-6, rtol=0)
    assert scaffold.state["control"].abs().sum() > 0


def test_server_step_is_server_lr_times_the_mean_displacement(tmp_path):
    federation = Federation(tmp_path, ["algorithm.name=scaffold", "algorithm.server_lr=0.5"])
    x = federation.state["weights"]
    y = x + torch.randn(x.shape, generator=torch.Generator().manual_seed(0))
    sums = {
        "weights": 4.0 * y.double(),
        "num_samples": torch.tensor(4.0, dtype=torch.float64),
        "delta_control": torch.zeros(x.shape, dtype=torch.float64),
    }
    new, _ = federation.algorithm.aggregate(federation.state, 1, RoundResults(sums, {}, {}, 1, []))
    assert torch.allclose(new["weights"] - x, 0.5 * (y - x), atol=1e-6)


def test_server_control_is_the_mean_of_every_stored_client_control(tmp_path):
    federation = Federation(tmp_path, ["algorithm.name=scaffold"])
    for round, clients in enumerate([[0, 1, 2], [1, 3, 4], [0, 4, 5]], start=1):
        federation.run_round(round, clients)
        stored = [federation.client_state(cid) for cid in range(federation.num_clients)]
        total = sum(s["control"] for s in stored if s is not None)
        expected = total / federation.num_clients  # clients that never trained count as zeros
        assert torch.allclose(federation.state["control"], expected, atol=1e-6)
    assert federation.client_state(2) is not None and federation.versions[2] == 1  # kept since round 1


def test_new_client_control_is_the_mean_raw_gradient_along_the_local_steps(tmp_path):
    federation = Federation(tmp_path, ["algorithm.name=scaffold", "train.local_epochs=2", "train.lr=0.05"])
    algorithm, worker = federation.algorithm, federation.worker
    model = worker.model_for(1)
    x = federation.state["weights"]
    mask = parameter_mask(model)
    g = torch.Generator().manual_seed(1)
    control = torch.where(mask, 0.01 * torch.randn(x.shape, generator=g), 0.0)
    own_control = torch.where(mask, 0.01 * torch.randn(x.shape, generator=g), 0.0)
    ctx = worker.client_context(1, 1, -1)
    ctx.state = {"control": own_control}
    update = algorithm.client_update(ctx, {"weights": x, "control": control})

    replay = worker.client_context(1, 1, -1)  # the same seeded batch sequence
    set_flat_weights(model, x)
    parameters = list(model.parameters())
    correction = parameter_views(model, control - own_control)
    gradient_sum = [torch.zeros_like(p) for p in parameters]
    steps = 0
    for inputs, labels in replay.batches():
        grads = torch.autograd.grad(F.cross_entropy(model(inputs), labels), parameters)
        with torch.no_grad():
            for p, grad, d, total in zip(parameters, grads, correction, gradient_sum):
                total += grad
                p -= replay.lr * (grad + d)
        steps += 1
    mean_gradient = torch.cat([(total / steps).flatten() for total in gradient_sum])
    assert torch.allclose(update.state["control"], mean_gradient, atol=1e-4)
    assert torch.allclose(update.sums["delta_control"].float(), update.state["control"] - own_control)


@pytest.mark.parametrize("momentum, steps", [(0.0, 7), (0.9, 7), (0.5, 30)])
def test_effective_steps_match_heavy_ball_displacement_under_a_constant_gradient(momentum, steps):
    weight = torch.zeros(1, requires_grad=True)
    optimizer = torch.optim.SGD([weight], lr=0.1, momentum=momentum)
    for _ in range(steps):
        optimizer.zero_grad()
        weight.sum().backward()  # gradient 1
        optimizer.step()
    assert float(-weight.detach()) / 0.1 == pytest.approx(effective_local_steps(steps, momentum), rel=1e-5)


def test_control_variates_are_zero_at_buffers(tmp_path):
    federation = Federation(tmp_path, ["algorithm.name=scaffold", "model.name=resnet8", "model.norm=batch", "data.num_clients=10"])
    federation.run_round(1, [0])
    mask = parameter_mask(federation.worker.model_for(None))
    assert bool((~mask).any())
    for control in (federation.client_state(0)["control"], federation.state["control"]):
        assert bool((control[~mask] == 0).all()) and bool((control[mask] != 0).any())


def test_adam_clients_are_refused():
    with pytest.raises(ConfigError, match="train.optimizer"):
        from fedray.algorithms import get_algorithm_class
        from fedray.data import build_federated_dataset

        config = load_config(None, ["algorithm.name=scaffold", "train.optimizer=adam"])
        get_algorithm_class("scaffold")(config, build_federated_dataset(config.data, 0).info)


def test_the_reported_loss_starts_at_the_cross_entropy(tmp_path):
    # the linear term is measured from the round's weights x: ⟨c − c_i, y − x⟩ is 0 while y stays at x
    federation = Federation(tmp_path, ["algorithm.name=scaffold", "train.lr=1e-9"])
    x = federation.state["weights"]
    control = torch.where(
        parameter_mask(federation.worker.model_for(1)), torch.randn(x.shape, generator=torch.Generator().manual_seed(2)), 0.0
    )
    update = federation.algorithm.client_update(federation.worker.client_context(1, 1, -1), {"weights": x, "control": control})
    assert abs(float((control * x).sum())) > 1.0  # what ⟨c − c_i, y⟩ would add to every step's loss
    assert update.metrics["train_loss"] == pytest.approx(update.metrics["ce"], abs=1e-4)
