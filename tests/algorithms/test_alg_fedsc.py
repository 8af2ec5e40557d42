"""FedSC (docs/algorithms_prototypes.md): server maths against hand-computed cases, the properties
of the client losses, and the client step on digits without Ray.

The Ray-free helpers at the top (``setup``, ``context``, ``simulate``) are reused by the FedSKC and
FedProto/MOON tests.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fedray.algorithms import ClientContext, get_algorithm_class
from fedray.algorithms.base import Algorithm, ClientUpdate, RoundResults, evaluation_sums
from fedray.algorithms.fedsc import (
    angles_to_global,
    consistent_prototype,
    discrepancy_weights,
    label_discrepancy,
    merge_with_neighbours,
    relational_prototypes,
)
from fedray.algorithms.losses import (
    distance_scale,
    prototype_contrastive_loss,
    prototype_distance,
    single_mean_positive_contrastive_loss,
)
from fedray import load_config
from fedray.config import ConfigError, RunConfig
from fedray.data import FederatedDataset, build_federated_dataset, get_augmentation
from fedray.models import FedModel
from fedray.runtime.reduction import PartialResult, merge_partials
from fedray.seeding import seed_client

# ----------------------------------------------------------------------------- Ray-free harness


def setup(name: str, *overrides: str, num_clients: int = 6) -> tuple[RunConfig, FederatedDataset, Algorithm]:
    """A digits config for ``name`` (1 local epoch, 4 clients per round), its data and algorithm."""
    config = load_config(
        None, [f"algorithm.name={name}", f"data.num_clients={num_clients}", "train.clients_per_round=4", "train.local_epochs=1", *overrides]
    )
    data = build_federated_dataset(config.data, config.seed)
    return config, data, get_algorithm_class(name)(config, data.info)


def initial_model(algorithm: Algorithm) -> FedModel:
    torch.manual_seed(algorithm.config.seed)  # as the server does
    return algorithm.build_model("global")


def context(
    algorithm: Algorithm,
    data: FederatedDataset,
    model: FedModel,
    client_id: int,
    round: int,
    state: dict | None = None,
    index: torch.Tensor | None = None,
) -> ClientContext:
    """What a worker would give client ``client_id`` (``index`` overrides its training indices)."""
    index = torch.as_tensor(data.clients.client(client_id)) if index is None else index
    return ClientContext(
        client_id=client_id,
        round=round,
        model=model,
        x=torch.as_tensor(data.train.x)[index],
        y=torch.as_tensor(data.train.y)[index],
        info=data.info,
        train=algorithm.config.train,
        lr=algorithm.config.train.lr,
        device=torch.device("cpu"),
        generator=seed_client(algorithm.config.seed, round, client_id),
        augment=get_augmentation("none"),
        state=state,
    )


def results_of(updates: dict[int, ClientUpdate]) -> RoundResults:
    partial = PartialResult()
    for client_id in sorted(updates):
        partial.add(client_id, updates[client_id])
    return merge_partials([partial.to_cpu()])


def simulate(algorithm: Algorithm, data: FederatedDataset, rounds: int, clients: tuple[int, ...] = (0, 1, 2, 3)) -> list[dict]:
    """Server states after each round, with every client in every round (states kept per client)."""
    model = initial_model(algorithm)
    server_state = algorithm.init_server_state(model)
    client_states: dict[int, dict | None] = {}
    history = []
    for round in range(1, rounds + 1):
        broadcast = algorithm.broadcast(server_state, round)
        updates = {}
        for cid in clients:
            updates[cid] = algorithm.client_update(context(algorithm, data, model, cid, round, client_states.get(cid)), broadcast)
            if updates[cid].state is not None:
                client_states[cid] = updates[cid].state
        server_state, _ = algorithm.aggregate(server_state, round, results_of(updates))
        history.append(server_state)
    return history


def global_accuracy(algorithm: Algorithm, data: FederatedDataset, server_state: dict, round: int) -> float:
    model = initial_model(algorithm)
    broadcast = algorithm.broadcast(server_state, round + 1)
    algorithm.load_global_model(model, broadcast)
    sums = evaluation_sums(algorithm, model, broadcast, torch.as_tensor(data.test.x), torch.as_tensor(data.test.y), 512)
    return sums["correct"] / sums["count"]


def naive_rpcl(
    z: torch.Tensor, y: torch.Tensor, protos: torch.Tensor, classes: torch.Tensor, tau: float, scale: torch.Tensor
) -> torch.Tensor:
    """Eq. 14 as a double loop in float64."""
    losses = []
    for i in range(z.shape[0]):
        if not (classes == y[i]).any():
            continue
        numerator = denominator = 0.0
        for p in range(protos.shape[0]):
            cos = float(z[i] @ protos[p]) / (float(z[i].norm() * protos[p].norm()) + 1e-8)
            term = math.exp(cos / float(scale[p]) / tau)
            denominator += term
            numerator += term if classes[p] == y[i] else 0.0
        losses.append(-math.log(numerator / denominator))
    return torch.tensor(sum(losses) / len(losses), dtype=torch.float64)


# ----------------------------------------------------------------------------- server: relational prototypes

# Three clients' class prototypes: g = (2/3, 2/3); φ = (1/√2, 1/√2, 1).
HAND_PROTOTYPES = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=torch.float64)


def test_angles_to_the_plain_global_prototype_by_hand():
    phi = angles_to_global(HAND_PROTOTYPES)
    assert torch.allclose(phi, torch.tensor([1 / math.sqrt(2), 1 / math.sqrt(2), 1.0], dtype=torch.float64), atol=1e-7)


def test_relational_prototypes_merge_angle_neighbours_by_hand():
    # clients 0 and 1 have equal φ, so they pick each other; client 2 is 0.29 from both: tie → lower id (0)
    relational = relational_prototypes(HAND_PROTOTYPES, num_neighbors=1)
    assert torch.allclose(relational, torch.tensor([[0.5, 0.5], [0.5, 0.5], [1.0, 0.5]], dtype=torch.float64))


def test_phi_lies_in_minus_one_one_and_is_scale_invariant():
    prototypes = torch.randn(7, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    phi = angles_to_global(prototypes)
    assert ((phi >= -1) & (phi <= 1)).all()
    assert torch.allclose(angles_to_global(3.5 * prototypes), phi)  # g scales with them


@pytest.mark.parametrize("num_neighbors", [0, 1, 2, 3, 10])
def test_adjacency_rows_have_m_plus_one_ones_with_the_diagonal(num_neighbors):
    prototypes = torch.randn(5, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    phi = angles_to_global(prototypes)
    _, adjacency = merge_with_neighbours(prototypes, (phi[:, None] - phi[None, :]).abs(), num_neighbors)
    assert torch.equal(adjacency.sum(dim=1), torch.full((5,), float(min(num_neighbors, 4) + 1), dtype=torch.float64))
    assert torch.equal(adjacency.diagonal(), torch.ones(5, dtype=torch.float64))


def test_relational_prototypes_limits_and_convexity():
    prototypes = torch.rand(6, 4, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    assert torch.equal(relational_prototypes(prototypes, 0), prototypes)  # M = 0: r = c
    for m in (5, 9):  # M ≥ |S| − 1: every r = g
        assert torch.allclose(relational_prototypes(prototypes, m), prototypes.mean(0).expand(6, 4))
    merged = relational_prototypes(prototypes, 2)  # each row is the mean of 3 rows: inside their hull
    assert (merged >= prototypes.min(0).values - 1e-12).all() and (merged <= prototypes.max(0).values + 1e-12).all()


# ----------------------------------------------------------------------------- server: discrepancy, weights, consistency


def test_label_discrepancy_extremes():
    assert float(label_discrepancy(torch.full((10,), 7))) == pytest.approx(0.0, abs=1e-15)
    single = torch.zeros(10)
    single[3] = 40
    assert float(label_discrepancy(single)) == pytest.approx(0.67082, abs=1e-5)
    assert float(label_discrepancy(single)) == pytest.approx(math.sqrt((1 - 1 / 10) / 2))


def test_discrepancy_weights_by_hand():
    # a = 1/400, b = 1/0.5: σ(0.25 − 0) and σ(0.75 − 1) sum to 1 already
    weights = discrepancy_weights(torch.tensor([100.0, 300.0]), torch.tensor([0.0, 0.5]))
    assert weights.dtype == torch.float64
    assert torch.allclose(weights, torch.tensor([1 / (1 + math.exp(-0.25)), 1 / (1 + math.exp(0.25))], dtype=torch.float64))


def test_discrepancy_weights_properties():
    n, d = torch.tensor([50.0, 80.0, 120.0, 60.0]), torch.tensor([0.1, 0.4, 0.2, 0.6])
    weights = discrepancy_weights(n, d)
    assert (weights > 0).all() and float(weights.sum()) == pytest.approx(1.0, abs=1e-12)
    assert torch.allclose(discrepancy_weights(torch.full((4,), 9.0), torch.full((4,), 0.3)), torch.full((4,), 0.25, dtype=torch.float64))
    at_fixed_d = discrepancy_weights(torch.tensor([10.0, 20.0, 30.0]), torch.full((3,), 0.2))
    assert at_fixed_d[0] < at_fixed_d[1] < at_fixed_d[2]
    at_fixed_n = discrepancy_weights(torch.full((3,), 10.0), torch.tensor([0.1, 0.2, 0.3]))
    assert at_fixed_n[0] > at_fixed_n[1] > at_fixed_n[2]
    iid = discrepancy_weights(torch.tensor([10.0, 30.0]), torch.zeros(2))  # Σd = 0: b = 0, no NaN
    assert torch.isfinite(iid).all() and iid[1] > iid[0]


def test_consistent_prototype_is_the_renormalised_weighted_mean():
    relational = torch.tensor([[0.0, 2.0], [4.0, 0.0]], dtype=torch.float64)
    assert torch.allclose(
        consistent_prototype(relational, torch.tensor([0.1, 0.3], dtype=torch.float64)), torch.tensor([3.0, 0.5], dtype=torch.float64)
    )
    same = torch.tensor([1.5, -2.0], dtype=torch.float64).expand(3, 2)
    assert torch.allclose(consistent_prototype(same, torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)), same[0])


def _payload(prototypes: torch.Tensor, present: list[bool], n: float, d: float) -> dict:
    return {
        "prototypes": prototypes.float(),
        "class_present": torch.tensor(present),
        "num_samples": torch.tensor(n),
        "discrepancy": torch.tensor(d),
    }


def test_aggregate_by_hand_with_missing_classes():
    _, _, fedsc = setup("fedsc", "algorithm.num_neighbors=1")
    g = torch.Generator().manual_seed(3)
    client_weights = [torch.randn(4, generator=g) for _ in range(3)]
    n, d = [100.0, 300.0, 100.0], [0.0, 0.5, 0.25]
    class1 = torch.tensor([[2.0, 0.0], [0.0, 4.0]])
    class2 = torch.tensor([5.0, -1.0])
    prototypes = [
        torch.stack([HAND_PROTOTYPES[0].float(), class1[0], torch.zeros(2)]),  # client 0: classes 0, 1
        torch.stack([HAND_PROTOTYPES[1].float(), torch.zeros(2), torch.zeros(2)]),  # client 1: class 0
        torch.stack([HAND_PROTOTYPES[2].float(), class1[1], class2]),  # client 2: classes 0, 1, 2
    ]
    present = [[True, True, False], [True, False, False], [True, True, True]]
    updates = {
        k: ClientUpdate(
            sums={"weights": client_weights[k].double() * n[k], "num_samples": torch.tensor(n[k], dtype=torch.float64)},
            payload=_payload(prototypes[k], present[k], n[k], d[k]),
        )
        for k in range(3)
    }
    state, metrics = fedsc.aggregate({}, 1, results_of(updates))

    expected_weights = sum(w * nk for w, nk in zip(client_weights, n)) / sum(n)
    assert torch.allclose(state["weights"], expected_weights, atol=1e-6)
    assert state["relational_classes"].tolist() == [0, 0, 0, 1, 1, 2]
    assert state["relational_clients"].tolist() == [0, 1, 2, 0, 2, 2]
    expected_relational = torch.tensor([[0.5, 0.5], [0.5, 0.5], [1.0, 0.5], [1.0, 2.0], [1.0, 2.0], [5.0, -1.0]])
    assert torch.allclose(state["relational_prototypes"], expected_relational)

    # Eq. 11 by hand: a = 1/500, b = 1/0.75
    scores = [1 / (1 + math.exp(-(nk / 500 - dk / 0.75))) for nk, dk in zip(n, d)]
    e = torch.tensor(scores) / sum(scores)
    assert metrics["aggregation_weight_min"] == pytest.approx(float(e.min()), rel=1e-6)
    o0 = (e[0] * expected_relational[0] + e[1] * expected_relational[1] + e[2] * expected_relational[2]) / e.sum()
    o1 = (e[0] * expected_relational[3] + e[2] * expected_relational[4]) / (e[0] + e[2])  # renormalised over S_1
    assert torch.allclose(state["consistent_prototypes"], torch.stack([o0, o1, class2]), atol=1e-6)
    assert state["consistent_present"].tolist() == [True, True, True]
    assert "relational_clients" not in fedsc.broadcast(state, 2)


# ----------------------------------------------------------------------------- client losses


def _random_case(seed: int = 0, batch: int = 12, dim: int = 6, classes: int = 4, per_class: int = 3):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(batch, dim, generator=g, dtype=torch.float64).abs()
    y = torch.randint(0, classes, (batch,), generator=g)
    protos = torch.randn(classes * per_class, dim, generator=g, dtype=torch.float64).abs()
    proto_classes = torch.arange(classes).repeat_interleave(per_class)
    return z, y, protos, proto_classes


def test_rpcl_equals_the_naive_double_loop():
    z, y, protos, classes = _random_case()
    scale = distance_scale(z, protos)
    loss = prototype_contrastive_loss(z, y, protos, classes, 0.05, scale)
    assert float(loss) == pytest.approx(float(naive_rpcl(z, y, protos, classes, 0.05, scale)), abs=1e-5)
    assert float(loss) >= 0


def test_distance_scale_is_the_detached_mean_distance():
    z, _, protos, _ = _random_case(1)
    z.requires_grad_(True)
    scale = distance_scale(z, protos)
    expected = torch.stack([(z.detach() - p).norm(dim=1).mean() for p in protos])
    assert torch.allclose(scale, expected) and not scale.requires_grad
    assert float(distance_scale(protos[:1], protos[:1])) == 1e-6  # clamped


def test_rpcl_is_log_c_when_every_similarity_is_equal():
    y = torch.tensor([0, 1, 2, 3, 1])
    protos = torch.ones(12, 3)  # 4 classes × 3 identical prototypes
    loss = prototype_contrastive_loss(torch.rand(5, 3) + 0.1, y, protos, torch.arange(4).repeat_interleave(3), 0.07, None)
    assert float(loss) == pytest.approx(math.log(4), abs=1e-6)


def test_rpcl_without_negatives_is_zero():
    z, _, protos, _ = _random_case(2)
    loss = prototype_contrastive_loss(z, torch.zeros(12, dtype=torch.long), protos, torch.zeros(12, dtype=torch.long), 0.05, None)
    assert float(loss) == pytest.approx(0.0, abs=1e-12)


def test_rpcl_decreases_when_the_feature_moves_toward_its_positive():
    protos, classes, scale = torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 1]), torch.tensor([0.7, 1.3])
    before = prototype_contrastive_loss(torch.tensor([[1.0, 1.0]]), torch.tensor([0]), protos, classes, 0.1, scale)
    after = prototype_contrastive_loss(torch.tensor([[1.0, 0.5]]), torch.tensor([0]), protos, classes, 0.1, scale)
    assert float(after) < float(before)


def test_rpcl_is_finite_at_tau_001_and_skips_classes_without_prototypes():
    z, y, protos, classes = _random_case(3)
    y[:4] = 7  # no prototype of class 7 anywhere
    z.requires_grad_(True)
    loss = prototype_contrastive_loss(z, y, protos, classes, 0.01, distance_scale(z, protos))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(z.grad).all()
    assert torch.equal(z.grad[:4], torch.zeros(4, 6, dtype=torch.float64))  # skipped samples get no gradient
    kept = prototype_contrastive_loss(z[4:], y[4:], protos, classes, 0.01, distance_scale(z, protos))
    assert float(loss.detach()) == pytest.approx(float(kept.detach()))

    lonely = torch.randn(3, 6, requires_grad=True)  # no sample of the batch has a prototype
    empty = prototype_contrastive_loss(lonely, torch.full((3,), 9), protos.float(), classes, 0.05, None)
    empty.backward()
    assert float(empty.detach()) == 0.0 and torch.equal(lonely.grad, torch.zeros(3, 6))


def test_single_mean_positive_variant_matches_its_definition():
    z, y, protos, classes = _random_case(4)
    loss = single_mean_positive_contrastive_loss(z, y, protos, classes, 0.05)
    expected = []
    for i in range(z.shape[0]):
        positive = F.cosine_similarity(z[i], protos[classes == y[i]].mean(0), dim=0, eps=0) / 0.05
        negatives = F.cosine_similarity(z[i : i + 1], protos[classes != y[i]], eps=0) / 0.05
        expected.append(torch.logsumexp(torch.cat([positive[None], negatives]), 0) - positive)
    assert float(loss) == pytest.approx(float(torch.stack(expected).mean()), abs=1e-6)
    assert float(loss) != pytest.approx(float(prototype_contrastive_loss(z, y, protos, classes, 0.05, None)), abs=1e-3)


def test_cpdr_distances_by_hand_and_gradient_direction():
    z = torch.tensor([[1.0, 2.0], [0.0, 0.0]], requires_grad=True)
    o = torch.tensor([[0.0, 0.0], [3.0, 4.0]], requires_grad=True)
    assert float(prototype_distance(z.detach(), o.detach(), "mse")) == pytest.approx((1 + 4 + 9 + 16) / 4)
    assert float(prototype_distance(z.detach(), o.detach(), "l2")) == pytest.approx((math.sqrt(5) + 5) / 2)
    assert float(prototype_distance(z.detach(), o.detach(), "l1")) == pytest.approx((3 + 7) / 2)
    prototype_distance(z, o, "mse").backward()
    assert o.grad is None  # no gradient reaches the prototypes
    assert torch.allclose(-z.grad, (o - z).detach() / 2)  # descent points toward o
    same = torch.tensor([[0.5, -1.0]], requires_grad=True)
    for metric in ("mse", "l2", "l1"):
        value = prototype_distance(same, same.detach().clone(), metric)
        assert float(value.detach()) == 0.0
        (grad,) = torch.autograd.grad(value, same)
        assert torch.isfinite(grad).all()


# ----------------------------------------------------------------------------- client step on digits


def test_client_prototypes_are_means_of_unnormalised_final_features_and_absent_classes_are_absent():
    config, data, fedsc = setup("fedsc")
    model = initial_model(fedsc)
    labels = torch.as_tensor(data.train.y)
    index = torch.nonzero((labels == 0) | (labels == 3)).flatten()[:40]
    update = fedsc.client_update(context(fedsc, data, model, 0, 1, index=index), fedsc.broadcast(fedsc.init_server_state(model), 1))
    assert update.payload["class_present"].tolist() == [c in (0, 3) for c in range(10)]
    model.eval()
    with torch.no_grad():
        features = model.encode(data.info.normalize(torch.as_tensor(data.train.x)[index]))
    for c in (0, 3):
        assert torch.allclose(update.payload["prototypes"][c], features[labels[index] == c].mean(0), atol=1e-6)
    assert torch.equal(update.payload["prototypes"][1], torch.zeros(64))
    assert (features >= 0).all()  # post-ReLU, not L2-normalised
    counts = torch.bincount(labels[index], minlength=10)
    assert float(update.payload["discrepancy"]) == pytest.approx(float(label_discrepancy(counts)), rel=1e-6)


def test_zero_weights_or_round_one_reproduce_fedavg_exactly():
    _, data, fedavg = setup("fedavg")
    reference = simulate(fedavg, data, rounds=2)
    _, _, off = setup("fedsc", "algorithm.lam_rpcl=0", "algorithm.lam_cpdr=0")
    history = simulate(off, data, rounds=2)
    for ours, theirs in zip(history, reference):
        assert torch.equal(ours["weights"], theirs["weights"])
    _, _, fedsc = setup("fedsc")
    with_losses = simulate(fedsc, data, rounds=2)
    assert torch.equal(with_losses[0]["weights"], reference[0]["weights"])  # round 1: CE only
    assert not torch.equal(with_losses[1]["weights"], reference[1]["weights"])  # round 2 uses RPCL + CPDR
    assert with_losses[1]["relational_prototypes"].shape[1] == 64


@pytest.mark.parametrize(
    "variant",
    [
        ["algorithm.u_mode=dataset"],
        ["algorithm.u_mode=none"],
        ["algorithm.rpcl_variant=single_mean_positive"],
        ["algorithm.cpdr_metric=l1"],
        ["algorithm.cpdr_metric=l2"],
        ["algorithm.proto_source=last_epoch"],
    ],
)
def test_every_variant_trains_finite_and_changes_the_outcome(variant):
    _, data, default = setup("fedsc")
    _, _, other = setup("fedsc", *variant)
    baseline, changed = simulate(default, data, 2, (0, 1, 2)), simulate(other, data, 2, (0, 1, 2))
    assert torch.isfinite(changed[-1]["weights"]).all()
    assert not torch.equal(changed[-1]["weights"], baseline[-1]["weights"])


def test_last_epoch_prototypes_match_the_eval_pass_when_training_does_not_move():
    _, data, eval_pass = setup("fedsc", "train.lr=1e-30")
    _, _, last_epoch = setup("fedsc", "train.lr=1e-30", "algorithm.proto_source=last_epoch")
    model = initial_model(eval_pass)
    broadcast = eval_pass.broadcast(eval_pass.init_server_state(model), 1)
    a = eval_pass.client_update(context(eval_pass, data, model, 2, 1), broadcast).payload
    b = last_epoch.client_update(context(last_epoch, data, model, 2, 1), broadcast).payload
    assert torch.equal(a["class_present"], b["class_present"])
    assert torch.allclose(a["prototypes"], b["prototypes"], atol=1e-5)


def test_three_rounds_learn_digits():
    _, data, fedsc = setup("fedsc", "train.local_epochs=2")
    history = simulate(fedsc, data, rounds=3)
    assert global_accuracy(fedsc, data, history[-1], 3) > 0.5


def test_bad_keys_name_the_key_and_the_allowed_values():
    with pytest.raises(ConfigError, match=r"algorithm\.cpdr_metric.*'mse', 'l2' or 'l1'"):
        load_config(None, ["algorithm.name=fedsc", "algorithm.cpdr_metric=l3"])
    with pytest.raises(ConfigError, match=r"algorithm\.num_neighbours: unknown key"):
        load_config(None, ["algorithm.name=fedsc", "algorithm.num_neighbours=2"])
    with pytest.raises(ConfigError, match=r"algorithm\.tau"):
        load_config(None, ["algorithm.name=fedsc", "algorithm.tau=0"])


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("name", ["fedsc", "fedskc", "fedproto", "moon"])
def test_digits_examples_validate(name):
    config = load_config(EXAMPLES / f"{name}_digits.yaml")
    assert (config.algorithm.name, config.data.name, config.train.rounds) == (name, "digits", 30)


@pytest.mark.parametrize("dataset", ["cifar10", "cifar100"])
def test_paper_examples_carry_the_spec_settings(dataset):
    fedsc = load_config(EXAMPLES / f"paper_fedsc_{dataset}.yaml")  # the FedSC paper's setting
    assert (fedsc.data.name, fedsc.data.num_clients, fedsc.train.clients_per_round, fedsc.train.rounds) == (dataset, 10, 5, 100)
    assert (fedsc.model.name, fedsc.data.partition, fedsc.data.alpha) == ("resnet10", "dirichlet_equal_size", 0.2)
    assert (fedsc.train.local_epochs, fedsc.train.batch_size, fedsc.train.lr, fedsc.train.momentum, fedsc.train.weight_decay) == (
        10,
        64,
        0.01,
        0.9,
        1e-5,
    )
    assert (fedsc.algorithm.tau, fedsc.algorithm.num_neighbors) == (0.05, 2)
    fedskc = load_config(EXAMPLES / f"paper_fedskc_{dataset}.yaml")  # the FedSKC paper's setting
    assert (fedskc.data.name, fedskc.data.num_clients, fedskc.train.clients_per_round, fedskc.train.rounds) == (dataset, 20, 8, 200)
    assert (fedskc.model.name, fedskc.data.partition, fedskc.data.alpha) == ("resnet8", "dirichlet_equal_size", 0.2)
    assert (fedskc.train.local_epochs, fedskc.train.batch_size, fedskc.train.lr, fedskc.train.momentum) == (10, 64, 0.01, 0.0)
    assert (fedskc.algorithm.tau, fedskc.algorithm.num_neighbors, fedskc.algorithm.beta) == (0.08, 1, 0.95)
