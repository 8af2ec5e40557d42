"""Pretrained weights and frozen parts: ``model.init_strict: false`` (a torchvision backbone saved with
ImageNet's 1000-class head, loaded under a head for this data), ``model.freeze`` (frozen parameters out
of the flat layout that every algorithm exchanges, unchanged by local training), the layout's tied
weights and :func:`fedray.models.parameter_counts`."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
import torchvision
from torch import nn

from fedray import load_config
from fedray.algorithms import get_algorithm_class
from fedray.algorithms.base import ClientContext
from fedray.config import ConfigError
from fedray.config.schema import ModelConfig
from fedray.data import DatasetInfo
from fedray.data.augment import get_augmentation
from fedray.models import SmallCNN, build_model, get_flat_weights, num_flat_weights, parameter_counts, set_flat_weights, state_keys
from fedray.models.weights import parameter_mask, parameter_views
from fedray.seeding import seed_client

CIFAR = DatasetInfo("cifar10", 10, 3, 32, (0.5,) * 3, (0.25,) * 3, "none")
DIGITS = DatasetInfo("digits", 10, 1, 8, (0.5,), (0.25,), "none")


@pytest.fixture(scope="module")
def imagenet_resnet18(tmp_path_factory) -> Path:
    """A state_dict shaped as torchvision's ImageNet weights (1000 classes), as ``torch.save`` writes it."""
    torch.manual_seed(7)
    path = tmp_path_factory.mktemp("weights") / "resnet18_imagenet.pt"
    torch.save(torchvision.models.resnet18(num_classes=1000).state_dict(), path)
    return path


def _one_line(error: pytest.ExceptionInfo) -> str:
    """The problem line of a ConfigError (``fedray`` prints it under ``invalid config:``): one line."""
    message = error.value.detail
    assert "\n" not in message and not error.value.more, message
    return message


# ---------------------------------------------------------------------- model.init_strict


def test_an_imagenet_backbone_loads_non_strictly_under_a_new_head(imagenet_resnet18, caplog):
    state = torch.load(imagenet_resnet18, weights_only=True)
    config = ModelConfig(name="torchvision:resnet18", init=str(imagenet_resnet18), init_strict=False)
    with caplog.at_level(logging.WARNING, logger="fedray.models"):
        torch.manual_seed(0)
        model = build_model(config, CIFAR)
        torch.manual_seed(0)
        build_model(config, CIFAR)  # the server, the workers and the checks each build one: one warning
    backbone = {key: value for key, value in state.items() if not key.startswith("fc.")}
    assert backbone and all(torch.equal(model.encoder.state_dict()[key], value) for key, value in backbone.items())
    torch.manual_seed(0)
    fresh = build_model(ModelConfig(name="torchvision:resnet18"), CIFAR)
    assert model.classifier.weight.shape == (10, 512)
    assert torch.equal(model.classifier.weight, fresh.classifier.weight) and torch.equal(model.classifier.bias, fresh.classifier.bias)
    warnings = [record.getMessage() for record in caplog.records if str(imagenet_resnet18) in record.getMessage()]
    assert len(warnings) == 1, warnings
    assert "classifier.weight [1000, 512] vs [10, 512]" in warnings[0] and "classifier.bias [1000] vs [10]" in warnings[0]
    assert f"loaded {len(backbone)} of the model's" in warnings[0]


def test_strict_init_refuses_the_imagenet_head_in_one_line(imagenet_resnet18):
    with pytest.raises(ConfigError) as error:
        build_model(ModelConfig(name="torchvision:resnet18", init=str(imagenet_resnet18)), CIFAR)
    message = _one_line(error)
    assert message.startswith("model.init: ") and "shape of classifier.weight [1000, 512] vs [10, 512]" in message
    assert "model.init_strict: false" in message


def test_a_file_that_matches_nothing_is_refused_even_non_strictly(tmp_path):
    torch.save({"backbone.weight": torch.zeros(3, 3), "encoder.conv1.weight": torch.zeros(1)}, tmp_path / "other.pt")
    with pytest.raises(ConfigError) as error:
        build_model(ModelConfig(init=str(tmp_path / "other.pt"), init_strict=False), DIGITS)
    assert _one_line(error).startswith(f"model.init: {tmp_path / 'other.pt'} matches no entry of model SmallCNN by name and shape")


