"""Ray-free tests of FedRep (personal head trained first with the body frozen, then the shared body
with the head frozen), through the real worker code in-process."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F

from fedray.algorithms.fedrep import trainable_only
from fedray.algorithms.local import local_train
from fedray import load_config
from fedray.data import build_federated_dataset
from fedray.models import get_flat_weights, num_flat_weights
from fedray.runtime.state_store import NO_STATE
from fedray.runtime.worker import ClientWorker

from fedray.testing import Federation
from test_personalized import TINY, simulate

REPO = Path(__file__).resolve().parents[2]


def _setup(overrides: list[str], run_dir: Path):
    config = load_config(None, TINY + ["algorithm.name=fedrep", *overrides])
    worker = ClientWorker(config.to_dict(), build_federated_dataset(config.data, config.seed), str(run_dir), use_gpu=False)
    torch.manual_seed(config.seed)
    theta_0 = worker.algorithm.build_model("global")
    return worker, worker.algorithm, worker.algorithm.broadcast(worker.algorithm.init_server_state(theta_0), 1)


def test_each_phase_changes_only_its_part(tmp_path):
    """Property (a): the head phase leaves φ bit-unchanged (no body epochs: the upload is φ^G), the
    body phase leaves h bit-unchanged (no head epochs: the stored head is π_0); each phase alone
    does move its own part."""
    worker, algorithm, broadcast = _setup(["algorithm.head_epochs=3"], tmp_path)
    ctx = worker.client_context(1, 0, NO_STATE)
    head_only = algorithm.client_update(replace(ctx, train=ctx.train.model_copy(update={"local_epochs": 0})), broadcast)
    phi = (head_only.sums["weights"] / head_only.sums["num_samples"]).float()
    assert torch.equal(phi, broadcast["weights"])
    assert not torch.equal(head_only.state["personal"], broadcast["initial_personal"])

    worker, algorithm, broadcast = _setup(["algorithm.head_epochs=0"], tmp_path)
    body_only = algorithm.client_update(worker.client_context(1, 0, NO_STATE), broadcast)
    assert torch.equal(body_only.state["personal"], broadcast["initial_personal"])
    assert not torch.equal((body_only.sums["weights"] / body_only.sums["num_samples"]).float(), broadcast["weights"])
    assert all(p.requires_grad for p in worker.model_for(0).parameters())  # the shared worker model is unfrozen again


def test_zero_head_epochs_is_fedper_with_a_frozen_head(tmp_path):
    """Property (b): ``head_epochs=0`` is FedPer's client step with the head excluded from training."""
    worker, algorithm, broadcast = _setup(["algorithm.head_epochs=0"], tmp_path)
    update = algorithm.client_update(worker.client_context(1, 4, NO_STATE), broadcast)
    ctx = worker.client_context(1, 4, NO_STATE)  # the same seeded generator again
    model = ctx.model
    algorithm.split.load(model, broadcast["weights"], broadcast["initial_personal"])
    body = [p for name, p in model.named_parameters() if name.startswith("encoder.")]
    with trainable_only(model, body):
        local_train(ctx, lambda x, y: (F.cross_entropy(model(x), y), {}), body)
    shared, personal = algorithm.split.read(model)
    assert torch.equal(update.sums["weights"], shared.double() * ctx.num_samples)
    assert torch.equal(update.state["personal"], personal)


def test_frozen_part_gets_no_gradient():
    """``trainable_only`` turns gradients off (not only out of the optimiser) and back on."""
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    with trainable_only(model, list(model[1].parameters())):
        model(torch.randn(5, 3)).sum().backward()
        assert model[0].weight.grad is None and model[1].weight.grad is not None
    assert all(p.requires_grad for p in model.parameters())


def test_head_never_reaches_the_server_and_one_client_gives_its_body(tmp_path):
    """Properties (c) and (d): the sums hold φ only (the encoder); with one client per round the new
    global φ is exactly that client's trained φ."""
    run = Federation(tmp_path, TINY + ["algorithm.name=fedrep", "algorithm.head_epochs=2", "train.clients_per_round=1"]).run(1)
    (client_id,) = run.results[0].client_metrics
    results = run.results[0]
    assert set(results.sums) == {"weights", "num_samples"}
    assert results.sums["weights"].numel() == num_flat_weights(run.initial_model, ("encoder.",))
    worker, algorithm, broadcast = _setup(["algorithm.head_epochs=2", "train.clients_per_round=1"], tmp_path / "again")
    ctx = worker.client_context(1, client_id, NO_STATE)
    update = algorithm.client_update(ctx, broadcast)
    assert torch.equal(run.state["weights"], algorithm.split.shared(get_flat_weights(ctx.model)))
    assert torch.equal(run.client_state(client_id)["personal"], update.state["personal"])


def test_fedrep_learns_personal_heads(tmp_path):
    """Two rounds on 2-class shards: each client's own head on the global body beats the global body
    with θ_0's head on the clients' own splits."""
    run = simulate(tmp_path, "fedrep", rounds=2, extra=["algorithm.head_epochs=2"])
    assert run.rows[-1]["personal_accuracy"] > 0.6
    assert all("head_train_loss" in m for m in run.results[-1].client_metrics.values())


def test_example_config_is_fedrep():
    config = load_config(REPO / "examples" / "fedrep_digits.yaml")
    assert config.algorithm.name == "fedrep" and config.eval.personalized and config.data.client_test_fraction > 0
