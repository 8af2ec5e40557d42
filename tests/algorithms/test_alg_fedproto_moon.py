"""The FedProto and MOON baselines: losses, server rules, inference and client state, without Ray."""

from __future__ import annotations

import math

import pytest
import torch

from fedray.algorithms.base import ClientUpdate
from fedray.algorithms.fedproto import nearest_prototype_logits
from fedray.algorithms.losses import model_contrastive_loss
from fedray.algorithms.moon import MOON, PREVIOUS_MODEL
from fedray.algorithms.requirements import PROJECTION_HEAD
from fedray.config import ConfigError
from fedray import load_config
from fedray.models import get_flat_weights, num_flat_weights
from test_alg_fedsc import context, global_accuracy, initial_model, results_of, setup, simulate

# ----------------------------------------------------------------------------- FedProto


def test_global_prototypes_are_class_count_weighted_means():
    _, _, fedproto = setup("fedproto")

    def update(sums: torch.Tensor, counts: list[float]) -> ClientUpdate:
        return ClientUpdate(
            sums={"weights": torch.zeros(3), "num_samples": torch.tensor(1.0), "class_sums": sums, "class_counts": torch.tensor(counts)}
        )

    # client 0: class 0 mean (1, 0) from 1 sample; client 1: class 0 mean (4, 3) from 3 samples, class 2 mean (2, 2)
    updates = {
        0: update(torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 0.0]]), [1, 0, 0]),
        1: update(torch.tensor([[12.0, 9.0], [0.0, 0.0], [4.0, 4.0]]), [3, 0, 2]),
    }
    state, metrics = fedproto.aggregate({}, 1, results_of(updates))
    assert torch.allclose(state["prototypes"], torch.tensor([[13 / 4, 9 / 4], [0.0, 0.0], [2.0, 2.0]]))
    assert state["prototype_present"].tolist() == [True, False, True]
    assert metrics["prototype_classes"] == 2.0


def test_client_uploads_class_feature_sums_of_the_final_model():
    _, data, fedproto = setup("fedproto")
    model = initial_model(fedproto)
    update = fedproto.client_update(context(fedproto, data, model, 0, 1), fedproto.broadcast(fedproto.init_server_state(model), 1))
    ctx = context(fedproto, data, model, 0, 1)
    model.eval()
    with torch.no_grad():
        features = model.encode(data.info.normalize(ctx.x)).double()
    assert torch.equal(update.sums["class_counts"], torch.bincount(ctx.y, minlength=10).double())
    expected = torch.zeros(10, 64, dtype=torch.float64).index_add_(0, ctx.y, features)
    assert torch.allclose(update.sums["class_sums"].double(), expected, atol=1e-4)