def test_non_strict_loading_skips_only_what_does_not_fit(tmp_path, caplog):
    torch.manual_seed(1)
    state = SmallCNN(1, 8, 10).state_dict()
    partial = {key: value for key, value in state.items() if key != "classifier.bias"} | {"extra.weight": torch.ones(2)}
    torch.save(partial, tmp_path / "partial.pt")
    with caplog.at_level(logging.WARNING, logger="fedray.models"):
        model = build_model(ModelConfig(init=str(tmp_path / "partial.pt"), init_strict=False), DIGITS)
    assert all(torch.equal(model.state_dict()[key], state[key]) for key in state if key != "classifier.bias")
    message = next(record.getMessage() for record in caplog.records if "partial.pt" in record.getMessage())
    assert "not in the file: classifier.bias" in message and "not in the model: extra.weight" in message


# ---------------------------------------------------------------------- model.freeze


@pytest.fixture
def cnn_weights(tmp_path) -> str:
    torch.manual_seed(3)
    path = tmp_path / "cnn.pt"
    torch.save(SmallCNN(1, 8, 10).state_dict(), path)
    return str(path)


def test_frozen_parameters_leave_the_flat_layout(cnn_weights):
    model = build_model(ModelConfig(init=cnn_weights, freeze=["encoder.conv1", "encoder.conv2"]), DIGITS)
    assert state_keys(model) == ["encoder.fc.weight", "encoder.fc.bias", "classifier.weight", "classifier.bias"]
    assert model.frozen_keys == {"encoder.conv1.weight", "encoder.conv1.bias", "encoder.conv2.weight", "encoder.conv2.bias"}
    assert {name for name, p in model.named_parameters() if not p.requires_grad} == model.frozen_keys
    assert num_flat_weights(model) == 512 * 64 + 64 + 64 * 10 + 10 == parameter_counts(model)["parameters_uploaded"]
    assert parameter_counts(model)["parameters_total"] == 38_282
    assert parameter_mask(model).numel() == num_flat_weights(model)
    views = parameter_views(model, torch.arange(num_flat_weights(model), dtype=torch.float32))
    frozen_views = [view for (name, _), view in zip(model.named_parameters(), views) if name in model.frozen_keys]
    assert all(not view.any() for view in frozen_views)  # no slice: zeros
    assert torch.equal(views[-1], torch.arange(num_flat_weights(model) - 10, num_flat_weights(model), dtype=torch.float32))


def test_without_freeze_the_layout_is_every_floating_point_entry(cnn_weights):
    model = build_model(ModelConfig(init=cnn_weights), DIGITS)
    assert model.frozen_keys == frozenset()
    assert state_keys(model) == list(model.state_dict())
    counts = parameter_counts(model)
    assert counts == {"parameters_total": 38_282, "parameters_uploaded": 38_282}


@pytest.mark.parametrize("algorithm", ["fedavg", "scaffold"])
def test_local_training_leaves_frozen_parameters_as_loaded(cnn_weights, algorithm):
    """A real client update of an unchanged algorithm: it trains and uploads the trainable part only."""
    config = load_config(
        None,
        [f"algorithm.name={algorithm}", f"model.init={cnn_weights}", "model.freeze=[encoder.conv1, encoder.conv2]", "train.local_epochs=1"],
    )
    algo = get_algorithm_class(algorithm)(config, DIGITS)
    torch.manual_seed(config.seed)
    model = algo.build_model("global")
    loaded = torch.load(cnn_weights, weights_only=True)
    server = algo.init_server_state(model)
    assert server["weights"].numel() == num_flat_weights(model) < sum(p.numel() for p in model.parameters())
    generator = torch.Generator().manual_seed(0)
    ctx = ClientContext(
        client_id=0,
        round=1,
        model=model,
        x=torch.randint(0, 256, (32, 1, 8, 8), dtype=torch.uint8, generator=generator),
        y=torch.randint(0, 10, (32,), generator=generator),
        info=DIGITS,
        train=config.train,
        lr=config.train.lr,
        device=torch.device("cpu"),
        generator=seed_client(config.seed, 1, 0),
        augment=get_augmentation("none"),
    )
    update = algo.client_update(ctx, algo.broadcast(server, 1))
    assert update.sums["weights"].numel() == num_flat_weights(model)
    for key in model.frozen_keys:
        assert torch.equal(model.state_dict()[key], loaded[key]), key
    assert not torch.equal(model.state_dict()["encoder.fc.weight"], loaded["encoder.fc.weight"])


