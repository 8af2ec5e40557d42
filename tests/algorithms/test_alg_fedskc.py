"""FedSKC (docs/algorithms_prototypes.md): global knowledge, GDA and GPR against hand-computed cases,
the properties of the losses and server rules, and the client step on digits without Ray."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from fedray.algorithms.base import ClientUpdate
from fedray.algorithms.fedskc import (
    gda_weights,
    global_knowledge,
    knowledge_discrepancy,
    knowledge_transform,
    knowledge_variance_ratio,
    period_review,
)
from fedray.algorithms.losses import distance_scale, duplicated_positive_anchor_loss, prototype_contrastive_loss
from fedray.models import build_model, get_flat_weights, set_flat_weights
from test_alg_fedsc import context, global_accuracy, initial_model, results_of, setup, simulate


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


# ----------------------------------------------------------------------------- global knowledge


def test_global_knowledge_uses_euclidean_neighbours_by_hand():
    # distances: c0–c1 √2, c0–c2 1, c1–c2 1 → c0 and c1 pick c2; c2 ties between c0 and c1 → c0
    knowledge = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
    merged = torch.tensor([[1.0, 0.5], [0.5, 1.0], [1.0, 0.5]], dtype=torch.float64)
    assert torch.allclose(global_knowledge(knowledge, 1), merged.mean(0))


def test_global_knowledge_limits():
    knowledge = torch.randn(5, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert torch.allclose(global_knowledge(knowledge, 0), knowledge.mean(0))  # 𝓜 = 0: plain mean
    assert torch.equal(global_knowledge(knowledge[2:3], 1), knowledge[2])  # one client: itself
    assert torch.allclose(global_knowledge(knowledge[:2], 1), (knowledge[0] + knowledge[1]) / 2)


def test_knowledge_discrepancy_counts_present_classes_only():
    global_kn = torch.zeros(3, 3, dtype=torch.float64)
    knowledge = torch.zeros(2, 3, 3, dtype=torch.float64)
    knowledge[0, 0] = torch.tensor([3.0, 4.0, 0.0])  # distance 5
    knowledge[0, 2] = torch.tensor([0.0, 0.0, 2.0])  # distance 2
    knowledge[1, 1] = torch.tensor([1.0, 1.0, 1.0])  # class 1 absent on client 1: not counted
    present = torch.tensor([[True, False, True], [False, False, True]])
    assert knowledge_discrepancy(knowledge, present, global_kn).tolist() == [7.0, 0.0]
    assert (knowledge_discrepancy(torch.randn(4, 3, 3, dtype=torch.float64), torch.ones(4, 3, dtype=torch.bool), global_kn) >= 0).all()


# ----------------------------------------------------------------------------- GDA


def test_gda_weights_by_hand():
    n, d = torch.tensor([1.0, 3.0]), torch.tensor([6.0, 2.0])
    # paper: a = (0.75, 0.25), b = (0.25, 0.75): σ(1 − 4.5 + 0.25), σ(3 − 0.5 + 0.75)
    paper = [sigmoid(-3.25), sigmoid(3.25)]
    assert torch.allclose(gda_weights(n, d, "paper"), torch.tensor(paper, dtype=torch.float64) / sum(paper))
    normalized = [sigmoid(0.25 - 0.75), sigmoid(0.75 - 0.25)]  # σ(b − d/Σd)
    assert torch.allclose(gda_weights(n, d, "normalized"), torch.tensor(normalized, dtype=torch.float64) / sum(normalized))
    assert torch.allclose(gda_weights(n, d, "fedavg"), torch.tensor([0.25, 0.75], dtype=torch.float64))


def test_literal_gda_saturates_to_uniform_weights():
    d = torch.linspace(0, 100, 8, dtype=torch.float64)
    weights = gda_weights(torch.full((8,), 2500.0), d, "paper")
    assert (weights > 0).all() and float(weights.sum()) == pytest.approx(1.0, abs=1e-12)
    assert float((weights - 1 / 8).abs().max()) < 1e-12
    small = gda_weights(torch.ones(8), d, "paper")  # N_k − a_k d_k small: the weights do differ
    assert float((small - 1 / 8).abs().max()) > 1e-3
    assert float((gda_weights(torch.full((8,), 2500.0), d, "normalized") - 1 / 8).abs().max()) > 1e-3


def test_gda_weights_survive_zero_discrepancy():
    weights = gda_weights(torch.tensor([3.0, 5.0]), torch.zeros(2), "normalized")
    assert torch.isfinite(weights).all() and float(weights.sum()) == pytest.approx(1.0)


# ----------------------------------------------------------------------------- GPR


def test_variance_ratio_by_hand_over_common_classes_only():
    now = torch.tensor([[1.0, 3.0], [0.0, 2.0], [0.0, 50.0]])  # population variances 1, 1, 625
    before = torch.tensor([[0.0, 2.0], [1.0, 1.0], [0.0, 0.0]])  # 1, 0, (absent)
    rho = knowledge_variance_ratio(now, torch.tensor([True, True, True]), before, torch.tensor([True, True, False]))
    assert rho == pytest.approx(1.0)  # (2 − 1) / 1; class 2 is not in both rounds
    unbiased = (now[:2].var(dim=1).sum() - before[:2].var(dim=1).sum()) / before[:2].var(dim=1).sum()
    assert rho == pytest.approx(float(unbiased))
    assert knowledge_variance_ratio(now, torch.ones(3, dtype=torch.bool), torch.ones(3, 2), torch.ones(3, dtype=torch.bool)) is None
    assert knowledge_variance_ratio(now, torch.ones(3, dtype=torch.bool), before, torch.zeros(3, dtype=torch.bool)) is None


def test_period_review_by_hand_and_limits():
    w, previous = torch.tensor([1.0, 2.0]), torch.tensor([3.0, 0.0])
    # correction (1 − 0.9) · 0.5 · (w_prev − w) = (0.1, −0.1)
    assert torch.allclose(period_review(w, previous, 0.5, 0.9, "paper"), torch.tensor([1.0, 1.7]))
    assert torch.allclose(period_review(w, previous, 0.5, 0.9, "residual"), torch.tensor([1.1, 1.9]))
    assert torch.equal(period_review(w, previous, 0.5, 0.9, "off"), w)
    for mode in ("paper", "residual"):
        assert torch.equal(period_review(w, previous, 3.0, 1.0, mode), w)  # β = 1: identity
    assert torch.allclose(period_review(w, previous, 0.0, 0.95, "paper"), 0.95 * w)  # ρ = 0
    assert torch.equal(period_review(w, previous, 0.0, 0.95, "residual"), w)
    assert torch.allclose(period_review(w, w.clone(), 0.7, 0.95, "paper"), 0.95 * w)  # w_prev = w


def test_period_review_leaves_integer_buffers_untouched():
    config, data, _ = setup("fedskc", "model.name=resnet8")
    model = build_model(config.model, data.info)
    bn = next(m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d))
    bn.num_batches_tracked.fill_(7)
    bn.running_mean.fill_(2.0)
    flat = get_flat_weights(model)
    set_flat_weights(model, period_review(flat, torch.zeros_like(flat), 0.0, 0.5, "paper"))
    assert int(bn.num_batches_tracked) == 7
    assert torch.allclose(bn.running_mean, torch.full_like(bn.running_mean, 1.0))  # float buffers are reviewed


# ----------------------------------------------------------------------------- aggregate


def _update(weights: torch.Tensor, knowledge: torch.Tensor, present: list[bool], n: float) -> ClientUpdate:
    return ClientUpdate(
        sums={},
        payload={"weights": weights, "knowledge": knowledge, "class_present": torch.tensor(present), "num_samples": torch.tensor(n)},
    )


def test_gda_over_identical_models_returns_that_model():
    _, _, fedskc = setup("fedskc", "algorithm.gda_mode=normalized")
    g = torch.Generator().manual_seed(5)
    w = torch.randn(10, generator=g)
    updates = {k: _update(w, torch.randn(3, 3, generator=g), [True, k != 1, True], 50.0 + 30 * k) for k in range(3)}
    state, metrics = fedskc.aggregate(
        {"knowledge": torch.zeros(3, 3), "knowledge_present": torch.zeros(3, dtype=torch.bool), "weights": w}, 1, results_of(updates)
    )
    assert torch.allclose(state["weights"], w, atol=1e-6)
    assert math.isnan(metrics["variance_ratio"])  # round 1: no previous knowledge, no GPR
    assert metrics["aggregation_weight_min"] < metrics["aggregation_weight_max"]


def test_aggregate_by_hand_with_gda_and_period_review():
    _, _, fedskc = setup("fedskc", "algorithm.num_neighbors=0", "algorithm.beta=0.9", "algorithm.gpr_mode=residual")
    w0, w1, previous = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 2.0]), torch.tensor([4.0, 4.0])
    k0 = torch.tensor([[1.0, 3.0], [0.0, 0.0]])  # client 0: class 0 only
    k1 = torch.tensor([[3.0, 1.0], [0.0, 2.0]])  # client 1: classes 0, 1
    updates = {0: _update(w0, k0, [True, False], 1.0), 1: _update(w1, k1, [True, True], 3.0)}
    server = {"weights": previous, "knowledge": torch.tensor([[0.0, 1.0], [0.0, 1.0]]), "knowledge_present": torch.tensor([True, True])}
    state, metrics = fedskc.aggregate(server, 2, results_of(updates))

    global_kn = torch.tensor([[2.0, 2.0], [0.0, 2.0]])  # 𝓜 = 0: class 0 mean of both, class 1 client 1's
    assert torch.allclose(state["knowledge"], global_kn)
    d = [math.sqrt(2), math.sqrt(2)]  # ‖k0[0] − c̃^0‖, ‖k1[0] − c̃^0‖ + ‖k1[1] − c̃^1‖ = √2 + 0
    scores = [sigmoid(1.0 - 0.5 * d[0] + 0.25), sigmoid(3.0 - 0.5 * d[1] + 0.75)]  # a_k = ½, b = (¼, ¾)
    e = [s / sum(scores) for s in scores]
    assert metrics["aggregation_weight_min"] == pytest.approx(min(e))
    gda = e[0] * w0 + e[1] * w1
    rho = ((0.0 + 1.0) - (0.25 + 0.25)) / (0.25 + 0.25)  # population variances of the rows
    assert metrics["variance_ratio"] == pytest.approx(rho)
    assert torch.allclose(state["weights"], gda + 0.1 * rho * (previous - gda), atol=1e-6)


# ----------------------------------------------------------------------------- LCL and knowledge


def test_lcl_is_cross_entropy_over_scaled_anchor_similarities():
    g = torch.Generator().manual_seed(6)
    logits, anchors = torch.randn(9, 5, generator=g), torch.randn(4, 5, generator=g)
    anchor_classes = torch.tensor([0, 1, 3, 4])  # class 2 has no global knowledge
    y = torch.tensor([0, 1, 3, 4, 0, 1, 3, 4, 2])
    scale = distance_scale(logits, anchors)
    loss = prototype_contrastive_loss(logits, y, anchors, anchor_classes, 0.08, scale)
    s = F.cosine_similarity(logits[:, None], anchors[None], dim=2, eps=0) / scale
    expected = F.cross_entropy(s[:8] / 0.08, torch.tensor([0, 1, 2, 3, 0, 1, 2, 3]))  # the class-2 sample is skipped
    assert float(loss) == pytest.approx(float(expected), abs=1e-5) and float(loss) >= 0
    equal = prototype_contrastive_loss(torch.rand(3, 5) + 0.1, torch.tensor([0, 1, 3]), torch.ones(4, 5), anchor_classes, 0.08, None)
    assert float(equal) == pytest.approx(math.log(4), abs=1e-6)


def test_lcl_is_finite_at_tau_001():
    logits = (10 * torch.randn(16, 10, generator=torch.Generator().manual_seed(7))).requires_grad_(True)
    anchors = torch.randn(10, 10, generator=torch.Generator().manual_seed(8))
    loss = prototype_contrastive_loss(logits, torch.arange(16) % 10, anchors, torch.arange(10), 0.01, distance_scale(logits, anchors))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logits.grad).all()


def test_code_variant_counts_the_positive_twice():
    g = torch.Generator().manual_seed(9)
    logits, anchors, y = torch.randn(6, 4, generator=g), torch.randn(4, 4, generator=g), torch.tensor([0, 1, 2, 3, 2, 1])
    cos = F.cosine_similarity(logits[:, None], anchors[None], dim=2, eps=0) / 0.08
    expected = F.cross_entropy(torch.cat([cos.gather(1, y[:, None]), cos], dim=1), torch.zeros(6, dtype=torch.long))
    assert float(duplicated_positive_anchor_loss(logits, y, anchors, torch.arange(4), 0.08)) == pytest.approx(float(expected), abs=1e-5)


def test_knowledge_transform_is_silu():
    x = torch.linspace(-20, 20, 401)
    assert torch.allclose(knowledge_transform(x, "silu"), x * torch.sigmoid(x))
    assert float(knowledge_transform(torch.zeros(1), "silu")) == 0.0
    assert float(knowledge_transform(x, "silu").min()) >= -0.2785
    assert torch.equal(knowledge_transform(x, "none"), x)


@pytest.mark.parametrize("transform", ["silu", "none"])
def test_client_knowledge_is_the_transformed_mean_logit_of_the_final_model(transform):
    _, data, fedskc = setup("fedskc", f"algorithm.knowledge_transform={transform}", "algorithm.gda_mode=fedavg")
    model = initial_model(fedskc)
    labels = torch.as_tensor(data.train.y)
    index = torch.nonzero((labels == 2) | (labels == 5) | (labels == 9)).flatten()[:45]
    update = fedskc.client_update(context(fedskc, data, model, 0, 1, index=index), fedskc.broadcast(fedskc.init_server_state(model), 1))
    assert update.payload["class_present"].tolist() == [c in (2, 5, 9) for c in range(10)]
    assert "weights" not in update.payload and "weights" in update.sums  # fedavg mode: weights via the workers' sums
    model.eval()
    with torch.no_grad():
        logits = model(data.info.normalize(torch.as_tensor(data.train.x)[index]))
    for c in (2, 5, 9):
        mean = logits[labels[index] == c].mean(0)
        assert torch.allclose(update.payload["knowledge"][c], F.silu(mean) if transform == "silu" else mean, atol=1e-5)
    assert update.payload["knowledge"].shape == (10, 10)


def test_lcl_warmup_ramps_linearly():
    _, _, fedskc = setup("fedskc", "algorithm.lcl_warmup_rounds=100", "algorithm.lam_lcl=2")
    assert [fedskc.lcl_weight(r) for r in (1, 50, 100, 150)] == pytest.approx([0.02, 1.0, 2.0, 2.0])
    assert setup("fedskc")[2].lcl_weight(1) == 1.0


def test_fedavg_reduction_and_that_paper_mode_sends_weights_per_client():
    _, data, fedavg = setup("fedavg")
    reference = simulate(fedavg, data, rounds=2)
    _, _, off = setup("fedskc", "algorithm.lam_lcl=0", "algorithm.gda_mode=fedavg", "algorithm.gpr_mode=off")
    for ours, theirs in zip(simulate(off, data, rounds=2), reference):
        assert torch.equal(ours["weights"], theirs["weights"])
    _, _, paper = setup("fedskc")
    model = initial_model(paper)
    update = paper.client_update(context(paper, data, model, 1, 1), paper.broadcast(paper.init_server_state(model), 1))
    assert update.sums == {} and torch.equal(update.payload["weights"], get_flat_weights(model))


@pytest.mark.parametrize(
    "variant",
    [
        ["algorithm.gpr_mode=residual"],
        ["algorithm.gda_mode=normalized"],
        ["algorithm.lcl_variant=code"],
        ["algorithm.u_mode=dataset"],
        ["algorithm.proto_source=last_epoch"],
    ],
)
def test_every_variant_trains_finite_and_changes_the_outcome(variant):
    _, data, default = setup("fedskc")
    _, _, other = setup("fedskc", *variant)
    baseline, changed = simulate(default, data, 2, (0, 1, 2)), simulate(other, data, 2, (0, 1, 2))
    assert torch.isfinite(changed[-1]["weights"]).all()
    assert not torch.equal(changed[-1]["weights"], baseline[-1]["weights"])


def test_three_rounds_learn_digits():
    _, data, fedskc = setup("fedskc", "train.local_epochs=2")
    history = simulate(fedskc, data, rounds=3)
    assert global_accuracy(fedskc, data, history[-1], 3) > 0.4
