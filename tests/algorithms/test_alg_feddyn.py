"""FedDyn, Ray-free: round 1 is FedProx with μ = α, the server's θ¹ = 2θ̄ − θ⁰, S = Σ λ_k, the
linear term's gradient and the λ_k update."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fedray.models import get_flat_weights, set_flat_weights
from fedray.models.weights import parameter_mask

from fedray.testing import Federation


def client_model(federation: Federation, client: int, broadcast: dict, state=None) -> tuple[torch.Tensor, object]:
    ctx = federation.worker.client_context(1, client, -1)
    ctx.state = state
    update = federation.algorithm.client_update(ctx, broadcast)
    return (update.sums["weights"] / update.sums["num_samples"]).float(), update


def test_round_one_clients_equal_fedprox_with_mu_alpha(tmp_path):
    alpha = 0.5
    feddyn = Federation(tmp_path / "dyn", ["algorithm.name=feddyn", f"algorithm.dyn_alpha={alpha}", "algorithm.alpha_scaling=none"])
    fedprox = Federation(tmp_path / "prox", ["algorithm.name=fedprox", f"algorithm.mu={alpha}"])
    broadcast = {"weights": fedprox.state["weights"]}
    for client in (0, 3):
        dyn, _ = client_model(feddyn, client, feddyn.algorithm.broadcast(feddyn.state, 1))
        prox, _ = client_model(fedprox, client, broadcast)
        assert torch.allclose(dyn, prox, atol=1e-6)


def test_full_participation_round_one_gives_twice_the_average_minus_the_start(tmp_path):
    federation = Federation(tmp_path, ["algorithm.name=feddyn", "data.num_clients=3", "train.clients_per_round=3"])
    start = federation.state["weights"]
    federation.run_round(1, [0, 1, 2])
    average = federation.state["average"]
    assert not torch.allclose(average, start)
    assert torch.allclose(federation.state["weights"], 2 * average - start, atol=1e-6)


def test_lambda_sum_is_the_sum_of_every_stored_lambda(tmp_path):
    federation = Federation(tmp_path, ["algorithm.name=feddyn", "algorithm.dyn_alpha=0.1"])
    for round, clients in enumerate([[0, 1, 2], [1, 3, 4], [0, 4, 5]], start=1):
        federation.run_round(round, clients)
        stored = [federation.client_state(cid) for cid in range(federation.num_clients)]
        total = sum(s["lambda"].double() for s in stored if s is not None)
        assert torch.allclose(federation.state["lambda_sum"], total, atol=1e-5)


def test_the_linear_term_adds_alpha_k_lambda_to_the_gradient(tmp_path):
    federation = Federation(tmp_path, ["algorithm.name=feddyn", "algorithm.dyn_alpha=0.3"])
    ctx = federation.worker.client_context(1, 2, -1)
    model, weights = ctx.model, federation.state["weights"]
    set_flat_weights(model, weights)
    mask = parameter_mask(model)
    lam = torch.where(mask, torch.randn(weights.shape, generator=torch.Generator().manual_seed(0)), 0.0)
    alpha_k = federation.algorithm.client_alpha(ctx)
    assert alpha_k == pytest.approx(0.3 * ctx.mean_client_samples / ctx.num_samples)
    x, y = next(ctx.batches())
    loss, _ = federation.algorithm.local_loss(ctx, lam, alpha_k)(x, y)  # at θ = θ^{t−1}: no proximal gradient
    full = torch.cat([g.flatten() for g in torch.autograd.grad(loss, list(model.parameters()))])
    ce = torch.cat([g.flatten() for g in torch.autograd.grad(F.cross_entropy(model(x), y), list(model.parameters()))])
    assert torch.allclose(full - ce, alpha_k * lam[mask], atol=1e-6)
    # measured from θ^{t−1}, the linear and proximal terms are 0 there: the reported loss is the CE
    assert torch.allclose(loss, F.cross_entropy(model(x), y), atol=1e-6)


def test_lambda_update_adds_the_client_displacement(tmp_path):
    federation = Federation(tmp_path, ["algorithm.name=feddyn"])
    broadcast = federation.algorithm.broadcast(federation.state, 1)
    mask = parameter_mask(federation.worker.model_for(None))
    before = torch.where(mask, 0.01 * torch.randn(mask.shape, generator=torch.Generator().manual_seed(1)), 0.0)
    trained, update = client_model(federation, 4, broadcast, state={"lambda": before})
    assert torch.allclose(update.state["lambda"], before + (trained - broadcast["weights"]), atol=1e-6)


def test_evaluation_uses_the_average_or_the_server_model(tmp_path):
    for eval_model, key in (("average", "average"), ("server", "weights")):
        federation = Federation(tmp_path / eval_model, ["algorithm.name=feddyn", f"algorithm.eval_model={eval_model}"])
        federation.run_round(1, [0, 1])
        model = federation.worker.model_for(None)
        federation.algorithm.load_global_model(model, federation.algorithm.broadcast(federation.state, 2))
        assert torch.equal(get_flat_weights(model), federation.state[key])