def test_freeze_without_weights_from_a_file_is_refused():
    with pytest.raises(ConfigError) as error:
        build_model(ModelConfig(freeze=["encoder."]), DIGITS)
    assert _one_line(error).startswith("model.freeze: frozen parameters are never sent") and "model.init" in error.value.detail


def test_freezing_a_part_the_file_did_not_supply_is_refused(tmp_path, imagenet_resnet18):
    config = ModelConfig(name="torchvision:resnet18", init=str(imagenet_resnet18), init_strict=False, freeze=["classifier"])
    with pytest.raises(ConfigError) as error:
        build_model(config, CIFAR)
    assert _one_line(error).startswith("model.freeze: classifier.bias, classifier.weight would keep a random initialisation")
    backbone = build_model(config.model_copy(update={"freeze": ["encoder"]}), CIFAR)  # the loaded part may be frozen
    parameters = {name for name, _ in backbone.named_parameters()}
    assert [key for key in state_keys(backbone) if key in parameters] == ["classifier.weight", "classifier.bias"]
    # BatchNorm statistics are buffers that training mode updates: they stay in the layout, averaged
    assert "encoder.bn1.running_mean" in state_keys(backbone)


@pytest.mark.parametrize(
    ("prefix", "nearest"),
    [
        ("encoder.conv", "the parameters under encoder are in encoder.conv1, encoder.conv2, encoder.fc"),  # whole name parts
        ("decoder", "its parameters are in encoder, classifier"),
        ("encoder.conv1.weights", "the parameters under encoder.conv1 are in encoder.conv1.weight, encoder.conv1.bias"),
    ],
)
def test_a_prefix_that_matches_no_parameter_is_refused_with_what_it_could_name(cnn_weights, prefix, nearest):
    with pytest.raises(ConfigError) as error:
        build_model(ModelConfig(init=cnn_weights, freeze=["encoder.fc", prefix]), DIGITS)
    assert _one_line(error) == f"model.freeze: {prefix!r} matches no parameter of SmallCNN ({nearest})"


def test_the_layout_of_a_shapes_only_build_is_the_real_ones(cnn_weights):
    config = ModelConfig(init=cnn_weights, freeze=["encoder.conv1"])
    with torch.device("meta"):  # parameter masks and splits are built so
        shapes = build_model(config, DIGITS)
    assert state_keys(shapes) == state_keys(build_model(config, DIGITS))


def test_a_frozen_copy_keeps_the_layout():
    """Algorithms deep-copy models and turn requires_grad off (teachers): the layout must not change."""
    import copy

    model = build_model(ModelConfig(), DIGITS)
    copied = copy.deepcopy(model).requires_grad_(False)
    assert state_keys(copied) == state_keys(model)


# ---------------------------------------------------------------------- tied weights


class TiedLanguageModel(nn.Module):
    """An output layer that is the input embedding (as GPT-2's): one tensor under two names."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(12, 4)
        self.output = nn.Linear(4, 12, bias=False)
        self.output.weight = self.embedding.weight


def test_a_tied_tensor_is_in_the_layout_once():
    model = TiedLanguageModel()
    assert list(model.state_dict()) == ["embedding.weight", "output.weight"]
    assert state_keys(model) == ["embedding.weight"] and num_flat_weights(model) == 48
    assert parameter_counts(model) == {"parameters_total": 48, "parameters_uploaded": 48}
    set_flat_weights(model, torch.arange(48, dtype=torch.float32))
    assert torch.equal(model.output.weight.flatten(), torch.arange(48, dtype=torch.float32))
    assert torch.equal(get_flat_weights(model), torch.arange(48, dtype=torch.float32))
    assert parameter_mask(model).all()
