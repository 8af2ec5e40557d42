"""Tests of the model factory, the FedModel parts and taps, and the flat-weight helpers."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedray.config.schema import MODELS, ModelConfig
from fedray.data.base import DatasetInfo
from fedray.models import (
    MODEL_NAMES,
    FedModel,
    build_model,
    get_flat_weights,
    num_flat_weights,
    set_flat_weights,
    state_keys,
)

torch.set_num_threads(1)


def _info(name: str, channels: int, size: int, classes: int) -> DatasetInfo:
    return DatasetInfo(name, classes, channels, size, (0.5,) * channels, (0.25,) * channels, "none")


DIGITS = _info("digits", 1, 8, 10)
MNIST = _info("mnist", 1, 28, 10)
CIFAR10 = _info("cifar10", 3, 32, 10)
TINY = _info("tinyimagenet", 3, 64, 200)
TEXT = DatasetInfo("pystdlib_chars", 102, 0, 0, (), (), "none", modality="tokens", input_shape=(40,), vocab_size=102)


def _build(name: str, info: DatasetInfo, **cfg: object) -> FedModel:
    torch.manual_seed(0)
    return build_model(ModelConfig(name=name, **cfg), info).eval()


def _batch(info: DatasetInfo, n: int = 2) -> torch.Tensor:
    return torch.randn(n, info.channels, info.image_size, info.image_size)


# (model, dataset, feature_dim, tap shapes without the batch dimension)
RESNET_CIFAR_TAPS = [(64, 32, 32), (64, 32, 32), (128, 16, 16), (256, 8, 8), (512, 4, 4)]
RESNET_TINY_TAPS = [(64, 64, 64), (64, 64, 64), (128, 32, 32), (256, 16, 16), (512, 8, 8)]
CASES = [
    ("cnn_small", DIGITS, 64, [(16, 8, 8), (32, 4, 4), (64,)]),
    ("cnn_small", MNIST, 64, [(16, 28, 28), (32, 14, 14), (64,)]),
    ("cnn_cifar", MNIST, 512, [(32, 12, 12), (64, 4, 4), (512,)]),
    ("cnn_cifar", CIFAR10, 512, [(32, 14, 14), (64, 5, 5), (512,)]),
    ("resnet8", CIFAR10, 256, RESNET_CIFAR_TAPS[:4]),
    ("resnet10", CIFAR10, 512, RESNET_CIFAR_TAPS),
    ("resnet18", CIFAR10, 512, RESNET_CIFAR_TAPS),
    ("resnet8", TINY, 256, RESNET_TINY_TAPS[:4]),
    ("resnet18", TINY, 512, RESNET_TINY_TAPS),
]
CASE_IDS = [f"{name}-{info.name}" for name, info, _, _ in CASES]


def test_registry_matches_config_schema() -> None:
    assert set(MODEL_NAMES) == set(MODELS)


@pytest.mark.parametrize(("name", "info", "feature_dim", "tap_shapes"), CASES, ids=CASE_IDS)
def test_shapes_taps_and_forward(name: str, info: DatasetInfo, feature_dim: int, tap_shapes: list[tuple[int, ...]]) -> None:
    model = _build(name, info, projection_dim=16)
    x = _batch(info)
    features = model.encode(x)
    assert model.feature_dim == feature_dim
    assert features.shape == (2, feature_dim)
    assert model.classify(features).shape == (2, info.num_classes)
    assert model.project(features).shape == (2, 16)

    logits, tap_features, taps = model.forward_with_taps(x)
    assert logits.shape == (2, info.num_classes)
    assert torch.equal(logits, model(x))
    assert torch.equal(tap_features, features)
    assert len(model.tap_names) == len(taps)
    assert [tuple(t.shape[1:]) for t in taps] == tap_shapes


@pytest.mark.parametrize("name", ["resnet8", "resnet18"])
def test_resnet_taps_are_pre_activation_stage_outputs(name: str) -> None:
    """As in FedRCL's code: taps come before each stage's final ReLU; features = GAP(ReLU(last tap))."""
    model = _build(name, CIFAR10, norm="group")
    features, taps = model.encode_with_taps(_batch(CIFAR10))
    assert model.tap_names[0] == "stem"
    assert all((tap < 0).any() for tap in taps)
    expected = F.adaptive_avg_pool2d(F.relu(taps[-1]), 1).flatten(1)
    torch.testing.assert_close(features, expected)


def test_resnet18_has_the_five_fedrcl_taps() -> None:
    model = _build("resnet18", CIFAR10)
    assert model.tap_names == ("stem", "stage1", "stage2", "stage3", "stage4")


@pytest.mark.parametrize("name", ["resnet8", "resnet10"])
def test_resnets_accept_8x8_inputs(name: str) -> None:
    info = _info("tiny_rgb", 3, 8, 10)
    assert _build(name, info)(_batch(info)).shape == (2, 10)


def test_cnn_cifar_rejects_too_small_images() -> None:
    with pytest.raises(ValueError, match="image_size"):
        _build("cnn_cifar", DIGITS)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("projection_dim", [None, 8])
def test_state_dict_keys_are_prefixed_by_part(name: str, projection_dim: int | None) -> None:
    info = TEXT if name == "char_lstm" else MNIST if name.startswith("cnn") else CIFAR10
    keys = list(_build(name, info, projection_dim=projection_dim).state_dict())
    parts = {key.split(".", 1)[0] for key in keys}
    expected = {"encoder", "classifier"} | ({"projector"} if projection_dim else set())
    assert parts == expected


def test_project_without_head_raises_clear_error() -> None:
    model = _build("cnn_small", DIGITS)
    assert model.projector is None
    with pytest.raises(RuntimeError, match="projection_dim"):
        model.project(torch.zeros(2, 64))


def test_projection_head_is_two_layer_mlp() -> None:
    model = _build("resnet8", CIFAR10, projection_dim=32)
    linears = [m for m in model.projector.modules() if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(256, 256), (256, 32)]
    assert any(isinstance(m, nn.ReLU) for m in model.projector.modules())


@pytest.mark.parametrize("name", ["resnet8", "resnet10", "resnet18"])
def test_norm_switch_swaps_norm_layers(name: str) -> None:
    batch = _build(name, CIFAR10, norm="batch")
    group = _build(name, CIFAR10, norm="group")
    batch_norms = [m for m in batch.modules() if isinstance(m, nn.BatchNorm2d)]
    group_norms = [m for m in group.modules() if isinstance(m, nn.GroupNorm)]
    assert batch_norms and len(batch_norms) == len(group_norms)
    assert not any(isinstance(m, nn.GroupNorm) for m in batch.modules())
    assert not any(isinstance(m, nn.BatchNorm2d) for m in group.modules())
    assert all(m.num_groups == 2 for m in group_norms)
    assert not list(group.buffers())  # GroupNorm keeps no running statistics


def _num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_small_cnn_default_is_the_benchmark_model() -> None:
    expected = (1 * 16 * 9 + 16) + (16 * 32 * 9 + 32) + (512 * 64 + 64) + (64 * 10 + 10)
    assert _num_params(_build("cnn_small", DIGITS)) == expected == 38_282


def test_cifar_cnn_has_the_fedcosr_layer_sizes() -> None:
    expected = (3 * 32 * 25 + 32) + (32 * 64 * 25 + 64) + (64 * 5 * 5 * 512 + 512) + (512 * 10 + 10)
    assert _num_params(_build("cnn_cifar", CIFAR10)) == expected


def test_width_scales_the_cnns() -> None:
    small = _build("cnn_small", DIGITS, width=8)
    assert (small.encoder.conv1.out_channels, small.encoder.conv2.out_channels) == (8, 16)
    cifar = _build("cnn_cifar", CIFAR10, width=8)
    _, taps = cifar.encode_with_taps(_batch(CIFAR10))
    assert [t.shape[1] for t in taps[:2]] == [16, 32]


def test_state_keys_are_float_entries_in_state_dict_order() -> None:
    model = _build("resnet8", CIFAR10, norm="batch")
    state = model.state_dict()
    keys = state_keys(model)
    float_suffixes = ("weight", "bias", "running_mean", "running_var")
    assert keys == [k for k in state if k.endswith(float_suffixes)]
    assert not any(k.endswith("num_batches_tracked") for k in keys)
    assert num_flat_weights(model) == sum(state[k].numel() for k in keys)


def test_flat_weights_round_trip_in_place() -> None:
    model = _build("resnet8", CIFAR10, norm="batch")
    x = _batch(CIFAR10)
    before_logits = model(x)
    pointers = [t.data_ptr() for t in model.state_dict().values()]

    flat = get_flat_weights(model)
    assert flat.dtype == torch.float32 and flat.dim() == 1 and not flat.requires_grad
    assert flat.numel() == num_flat_weights(model)
    perturbed = flat + torch.linspace(-0.01, 0.01, flat.numel())
    set_flat_weights(model, perturbed)

    assert torch.equal(get_flat_weights(model), perturbed)
    assert [t.data_ptr() for t in model.state_dict().values()] == pointers
    assert not torch.allclose(model(x), before_logits)
    flat.zero_()  # the returned vector is a copy
    assert torch.equal(get_flat_weights(model), perturbed)


def test_flat_weights_prefix_selects_exactly_the_encoder() -> None:
    model = _build("cnn_small", DIGITS, projection_dim=8)
    encoder_keys = state_keys(model, ("encoder.",))
    assert encoder_keys == [f"encoder.{k}" for k in model.encoder.state_dict()]
    assert num_flat_weights(model, ("encoder.",)) == _num_params(model.encoder)
    assert num_flat_weights(model, ("encoder.", "projector.", "classifier.")) == num_flat_weights(model)

    classifier_before = get_flat_weights(model, ("classifier.",))
    projector_before = get_flat_weights(model, ("projector.",))
    set_flat_weights(model, torch.zeros(num_flat_weights(model, ("encoder.",))), ("encoder.",))
    assert all(torch.count_nonzero(p) == 0 for p in model.encoder.parameters())
    assert torch.equal(get_flat_weights(model, ("classifier.",)), classifier_before)
    assert torch.equal(get_flat_weights(model, ("projector.",)), projector_before)


def test_flat_weight_errors() -> None:
    model = _build("cnn_small", DIGITS)
    with pytest.raises(ValueError, match="38282 elements"):
        set_flat_weights(model, torch.zeros(10))
    with pytest.raises(ValueError, match="projector"):
        get_flat_weights(model, ("projector.",))
