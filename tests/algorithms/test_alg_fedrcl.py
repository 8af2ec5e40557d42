"""FedRCL without Ray: the relaxed contrastive loss (golden values of a worked example and its
properties), its multi-level use, the client step, the server average and the configs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import fedray.algorithms.fedrcl as fedrcl_module
from fedray.algorithms import RoundResults
from fedray.algorithms.base import ClientContext
from fedray.algorithms.fedrcl import (
    FedRCL,
    FedRCLParams,
    multi_level_rcl_terms,
    official_rcl_terms,
    paper_rcl_terms,
    relaxed_contrastive_terms,
)
from fedray.algorithms.losses import batch_cosine_similarities
from fedray import load_config
from fedray.config import ConfigError
from fedray.data import DatasetInfo
from fedray.models import get_flat_weights, num_flat_weights, set_flat_weights

torch.set_num_threads(1)
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
RTOL = 1e-5  # golden values computed in float64 with NumPy (the official variant's by a transcription
# of the official CLLoss) and checked against an independent fp32 implementation


def angles(degrees: list[float], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    radians = torch.tensor(degrees, dtype=torch.float64) * math.pi / 180
    return torch.stack([radians.cos(), radians.sin()], dim=1).to(dtype)


def terms(features: torch.Tensor, labels: torch.Tensor, **params: object):
    return relaxed_contrastive_terms(features, torch.as_tensor(labels), FedRCLParams(**params))


def total(features: torch.Tensor, labels, **params: object) -> torch.Tensor:
    p = FedRCLParams(**params)
    return relaxed_contrastive_terms(features, torch.as_tensor(labels), p).total(p)


def random_batch(n: int, num_classes: int, dim: int = 16, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n, dim, generator=generator), torch.randint(num_classes, (n,), generator=generator)


VARIANTS = [{"variant": "official"}, {"variant": "paper"}, {"variant": "paper", "pos_reduction": "sum"}]
VARIANT_IDS = ["official", "paper-mean", "paper-sum"]

# ----------------------------------------------------------------- the worked example

EXAMPLE_Z = angles([0, 20, 40, 90, 200, 135])
EXAMPLE_Y = torch.tensor([0, 0, 0, 1, 1, 2])
# per-anchor SCL and penalty (anchors without a positive are left out of the paper variant)
EXAMPLE_PARTS = {
    "official": ([2.2e-7, 6.44e-6, 0.08157747, 21.22647878, 15.29276833, 0.0028629], [0.0092444, 0.26186281, 0.0092444, 0, 0, 0]),
    "paper-mean": ([1.76703519, 0.6931504, 1.7695896, 21.2270076, 15.29276833], [0.26898502, 0.46918864, 0.26898502, 0, 0]),
    "paper-sum": ([3.53407038, 1.3863008, 3.5391792, 21.2270076, 15.29276833], [0.53797004, 0.93837728, 0.53797004, 0, 0]),
}


@pytest.mark.parametrize(
    ("params", "beta", "expected"),
    [
        ({"variant": "official"}, 0.0, 6.10061569),
        ({"variant": "official"}, 1.0, 6.14734096),
        ({"variant": "official"}, 2.0, 6.19406623),
        ({"variant": "paper"}, 0.0, 8.14991022),
        ({"variant": "paper"}, 1.0, 8.35134196),
        ({"variant": "paper"}, 2.0, 8.55277370),
        ({"variant": "paper", "pos_reduction": "sum"}, 1.0, 9.39872873),
    ],
)
def test_worked_example_golden_totals(params: dict, beta: float, expected: float) -> None:
    assert float(total(EXAMPLE_Z, EXAMPLE_Y, beta=beta, **params)) == pytest.approx(expected, rel=RTOL)


@pytest.mark.parametrize(("params", "key"), zip(VARIANTS, VARIANT_IDS))
def test_worked_example_scl_and_penalty_parts(params: dict, key: str) -> None:
    scl, penalty = EXAMPLE_PARTS[key]
    result = terms(EXAMPLE_Z, EXAMPLE_Y, **params)
    assert float(result.scl) == pytest.approx(sum(scl) / len(scl), rel=RTOL)
    assert float(result.penalty) == pytest.approx(sum(penalty) / len(penalty), rel=1e-4)  # 6-digit golden parts


def test_worked_example_in_float64_matches_to_float64_precision() -> None:
    result = total(angles([0, 20, 40, 90, 200, 135], torch.float64), EXAMPLE_Y)
    assert result.dtype == torch.float64
    assert float(result) == pytest.approx(6.14734096, rel=1e-8)


# ----------------------------------------------------------------- properties


def test_beta_zero_and_inactive_threshold_give_plain_scl() -> None:
    scl_only = 8.14991022
    assert float(total(EXAMPLE_Z, EXAMPLE_Y, variant="paper", beta=0.0)) == pytest.approx(scl_only, rel=RTOL)
    assert float(total(EXAMPLE_Z, EXAMPLE_Y, variant="paper", lam=1.0)) == pytest.approx(scl_only, rel=RTOL)
    assert float(terms(EXAMPLE_Z, EXAMPLE_Y, variant="official", lam=1.01).penalty) == 0.0
    assert float(total(EXAMPLE_Z, EXAMPLE_Y, variant="official", lam=1.01)) == pytest.approx(6.10061569, rel=RTOL)


@pytest.mark.parametrize("params", VARIANTS, ids=VARIANT_IDS)
def test_penalty_is_nonnegative_and_total_linear_in_beta(params: dict) -> None:
    for seed in range(5):
        z, y = random_batch(12, 3, dim=4, seed=seed)  # few dims and classes: many pairs over λ
        base = terms(z, y, **params)
        assert float(base.penalty) >= 0
        if params["variant"] == "official":
            assert float(base.penalty) <= math.log(2) + 1e-6
        for beta in (0.5, 2.0):
            got = total(z, y, beta=beta, **params)
            assert float(got) == pytest.approx(float(base.scl + beta * base.penalty), rel=1e-6)


def test_paper_penalty_gradient_is_positive_exactly_on_over_threshold_same_class_pairs() -> None:
    z, y = random_batch(10, 2, dim=3, seed=3)
    similarities = batch_cosine_similarities(z).detach().requires_grad_(True)
    penalty = paper_rcl_terms(similarities, y, tau=0.05, lam=0.7).penalty
    penalty.backward()
    same_class_others = (y[:, None] == y[None, :]) & ~torch.eye(10, dtype=torch.bool)
    over = same_class_others & (similarities.detach() > 0.7)
    assert over.any() and (~over).any()
    assert (similarities.grad[over] > 0).all()
    assert (similarities.grad[~over] == 0).all()


def test_paper_penalty_is_zero_with_zero_gradient_when_no_pair_is_over_threshold() -> None:
    z = angles([0, 60, 120, 180])  # same-class similarities ≤ 0.5 < λ
    y = torch.tensor([0, 0, 0, 0])
    similarities = batch_cosine_similarities(z).requires_grad_(True)
    penalty = paper_rcl_terms(similarities, y, tau=0.05, lam=0.7).penalty
    penalty.backward()
    assert float(penalty.detach()) == 0.0
    assert (similarities.grad == 0).all()


@pytest.mark.parametrize(("params", "expected"), [({"variant": "paper"}, 0.0), ({"variant": "official"}, 0.36848054)])
def test_one_sample_per_class(params: dict, expected: float) -> None:
    z = angles([0, 10, 100]).requires_grad_(True)
    result = terms(z, [0, 1, 2], **params)
    loss = result.total(FedRCLParams(**params))
    loss.backward()
    assert float(loss.detach()) == pytest.approx(expected, rel=RTOL, abs=1e-12)
    assert float(result.penalty.detach()) == 0.0
    assert torch.isfinite(z.grad).all()


def test_identical_samples_of_one_class() -> None:
    z = torch.ones(4, 8)
    y = torch.zeros(4, dtype=torch.long)
    paper = terms(z, y, variant="paper")
    assert float(paper.scl) == pytest.approx(math.log(3), rel=RTOL)
    assert float(paper.penalty) == pytest.approx(math.log(4), rel=RTOL)
    official = terms(z, y, variant="official")
    assert float(official.scl) == 0.0
    assert float(official.penalty) == pytest.approx(math.log(2), rel=RTOL)


@pytest.mark.parametrize("params", VARIANTS, ids=VARIANT_IDS)
def test_one_class_batch_has_finite_gradients_and_official_scl_zero(params: dict) -> None:
    z = torch.randn(8, 5, generator=torch.Generator().manual_seed(1)).requires_grad_(True)
    result = terms(z, torch.zeros(8, dtype=torch.long), **params)
    result.total(FedRCLParams(**params)).backward()
    assert torch.isfinite(z.grad).all()
    if params["variant"] == "official":
        assert float(result.scl.detach()) == 0.0


@pytest.mark.parametrize("params", VARIANTS, ids=VARIANT_IDS)
def test_batch_of_one(params: dict) -> None:
    z = torch.randn(1, 6).requires_grad_(True)
    loss = total(z, [3], **params)
    loss.backward()
    assert float(loss.detach()) == pytest.approx(0.0, abs=1e-12)
    assert torch.isfinite(z.grad).all()


@pytest.mark.parametrize("params", VARIANTS, ids=VARIANT_IDS)
def test_scale_invariance_and_zero_rows(params: dict) -> None:
    z, y = random_batch(10, 3, seed=4)
    scaled = z * torch.linspace(0.1, 50, 10).unsqueeze(1)
    assert float(total(scaled, y, **params)) == pytest.approx(float(total(z, y, **params)), rel=1e-5)

    with_zero = z.clone()
    with_zero[[0, 5]] = 0
    with_zero.requires_grad_(True)
    loss = total(with_zero, y, **params)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(with_zero.grad).all()


@pytest.mark.parametrize("params", VARIANTS, ids=VARIANT_IDS)
def test_permutation_and_relabelling_invariance(params: dict) -> None:
    z, y = random_batch(16, 4, seed=5)
    reference = float(total(z, y, **params))
    order = torch.randperm(16, generator=torch.Generator().manual_seed(0))
    assert float(total(z[order], y[order], **params)) == pytest.approx(reference, rel=1e-5)
    relabel = torch.tensor([7, 2, 9, 0])  # a bijection of the class ids
    assert float(total(z, relabel[y], **params)) == pytest.approx(reference, rel=1e-6)


@pytest.mark.parametrize("params", VARIANTS, ids=VARIANT_IDS)
def test_float16_features_give_the_float32_loss(params: dict) -> None:
    reference = float(total(EXAMPLE_Z, EXAMPLE_Y, **params))
    half = total(EXAMPLE_Z.half(), EXAMPLE_Y, **params)
    assert half.dtype == torch.float32
    assert torch.isfinite(half)
    assert float(half) == pytest.approx(reference, abs=1e-2)


def test_similarities_stay_float32_under_autocast() -> None:
    z, _ = random_batch(12, 3, dim=32, seed=6)
    reference = batch_cosine_similarities(z)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = batch_cosine_similarities(z)
    assert inside.dtype == torch.float32
    torch.testing.assert_close(inside, reference)  # a bf16 matmul would be ~1e-2 off


def test_multi_level_loss_is_the_equal_weight_mean_of_the_levels() -> None:
    params = FedRCLParams()
    generator = torch.Generator().manual_seed(7)
    y = torch.randint(5, (12,), generator=generator)
    shared = torch.randn(12, 32, generator=generator)
    single = relaxed_contrastive_terms(shared, y, params)
    repeated = multi_level_rcl_terms([shared] * 5, y, params)
    torch.testing.assert_close(repeated.scl, single.scl)
    torch.testing.assert_close(repeated.penalty, single.penalty)

    maps = [torch.randn(12, c, s, s, generator=generator) for c, s in [(64, 8), (64, 8), (128, 4), (256, 2), (512, 1)]]
    per_level = [relaxed_contrastive_terms(m.mean(dim=(2, 3)), y, params) for m in maps]
    combined = multi_level_rcl_terms(maps, y, params)
    torch.testing.assert_close(combined.scl, torch.stack([t.scl for t in per_level]).mean())
    torch.testing.assert_close(combined.penalty, torch.stack([t.penalty for t in per_level]).mean())


@pytest.mark.parametrize("variant", ["official", "paper"])
def test_one_sgd_step_on_the_penalty_repels_and_on_scl_attracts(variant: str) -> None:
    def cos(z: torch.Tensor, i: int, j: int) -> float:
        return float(torch.nn.functional.cosine_similarity(z[i].detach(), z[j].detach(), dim=0))

    start = angles([0, 40, 100, 260])  # the same-class pair has s = 0.766 > λ; 100° is a close negative of 40°
    y = torch.tensor([0, 0, 1, 2])
    for part, direction in (("penalty", -1), ("scl", +1)):
        z = start.clone().requires_grad_(True)
        getattr(terms(z, y, variant=variant), part).backward()
        with torch.no_grad():
            z -= 0.01 * z.grad
        assert direction * (cos(z, 0, 1) - cos(start, 0, 1)) > 0, part


@pytest.mark.parametrize("params", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("n", [2, 10, 50])
@pytest.mark.parametrize("num_classes", [10, 100])
def test_gradients_are_finite_for_random_batches(params: dict, n: int, num_classes: int) -> None:
    z, y = random_batch(n, num_classes, dim=64, seed=n + num_classes)
    z.requires_grad_(True)
    total(z, y, **params).backward()
    assert torch.isfinite(z.grad).all()


def test_official_k_pos_and_k_neg_mine_that_many_samples() -> None:
    similarities = batch_cosine_similarities(EXAMPLE_Z)
    tau = 0.05
    # fewer mined negatives, smaller denominators: k_neg = 1 keeps only each anchor's most similar one
    one_negative = official_rcl_terms(similarities, EXAMPLE_Y, tau, 0.7, k_pos=1, k_neg=1)
    all_negatives = official_rcl_terms(similarities, EXAMPLE_Y, tau, 0.7, k_pos=1, k_neg=5)
    assert float(one_negative.scl) < float(all_negatives.scl)
    # with k_pos = 2 each class-0 anchor also uses its second least similar same-class sample
    assert float(official_rcl_terms(similarities, EXAMPLE_Y, tau, 0.7, k_pos=2).scl) != pytest.approx(
        float(official_rcl_terms(similarities, EXAMPLE_Y, tau, 0.7, k_pos=1).scl)
    )


# ----------------------------------------------------------------- the algorithm

DIGITS_INFO = DatasetInfo("digits", 10, 1, 8, (0.5,), (0.25,), "none")
CIFAR_INFO = DatasetInfo("cifar10", 10, 3, 32, (0.5,) * 3, (0.25,) * 3, "none")


def make_algorithm(overrides: list[str], info: DatasetInfo = DIGITS_INFO) -> FedRCL:
    return FedRCL(load_config(None, ["algorithm.name=fedrcl", *overrides]), info)


def make_context(algorithm: FedRCL, n: int = 24, seed: int = 0) -> ClientContext:
    info = algorithm.info
    generator = torch.Generator().manual_seed(seed)
    model = algorithm.build_model("global")
    return ClientContext(
        client_id=3,
        round=1,
        model=model,
        x=torch.randint(0, 256, (n, info.channels, info.image_size, info.image_size), dtype=torch.uint8, generator=generator),
        y=torch.randint(0, 4, (n,), generator=generator),
        info=info,
        train=algorithm.config.train,
        lr=algorithm.config.train.lr,
        device=torch.device("cpu"),
        generator=generator,
        augment=lambda x, g: x,
    )


def test_default_levels_are_every_tap_and_unknown_levels_are_rejected() -> None:
    assert make_algorithm([]).level_indices == [0, 1, 2]  # cnn_small: conv1, conv2, fc
    assert make_algorithm(["model.name=resnet18", "model.norm=group"], CIFAR_INFO).level_indices == [0, 1, 2, 3, 4]
    assert make_algorithm(["algorithm.levels=[fc]"]).level_indices == [2]
    with pytest.raises(ValueError, match=r"algorithm.levels: \['stage4'\] are not taps of model 'cnn_small'"):
        make_algorithm(["algorithm.levels=[stage4]"])


def test_config_errors_name_the_key() -> None:
    with pytest.raises(ConfigError, match="algorithm.k_pos"):
        load_config(None, ["algorithm.name=fedrcl", "algorithm.variant=paper", "algorithm.k_neg=4"])
    with pytest.raises(ConfigError, match="algorithm.pos_reduction"):
        load_config(None, ["algorithm.name=fedrcl", "algorithm.pos_reduction=sum"])
    with pytest.raises(ConfigError, match="algorithm.tau"):
        load_config(None, ["algorithm.name=fedrcl", "algorithm.tau=0"])
    with pytest.raises(ConfigError, match="algorithm.variant"):
        load_config(None, ["algorithm.name=fedrcl", "algorithm.variant=literal"])
    with pytest.raises(ValueError, match="algorithm.epoch_lr_decay=0.998 restarts the optimiser"):
        make_algorithm(["train.momentum=0.9"])
    make_algorithm(["train.momentum=0.9", "algorithm.epoch_lr_decay=1"])  # allowed once off


def test_client_uploads_exactly_the_model_weights_and_its_loss_terms() -> None:
    algorithm = make_algorithm(["train.local_epochs=1", "train.batch_size=8"])
    ctx = make_context(algorithm)
    start = get_flat_weights(ctx.model).clone()
    update = algorithm.client_update(ctx, {"weights": start})
    assert set(update.sums) == {"weights", "num_samples"}
    assert update.sums["weights"].shape == (num_flat_weights(ctx.model),)
    assert float(update.sums["num_samples"]) == 1.0  # unweighted mean by default
    assert update.payload == {} and update.state is None
    assert not torch.equal(update.sums["weights"].float(), start)
    assert set(update.metrics) == {"train_loss", "ce", "scl", "penalty"}
    assert update.metrics["train_loss"] == pytest.approx(update.metrics["ce"] + update.metrics["scl"] + update.metrics["penalty"], rel=1e-5)

    weighted = make_algorithm(["train.local_epochs=1", "train.batch_size=8", "algorithm.weighted=true"])
    assert float(weighted.client_update(make_context(weighted), {"weights": start}).sums["num_samples"]) == 24.0


def test_resnet18_client_step_uses_the_five_levels() -> None:
    algorithm = make_algorithm(["model.name=resnet18", "model.norm=group", "train.local_epochs=1", "train.batch_size=4"], CIFAR_INFO)
    ctx = make_context(algorithm, n=4)
    seen: list[list[int]] = []
    original = fedrcl_module.multi_level_rcl_terms

    def spy(taps, labels, params):
        seen.append([int(tap.shape[1]) for tap in taps])
        return original(taps, labels, params)

    fedrcl_module.multi_level_rcl_terms = spy
    try:
        update = algorithm.client_update(ctx, {"weights": get_flat_weights(ctx.model)})
    finally:
        fedrcl_module.multi_level_rcl_terms = original
    assert seen == [[64, 64, 128, 256, 512]]
    assert torch.isfinite(update.sums["weights"]).all()


def test_epoch_lr_decay_lowers_the_rate_every_local_epoch(monkeypatch: pytest.MonkeyPatch) -> None:
    algorithm = make_algorithm(["train.local_epochs=3", "train.lr=0.1"])
    rates: list[float] = []

    def recording_local_train(ctx, loss_fn, parameters=None, epochs=None):
        rates.append(ctx.lr)
        assert epochs == 1
        return {"train_loss": float(len(rates))}

    monkeypatch.setattr(fedrcl_module, "local_train", recording_local_train)
    update = algorithm.client_update(make_context(algorithm), {"weights": get_flat_weights(algorithm.build_model("global"))})
    assert rates == pytest.approx([0.1, 0.1 * 0.998, 0.1 * 0.998**2])
    assert update.metrics["train_loss"] == pytest.approx(2.0)  # the mean over the epochs


def test_epoch_by_epoch_training_equals_one_call_without_decay() -> None:
    """The per-epoch path restarts the optimiser each epoch; for momentum-free SGD that is the same
    training as one continuous call (decay → 1 makes the two paths comparable)."""
    results = []
    for decay in ("1", "0.9999999999"):
        algorithm = make_algorithm(["train.local_epochs=2", "train.batch_size=8", f"algorithm.epoch_lr_decay={decay}"])
        torch.manual_seed(0)
        ctx = make_context(algorithm)
        results.append(algorithm.client_update(ctx, {"weights": get_flat_weights(algorithm.build_model("global"))}).sums["weights"])
    torch.testing.assert_close(results[0], results[1], rtol=1e-6, atol=1e-7)


def _results(weight_sums: torch.Tensor, count: float) -> RoundResults:
    return RoundResults(
        sums={"weights": weight_sums.double(), "num_samples": torch.tensor(count, dtype=torch.float64)},
        payloads={},
        client_metrics={},
        num_clients=int(count),
        excluded_clients=[],
    )


@pytest.mark.parametrize(("weighted", "expected"), [(False, 2.0), (True, 2.5)])
def test_server_average_is_unweighted_by_default(weighted: bool, expected: float) -> None:
    algorithm = make_algorithm([f"algorithm.weighted={str(weighted).lower()}"])
    models = [algorithm.build_model("global") for _ in range(2)]
    for model, value in zip(models, (1.0, 3.0)):
        set_flat_weights(model, torch.full_like(get_flat_weights(model), value))
    sizes = (10, 30)
    sums = [fedrcl_module.weighted_weights_sums(m, n if weighted else 1) for m, n in zip(models, sizes)]
    state = {"weights": get_flat_weights(models[0])}
    new_state, _ = algorithm.aggregate(
        state, 1, _results(sums[0]["weights"] + sums[1]["weights"], float(sums[0]["num_samples"] + sums[1]["num_samples"]))
    )
    assert torch.allclose(new_state["weights"], torch.full_like(new_state["weights"], expected))
    # m identical models average to that model
    same, _ = algorithm.aggregate(state, 1, _results(3 * get_flat_weights(models[0]).double(), 3.0))
    torch.testing.assert_close(same["weights"], get_flat_weights(models[0]))


def test_example_configs_load_with_the_paper_settings() -> None:
    digits = load_config(EXAMPLES / "fedrcl_digits.yaml")
    assert digits.algorithm.name == "fedrcl" and digits.model.name == "cnn_small"
    assert (digits.train.lr_decay, digits.train.grad_clip) == (0.998, 10)

    paper = load_config(EXAMPLES / "paper_fedrcl_cifar100.yaml")
    extra = paper.algorithm.model_extra
    assert (paper.data.name, paper.data.num_clients, paper.train.clients_per_round) == ("cifar100", 100, 5)
    assert (paper.model.name, paper.model.norm) == ("resnet18", "group")
    assert (extra["variant"], extra["tau"], extra["beta"], extra["lam"], extra["weighted"]) == ("official", 0.05, 1.0, 0.7, False)
    train = paper.train
    assert (train.local_epochs, train.batch_size, train.lr, train.momentum, train.weight_decay) == (5, 50, 0.1, 0.0, 1e-3)
    assert (train.lr_decay, train.grad_clip, train.rounds) == (0.998, 10, 1000)
    # paper and code: lr(t) = 0.1 · 0.998^t with t = round − 1 (the runtime's per-round decay)
    assert train.lr * train.lr_decay ** (1000 - 1) == pytest.approx(0.01353, rel=1e-3)
    FedRCL(paper, DatasetInfo("cifar100", 100, 3, 32, (0.5,) * 3, (0.25,) * 3, "crop_flip"))  # its levels exist