def test_nearest_prototype_inference_picks_the_nearest_present_class():
    prototypes = torch.tensor([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    features = torch.tensor([[1.0, 1.0], [9.0, 1.0], [1.0, 8.0], [0.0, 9.0]])
    assert nearest_prototype_logits(features, prototypes, torch.tensor([True, True, True])).argmax(1).tolist() == [0, 1, 2, 2]
    absent = nearest_prototype_logits(features, prototypes, torch.tensor([True, True, False]))
    assert absent.argmax(1).tolist() == [0, 1, 0, 0] and (absent[:, 2] == float("-inf")).all()


def test_inference_switch_changes_predict():
    _, data, classifier = setup("fedproto")
    _, _, nearest = setup("fedproto", "algorithm.inference=nearest_prototype")
    history = simulate(classifier, data, rounds=2)
    model = initial_model(classifier)
    broadcast = classifier.broadcast(history[-1], 3)
    classifier.load_global_model(model, broadcast)
    x = data.info.normalize(torch.as_tensor(data.test.x[:64]))
    model.eval()
    with torch.no_grad():
        assert torch.equal(classifier.predict(model, x, broadcast), model(x))
        expected = nearest_prototype_logits(model.encode(x), broadcast["prototypes"], broadcast["prototype_present"])
        assert torch.equal(nearest.predict(model, x, broadcast), expected)
    assert global_accuracy(nearest, data, history[-1], 2) > 0.3  # prototypes of the global model's features are usable


def test_fedproto_with_zero_weight_is_fedavg_and_the_alignment_matters():
    _, data, fedavg = setup("fedavg")
    reference = simulate(fedavg, data, rounds=2)
    _, _, off = setup("fedproto", "algorithm.mu=0")
    assert torch.equal(simulate(off, data, rounds=2)[-1]["weights"], reference[-1]["weights"])
    _, _, on = setup("fedproto", "algorithm.mu=1")
    history = simulate(on, data, rounds=2)
    assert torch.equal(history[0]["weights"], reference[0]["weights"])  # round 1: no prototypes yet
    assert not torch.equal(history[1]["weights"], reference[1]["weights"])


def test_fedproto_alignment_skips_classes_without_global_prototype():
    _, data, fedproto = setup("fedproto")
    model = initial_model(fedproto)
    state = fedproto.init_server_state(model)
    state["prototype_present"][:] = True
    state["prototype_present"][1] = False
    update = fedproto.client_update(context(fedproto, data, model, 0, 2), fedproto.broadcast(state, 2))
    assert math.isfinite(update.metrics["prototype_loss"]) and torch.isfinite(update.sums["weights"]).all()


def test_fedproto_alignment_is_normalised_by_the_whole_batch(monkeypatch):
    """FedProto's and PFLlib's code: λ · MSE over the whole batch, a prototype-less sample counting as a
    zero residual, i.e. λ·Σ_kept ‖f − p‖² / (B·d), not / (kept·d)."""
    import fedray.algorithms.fedproto as fedproto_module

    _, data, fedproto = setup("fedproto", "algorithm.mu=0.5")
    model = initial_model(fedproto)
    state = fedproto.init_server_state(model)
    torch.manual_seed(0)
    state["prototypes"] = torch.randn_like(state["prototypes"])
    state["prototype_present"][:] = True
    state["prototype_present"][1] = False
    captured = {}

    def capture(ctx, loss_fn, *args, **kwargs):
        captured["loss_fn"] = loss_fn
        return {}

    monkeypatch.setattr(fedproto_module, "local_train", capture)
    fedproto.client_update(context(fedproto, data, model, 0, 2), fedproto.broadcast(state, 2))
    x, y = data.info.normalize(torch.as_tensor(data.train.x)[:32]), torch.as_tensor(data.train.y)[:32].clone()
    y[:5] = 1  # a class without a global prototype
    assert 0 < int((y != 1).sum()) < len(y)
    model.eval()
    with torch.no_grad():
        loss, terms = captured["loss_fn"](x, y)
        features = model.encode(x)
        ce = torch.nn.functional.cross_entropy(model.classify(features), y)
        kept = y != 1
        squared = (features[kept] - state["prototypes"][y[kept]]).pow(2).sum()
        batch, dim = features.shape
    assert torch.allclose(terms["prototype_loss"], squared / (batch * dim))
    assert torch.allclose(loss, ce + 0.5 * squared / (batch * dim))
    assert not torch.allclose(terms["prototype_loss"], squared / (int(kept.sum()) * dim))  # the old normalisation


def test_fedproto_alignment_has_no_gradient_for_samples_without_prototype():
    from fedray.algorithms.fedproto import prototype_alignment

    features = torch.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    prototypes = torch.tensor([[0.0, 0.0], [9.0, 9.0]], requires_grad=True)
    loss = prototype_alignment(features, torch.tensor([0, 1]), prototypes, torch.tensor([True, False]))
    assert loss.item() == pytest.approx((1 + 4) / 4)
    loss.backward()
    assert features.grad.tolist() == [[2 * 1 / 4, 2 * 2 / 4], [0.0, 0.0]]
    assert prototypes.grad is None


# ----------------------------------------------------------------------------- MOON


def test_model_contrastive_loss_by_hand():
    z = torch.tensor([[1.0, 0.0]], requires_grad=True)
    z_global, z_previous = torch.tensor([[1.0, 1.0]]), torch.tensor([[0.0, 1.0]])
    loss = model_contrastive_loss(z, z_global, z_previous, 0.5)
    positive, negative = (1 / math.sqrt(2)) / 0.5, 0.0
    assert float(loss.detach()) == pytest.approx(-math.log(math.exp(positive) / (math.exp(positive) + math.exp(negative))), abs=1e-6)
    loss.backward()
    assert torch.isfinite(z.grad).all()
    assert float(model_contrastive_loss(z.detach(), z_global, None, 0.5)) == 0.0  # first participation: no negative
    assert float(model_contrastive_loss(z.detach(), z, -z, 0.5)) < float(model_contrastive_loss(z.detach(), -z, z, 0.5))


def test_moon_requires_a_projection_head():
    from fedray.runtime.experiment import prepare_data

    assert PROJECTION_HEAD in MOON.requires
    config = load_config(None, ["algorithm.name=moon"])  # no model.projection_dim
    with pytest.raises(ConfigError, match="model.projection_dim: moon needs a projection head"):
        prepare_data(config)
    prepare_data(load_config(None, ["algorithm.name=moon", "model.projection_dim=16"]))


def test_moon_stores_the_representation_part_of_the_local_model_as_client_state():
    _, data, moon = setup("moon", "model.projection_dim=16")
    model = initial_model(moon)
    update = moon.client_update(context(moon, data, model, 3, 1), moon.broadcast(moon.init_server_state(model), 1))
    stored = update.state[PREVIOUS_MODEL]
    assert stored.numel() == num_flat_weights(model, ("encoder.", "projector.")) < num_flat_weights(model)
    assert torch.equal(stored, get_flat_weights(model, ("encoder.", "projector.")))
    assert update.metrics["contrastive"] == 0.0  # no previous model yet


def test_moon_uses_the_previous_model_from_client_state():
    _, data, moon = setup("moon", "model.projection_dim=16")
    history = simulate(moon, data, rounds=1, clients=(0,))
    model = initial_model(moon)
    first = moon.client_update(context(moon, data, model, 0, 1), moon.broadcast(moon.init_server_state(model), 1))
    broadcast = moon.broadcast(history[0], 2)
    without = moon.client_update(context(moon, data, model, 0, 2), broadcast)
    with_state = moon.client_update(context(moon, data, model, 0, 2, state=first.state), broadcast)
    again = moon.client_update(context(moon, data, model, 0, 2, state=first.state), broadcast)
    assert with_state.metrics["contrastive"] > 0
    assert not torch.equal(with_state.sums["weights"], without.sums["weights"])
    assert torch.equal(with_state.sums["weights"], again.sums["weights"])  # the cached frozen copies change nothing


def test_moon_with_zero_weight_is_fedavg():
    _, data, fedavg = setup("fedavg", "model.projection_dim=16")
    _, _, moon = setup("moon", "model.projection_dim=16", "algorithm.mu=0")
    assert torch.equal(simulate(moon, data, rounds=2)[-1]["weights"], simulate(fedavg, data, rounds=2)[-1]["weights"])
    _, _, on = setup("moon", "model.projection_dim=16", "algorithm.mu=1")
    assert not torch.equal(simulate(on, data, rounds=2)[-1]["weights"], simulate(fedavg, data, rounds=2)[-1]["weights"])
