"""FedCoSR's maths and client step, Ray-free: the testable properties listed in docs/algorithms_personalized.md
(1–13 and 17; 14–16 and 19–20 run through the worker code in tests/algorithms/test_personalized.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedray.algorithms import get_algorithm_class
from fedray.algorithms.base import ClientContext, ClientUpdate
from fedray.algorithms.fedcosr import adaptive_lambda, centroid_infonce, mix_shared, probe_reg_loss
from fedray.algorithms.prototypes import class_sums
from fedray import load_config
from fedray.data import build_federated_dataset
from fedray.data.augment import get_augmentation
from fedray.models import get_flat_weights, num_flat_weights
from fedray.runtime.reduction import PartialResult, merge_partials
from fedray.seeding import seed_client

# --------------------------------------------------------------------- fixtures

NUM_CLASSES = 10


@pytest.fixture(scope="module")
def digits():
    config = load_config(None, ["data.num_clients=4", "train.clients_per_round=4", "data.partition=shards", "data.classes_per_client=3"])
    return config, build_federated_dataset(config.data, 0)


def make_algorithm(digits, *overrides: str):
    config, data = digits
    config = load_config(None, ["data.num_clients=4", "train.clients_per_round=4", "algorithm.name=fedcosr", *overrides])
    return get_algorithm_class("fedcosr")(config, data.info)


def make_context(algorithm, digits, client_id: int = 0, state=None, round: int = 2) -> ClientContext:
    _, data = digits
    index = torch.as_tensor(data.clients.client(client_id))
    return ClientContext(
        client_id=client_id,
        round=round,
        model=algorithm.build_model("global"),
        x=torch.as_tensor(data.train.x[index.numpy()]),
        y=torch.as_tensor(data.train.y[index.numpy()]),
        info=data.info,
        train=algorithm.config.train.model_copy(update={"local_epochs": 1}),
        lr=algorithm.config.train.lr,
        device=torch.device("cpu"),
        generator=seed_client(0, round, client_id),
        augment=get_augmentation("none"),
        state=state,
    )


def server_state(algorithm, seed: int = 0, centroids: bool = True):
    torch.manual_seed(seed)
    state = algorithm.init_server_state(algorithm.build_model("global"))
    if centroids:
        state["centroids"] = torch.rand(NUM_CLASSES, state["centroids"].shape[1])
        state["centroid_mask"] = torch.ones(NUM_CLASSES, dtype=torch.bool)
    return state


def trained_state(algorithm, digits, client_id: int = 0, reg_loss: float | None = 1.0):
    """A client state holding a model different from the global one."""
    torch.manual_seed(100 + client_id)
    shared, personal = algorithm.split.read(algorithm.build_model("global"))
    state = {"shared": shared, "personal": personal}
    if reg_loss is not None:
        state["reg_loss"] = torch.tensor(reg_loss)
    return state


# --------------------------------------------------------------------- 1. λ = exp(−γ L), clamped


def test_lambda_range_monotonicity_and_limits():
    losses = np.linspace(0, 20, 201)
    lambdas = [adaptive_lambda(float(L), 0.7) for L in losses]
    assert all(0 < lam <= 1 for lam in lambdas[:100])
    assert all(a > b for a, b in zip(lambdas, lambdas[1:]) if b > 0)  # strictly decreasing
    assert adaptive_lambda(0.0, 3.0) == 1.0
    assert adaptive_lambda(1e4, 1.0) == 0.0 and adaptive_lambda(50.0, 1.0) < 1e-20
    for L, gamma in [(0.3, 1.0), (2.3, 0.5), (1.98, 2.0)]:
        assert adaptive_lambda(L, gamma) == math.exp(-gamma * L)  # the clamp is a no-op


def test_invalid_losses_are_clamped_or_raise():
    assert adaptive_lambda(-0.5, 1.0) == 1.0
    assert adaptive_lambda(float("inf"), 1.0) == 0.0
    assert adaptive_lambda(float("nan"), 1.0) == 0.0  # unknown loss: take the global φ
    for bad in (-0.5, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="L_Reg"):
            adaptive_lambda(bad, 1.0, "raise")


# --------------------------------------------------------------------- 2–3. local aggregation (Eq. 8–9)


def test_mixing_endpoints_and_convexity():
    torch.manual_seed(0)
    local, global_ = torch.randn(1000), torch.randn(1000)
    assert torch.equal(mix_shared(local, global_, 1.0), local)
    assert torch.equal(mix_shared(local, global_, 0.0), global_)
    for lam in (0.1, 0.37, 0.9, 1e-7, 1 - 1e-7):
        mixed = mix_shared(local, global_, lam)
        assert torch.all(mixed >= torch.minimum(local, global_)) and torch.all(mixed <= torch.maximum(local, global_))
        assert torch.allclose(mixed, lam * local + (1 - lam) * global_, atol=1e-6)


def test_local_aggregation_mixes_every_shared_tensor_with_one_lambda_and_leaves_the_head(digits):
    algorithm = make_algorithm(digits)
    broadcast = algorithm.broadcast(server_state(algorithm), 2)
    state = trained_state(algorithm, digits, reg_loss=0.8)
    ctx = make_context(algorithm, digits, state=state)
    metrics = algorithm.load_client_model(ctx, broadcast)
    lam = metrics["lambda"]
    assert lam == pytest.approx(math.exp(-0.8))
    shared, personal = algorithm.split.read(ctx.model)
    assert torch.equal(personal, state["personal"])  # π bit-identical (Eq. 9)
    assert torch.allclose(shared, lam * state["shared"] + (1 - lam) * broadcast["weights"], atol=1e-6)
    # one λ for every tensor: solve for λ tensor by tensor
    offset = 0
    for key, value in ctx.model.state_dict().items():
        if key.startswith("encoder."):
            n = value.numel()
            a, g, m = state["shared"][offset : offset + n], broadcast["weights"][offset : offset + n], shared[offset : offset + n]
            far = (a - g).abs() > 1e-2
            assert torch.allclose((m - g)[far] / (a - g)[far], torch.tensor(lam), atol=1e-3), key
            offset += n


# --------------------------------------------------------------------- 4–5. the upload


def test_upload_is_phi_centroids_counts_and_n_only(digits):
    algorithm = make_algorithm(digits)
    broadcast = algorithm.broadcast(server_state(algorithm), 2)
    ctx = make_context(algorithm, digits, state=trained_state(algorithm, digits))
    update = algorithm.client_update(ctx, broadcast)
    assert set(update.sums) == {"weights", "num_samples", "centroid_sums", "centroid_counts"}
    assert update.payload == {}
    k = ctx.model.feature_dim
    phi_size = num_flat_weights(ctx.model, ("encoder.",))
    total = sum(t.numel() for t in update.sums.values())
    assert total == phi_size + NUM_CLASSES * k + NUM_CLASSES + 1  # |φ| + |C|·k + counts + n
    shared, personal = algorithm.split.read(ctx.model)
    assert torch.equal(update.sums["weights"], shared.double() * ctx.num_samples)
    assert update.sums["num_samples"].item() == ctx.num_samples
    # the head never appears in the upload
    head = personal.double()
    assert not any(torch.isin(head, t.flatten()).any() for t in update.sums.values() if t.numel() > 1)
    # centroids only for the classes the client holds
    counts = torch.bincount(ctx.y, minlength=NUM_CLASSES).double()
    assert torch.equal(update.sums["centroid_counts"], counts)
    assert torch.all(update.sums["centroid_sums"][counts == 0] == 0)
    assert (counts > 0).sum() <= 3 and torch.all(update.sums["centroid_sums"][counts > 0].abs().sum(1) > 0)


# --------------------------------------------------------------------- 6–7, 9. the loss and its gradients


def test_with_alpha_zero_the_update_is_exactly_cross_entropy(digits):
    """α = 0 gives bit-identical training to FedPer from the same state and batches (λ fixed)."""
    cosr = make_algorithm(digits, "algorithm.contrast_weight=0", "algorithm.fixed_lambda=0")
    fedper_config = load_config(None, ["data.num_clients=4", "train.clients_per_round=4", "algorithm.name=fedper"])
    fedper = get_algorithm_class("fedper")(fedper_config, digits[1].info)
    state = server_state(cosr)
    client_state = trained_state(cosr, digits)
    a = cosr.client_update(make_context(cosr, digits, state=client_state), cosr.broadcast(state, 2))
    b = fedper.client_update(make_context(fedper, digits, state={"personal": client_state["personal"]}), fedper.broadcast(state, 2))
    assert torch.equal(a.sums["weights"], b.sums["weights"])
    assert torch.equal(a.state["personal"], b.state["personal"])
    assert a.metrics["train_loss"] == a.metrics["ce"] == b.metrics["train_loss"]
    assert a.metrics["contrastive"] > 0  # still computed, for λ


def test_infonce_gradient_reaches_phi_only_never_the_head_or_the_centroids(digits):
    algorithm = make_algorithm(digits)
    model = algorithm.build_model("global")
    ctx = make_context(algorithm, digits)
    x, y = algorithm.info.normalize(ctx.x[:16]), ctx.y[:16]
    centroids = torch.rand(NUM_CLASSES, model.feature_dim, requires_grad=True)
    features = model.encode(x)
    reg = centroid_infonce(features, y, centroids, torch.ones(NUM_CLASSES, dtype=torch.bool), 0.5).mean()
    head_grads = torch.autograd.grad(reg, list(model.classifier.parameters()) + [centroids], allow_unused=True, retain_graph=True)
    assert all(g is None for g in head_grads)
    encoder_grads = torch.autograd.grad(reg, list(model.encoder.parameters()))
    assert any(g.abs().sum() > 0 for g in encoder_grads)

    def head_grad(alpha: float) -> list[torch.Tensor]:
        model.zero_grad()
        features = model.encode(x)
        loss = (
            F.cross_entropy(model.classify(features), y)
            + alpha * centroid_infonce(features, y, centroids, torch.ones(NUM_CLASSES, dtype=torch.bool), 0.5).mean()
        )
        loss.backward()
        return [p.grad.clone() for p in model.classifier.parameters()]

    assert all(torch.equal(a, b) for a, b in zip(head_grad(0.0), head_grad(5.0)))


def test_broadcast_centroids_are_unchanged_by_training(digits):
    algorithm = make_algorithm(digits)
    broadcast = algorithm.broadcast(server_state(algorithm), 2)
    before = broadcast["centroids"].clone()
    algorithm.client_update(make_context(algorithm, digits, state=trained_state(algorithm, digits)), broadcast)
    assert torch.equal(broadcast["centroids"], before) and not broadcast["centroids"].requires_grad


# --------------------------------------------------------------------- 8, 10. InfoNCE (Eq. 13)


def test_infonce_hand_computed_example():
    features = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    centroids = torch.tensor([[2.0, 0.0], [0.0, 3.0], [1.0, 1.0]])
    labels = torch.tensor([0, 1])
    mask = torch.ones(3, dtype=torch.bool)
    tau = 0.5
    # cosines: sample 0 → (1, 0, 1/√2); sample 1 → (1/√2, 1/√2, 1)
    s0 = torch.tensor([1.0, 0.0, 2**-0.5]) / tau
    s1 = torch.tensor([2**-0.5, 2**-0.5, 1.0]) / tau
    expected = torch.stack([torch.logsumexp(s0, 0) - s0[0], torch.logsumexp(s1, 0) - s1[1]])
    losses = centroid_infonce(features, labels, centroids, mask, tau)
    assert torch.allclose(losses, expected, atol=1e-6)
    cosine = F.normalize(features, dim=1) @ F.normalize(centroids, dim=1).T
    assert torch.allclose(losses, F.cross_entropy(cosine / tau, labels, reduction="none"), atol=1e-6)


def test_infonce_properties():
    torch.manual_seed(0)
    features, centroids = torch.rand(32, 8), torch.rand(5, 8)
    labels = torch.randint(0, 5, (32,))
    mask = torch.ones(5, dtype=torch.bool)
    losses = centroid_infonce(features, labels, centroids, mask, 0.2)
    assert torch.all(losses >= 0)
    scaled = centroid_infonce(features * torch.rand(32, 1) * 10 + 0, labels, centroids * 3.7, mask, 0.2)
    assert torch.allclose(scaled, losses, atol=1e-5)  # invariant to positive rescaling
    only_one = torch.zeros(5, dtype=torch.bool)
    only_one[2] = True
    single = centroid_infonce(features, labels, centroids, only_one, 0.2)
    assert single.numel() == int((labels == 2).sum()) and torch.all(single == 0)
    # moving ω towards its own centroid lowers its loss
    axes = torch.eye(3)
    path = [torch.tensor([[0.2, 1.0, 1.0]]) + t * axes[:1] for t in (0.0, 0.5, 1.0, 3.0)]
    along = [float(centroid_infonce(w, torch.tensor([0]), axes, torch.ones(3, dtype=torch.bool), 0.5)) for w in path]
    assert all(a > b for a, b in zip(along, along[1:]))


def test_masked_classes_do_not_change_the_loss_and_their_samples_are_skipped():
    torch.manual_seed(1)
    features = torch.rand(20, 6, requires_grad=True)
    labels = torch.arange(20) % 4
    centroids = torch.rand(4, 6)
    mask = torch.tensor([True, True, False, True])
    losses = centroid_infonce(features, labels, centroids, mask, 0.5)
    garbage = centroids.clone()
    garbage[2] = torch.tensor([1e6, -3.0, 0.0, float("nan"), 5.0, 1.0])  # a masked centroid's value is never read
    assert torch.equal(centroid_infonce(features, labels, garbage, mask, 0.5), losses)
    keep = labels != 2
    kept = labels[keep].clone()
    kept[kept == 3] = 2  # classes (0, 1, 3) become columns (0, 1, 2)
    reference = F.cross_entropy(
        F.normalize(features[keep], dim=1) @ F.normalize(centroids[[0, 1, 3]], dim=1).T / 0.5, kept, reduction="none"
    )
    assert torch.allclose(losses, reference, atol=1e-6)
    losses.mean().backward()
    assert torch.isfinite(features.grad).all() and torch.all(features.grad[labels == 2] == 0)
    none = centroid_infonce(features, labels, centroids, torch.zeros(4, dtype=torch.bool), 0.5)
    assert none.numel() == 0


# --------------------------------------------------------------------- 11. local centroids (Eq. 3)


def test_local_centroids_are_per_class_means_independent_of_batching(digits):
    algorithm = make_algorithm(digits)
    broadcast = algorithm.broadcast(server_state(algorithm), 2)
    ctx = make_context(algorithm, digits, state=trained_state(algorithm, digits))
    update = algorithm.client_update(ctx, broadcast)
    with torch.no_grad():
        features = ctx.model.encode(algorithm.info.normalize(ctx.x))
    for c in range(NUM_CLASSES):
        rows = features[ctx.y == c]
        if len(rows):
            centroid = update.sums["centroid_sums"][c] / update.sums["centroid_counts"][c]
            assert torch.allclose(centroid.float(), rows.mean(0), atol=1e-5)
    order = torch.randperm(len(ctx.y))
    shuffled, counts = class_sums(features[order], ctx.y[order], NUM_CLASSES)
    assert torch.allclose(shuffled.double(), update.sums["centroid_sums"], atol=1e-4)
    assert torch.equal(counts.double(), update.sums["centroid_counts"])


# --------------------------------------------------------------------- 12–13. server aggregation (Eq. 5–6)


def fake_update(phi: torch.Tensor, n: int, sums: torch.Tensor, counts: torch.Tensor):
    return ClientUpdate(
        sums={
            "weights": phi.double() * n,
            "num_samples": torch.tensor(float(n), dtype=torch.float64),
            "centroid_sums": sums.double(),
            "centroid_counts": counts.double(),
        }
    )


def aggregate(algorithm, state, updates: dict[int, object]) -> dict:
    partial = PartialResult()
    for client_id, update in updates.items():
        partial.add(client_id, update)
    new_state, _ = algorithm.aggregate(state, 1, merge_partials([partial]))
    return new_state


def test_shared_layers_are_the_sample_weighted_mean(digits):
    algorithm = make_algorithm(digits)
    state = server_state(algorithm, centroids=False)
    size, k = state["weights"].numel(), state["centroids"].shape[1]
    no_centroids = (torch.zeros(NUM_CLASSES, k), torch.zeros(NUM_CLASSES))
    phis = [torch.randn(size) for _ in range(3)]
    ns = [10, 30, 60]
    updates = {i: fake_update(phis[i], ns[i], *no_centroids) for i in range(3)}
    expected = sum(n / 100 * phi.double() for n, phi in zip(ns, phis)).float()
    assert torch.allclose(aggregate(algorithm, state, updates)["weights"], expected, atol=1e-6)
    reversed_order = {i: updates[i] for i in (2, 0, 1)}
    assert torch.allclose(aggregate(algorithm, state, reversed_order)["weights"], expected, atol=1e-6)
    same = {i: fake_update(phis[0], ns[i], *no_centroids) for i in range(3)}
    assert torch.allclose(aggregate(algorithm, state, same)["weights"], phis[0], atol=1e-6)
    assert torch.equal(aggregate(algorithm, state, {0: updates[0]})["weights"], phis[0])


def test_global_centroids_are_class_count_weighted_and_keep_absent_classes(digits):
    algorithm = make_algorithm(digits)
    state = server_state(algorithm, centroids=False)
    size, k = state["weights"].numel(), state["centroids"].shape[1]
    phi = torch.zeros(size)

    def client(centroids: dict[int, tuple[float, int]]):
        sums, counts = torch.zeros(NUM_CLASSES, k), torch.zeros(NUM_CLASSES)
        for c, (value, n) in centroids.items():
            sums[c], counts[c] = value * n, n
        return fake_update(phi, int(counts.sum()), sums, counts)

    updates = {0: client({0: (1.0, 3), 1: (5.0, 2)}), 1: client({0: (2.0, 1)})}
    new = aggregate(algorithm, state, updates)
    assert torch.allclose(new["centroids"][0], torch.full((k,), (3 * 1.0 + 1 * 2.0) / 4))
    assert torch.allclose(new["centroids"][1], torch.full((k,), 5.0))  # only its owner counts
    assert new["centroid_mask"].tolist() == [True, True] + [False] * 8
    with_other = aggregate(algorithm, state, {**updates, 2: client({4: (9.0, 7)})})
    assert torch.equal(with_other["centroids"][:2], new["centroids"][:2])  # no class-0/1 holder: unchanged
    # next round only class 4 is seen: classes 0 and 1 keep their (stale) centroids
    later = aggregate(algorithm, with_other, {3: client({4: (1.0, 1)})})
    assert torch.equal(later["centroids"][:2], with_other["centroids"][:2]) and later["centroid_mask"][:2].all()
    assert torch.allclose(later["centroids"][4], torch.ones(k))


# --------------------------------------------------------------------- 17. the first-round probe


def test_probe_gives_a_finite_lambda_from_the_unmixed_local_phi(digits):
    algorithm = make_algorithm(digits)
    broadcast = algorithm.broadcast(server_state(algorithm), 2)
    state = trained_state(algorithm, digits, reg_loss=None)
    ctx = make_context(algorithm, digits, state=state)
    metrics = algorithm.load_client_model(ctx, broadcast)
    local = algorithm.build_model("global")
    algorithm.split.load(local, state["shared"], state["personal"])
    with torch.no_grad():
        features = local.encode(algorithm.info.normalize(ctx.x))
    expected = centroid_infonce(features, ctx.y, broadcast["centroids"], broadcast["centroid_mask"], 0.5).mean()
    assert metrics["probe_reg_loss"] == pytest.approx(float(expected), rel=1e-5)
    assert 0 < metrics["lambda"] <= 1 and metrics["lambda"] == pytest.approx(math.exp(-float(expected)))
    assert probe_reg_loss(
        local.encode, ctx.x, ctx.y, algorithm.info.normalize, broadcast["centroids"], broadcast["centroid_mask"], 0.5, batch_size=7
    ) == pytest.approx(float(expected), rel=1e-5)


def test_first_round_lambda_replaces_the_probe(digits):
    algorithm = make_algorithm(digits, "algorithm.first_round_lambda=0")
    broadcast = algorithm.broadcast(server_state(algorithm), 2)
    ctx = make_context(algorithm, digits, state=trained_state(algorithm, digits, reg_loss=None))
    assert algorithm.load_client_model(ctx, broadcast) == {"lambda": 0.0}
    assert torch.equal(algorithm.split.read(ctx.model)[0], broadcast["weights"])


def test_recorded_loss_drives_the_next_lambda(digits):
    algorithm = make_algorithm(digits, "algorithm.gamma=2")
    broadcast = algorithm.broadcast(server_state(algorithm), 2)
    update = algorithm.client_update(make_context(algorithm, digits, state=trained_state(algorithm, digits)), broadcast)
    recorded = float(update.state["reg_loss"])
    assert recorded == pytest.approx(update.metrics["contrastive"], rel=1e-5)
    ctx = make_context(algorithm, digits, state=update.state, round=3)
    assert algorithm.load_client_model(ctx, broadcast)["lambda"] == pytest.approx(math.exp(-2 * recorded))


# --------------------------------------------------------------------- config


def test_hyperparameters_are_validated():
    from fedray.config import ConfigError

    config = load_config(None, ["algorithm.name=fedcosr"])
    assert (config.algorithm.tau, config.algorithm.contrast_weight, config.algorithm.gamma) == (0.5, 1.0, 1.0)
    assert config.algorithm.personal_prefixes == ["classifier."]
    for bad in (
        "algorithm.tau=0",
        "algorithm.gamma=-1",
        "algorithm.contrast_weight=-0.1",
        "algorithm.fixed_lambda=1.5",
        "algorithm.invalid_loss=ignore",
    ):
        with pytest.raises(ConfigError, match=bad.split("=")[0].replace(".", r"\.")):
            load_config(None, ["algorithm.name=fedcosr", bad])
    with pytest.raises(ConfigError, match=r"algorithm\.alpha: unknown key"):  # α is contrast_weight (docs/architecture.md)
        load_config(None, ["algorithm.name=fedcosr", "algorithm.alpha=1"])


def test_projection_head_is_rejected(digits):
    config = load_config(None, ["algorithm.name=fedcosr", "model.projection_dim=32"])
    with pytest.raises(ValueError, match=r"model\.projection_dim"):
        get_algorithm_class("fedcosr")(config, digits[1].info)


def test_global_model_uses_the_initial_head(digits):
    algorithm = make_algorithm(digits)
    state = server_state(algorithm)
    model = algorithm.load_global_model(algorithm.build_model("global"), algorithm.broadcast(state, 2))
    flat = get_flat_weights(model)
    assert torch.equal(algorithm.split.shared(flat), state["weights"])
    assert torch.equal(algorithm.split.personal(flat), state["initial_personal"])
