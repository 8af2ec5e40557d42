"""Your own model (``model.name: package.module:Name``, ``torchvision:NAME``, ``model.init``) and what
each algorithm requires of the model and the config (``Algorithm.requires``).

The user's module is a real file in a temporary directory, imported from there as fedray imports it
(the current directory, or the command's working directory for the CLI cases).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from fedray import load_config
from fedray.algorithms import get_algorithm_class
from fedray.algorithms.personalized import ParameterSplit
from fedray.config import ConfigError
from fedray.config.schema import ModelConfig
from fedray.data import DatasetInfo
from fedray.models import FedModel, SmallCNN, build_model, get_flat_weights, num_flat_weights
from fedray.models.checks import check_model_output, example_batch
from fedray.models.wrap import WrappedModule
from fedray.plugins import user_module_paths
from fedray.runtime.experiment import prepare_data
from test_alg_fedsc import context, initial_model, setup
from preloaded_cli import run_fedray_preloaded
from test_bad_inputs import assert_rejected, create_files, tree
from test_plugins import subprocess_env

DIGITS = DatasetInfo("digits", 10, 1, 8, (0.5,), (0.25,), "none")
PERSONALISED = ["data.client_test_fraction=0.25", "eval.personalized=true"]
MODULE = "fedray_test_user_nets"  # a name no other test module imports

USER_MODULE = '''
import torch
from torch import nn

import fedray


class PlainCNN(nn.Module):
    """cnn_small's architecture as a plain module: the classifier is `head`, the last nn.Linear."""

    def __init__(self, in_channels, image_size, num_classes, width=16):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1), nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
            nn.Linear(2 * width * (image_size // 2) ** 2, 64), nn.ReLU(),
        )
        self.head = nn.Linear(64, num_classes)

    def forward(self, x):
        return self.head(self.body(x))


def sequential(channels, num_classes, hidden=32):
    """A factory (not a class) that names `channels`, not `in_channels`, and takes model.kwargs."""
    return nn.Sequential(nn.Flatten(), nn.Linear(channels * 64, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))


class DropoutHead(nn.Module):
    """Its classifier is a Sequential(Dropout, Linear) named `head`: model.classifier=head."""

    def __init__(self, num_classes):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(64, 24), nn.ReLU())
        self.head = nn.Sequential(nn.Dropout(0.5), nn.Linear(24, num_classes))

    def forward(self, x):
        return self.head(self.body(x))


class SoftmaxAfterTheClassifier(nn.Module):
    def __init__(self, num_classes):
        super().__init__()
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x):
        return torch.log_softmax(self.fc(x.flatten(1)), dim=1)


def seven_classes():
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 7))


class TinyFedModel(fedray.FedModel):
    """A FedModel subclass: used as is, with its own tap."""

    tap_names = ("hidden",)

    def __init__(self, in_channels, image_size, num_classes):
        super().__init__()
        self.feature_dim = 32
        self.encoder = nn.Sequential(nn.Flatten(), nn.Linear(in_channels * image_size**2, 32), nn.ReLU())
        self.projector = None
        self.classifier = nn.Linear(32, num_classes)

    def encode_with_taps(self, x):
        features = self.encoder(x)
        return features, [features]
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """The user's module, written to a temporary directory made the current directory."""
    (tmp_path / f"{MODULE}.py").write_text(USER_MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield tmp_path
    sys.modules.pop(MODULE, None)


def model_config(name: str, **keys) -> ModelConfig:
    return ModelConfig(name=f"{MODULE}:{name}" if ":" not in name else name, **keys)


# ---------------------------------------------------------------------- wrapping a plain nn.Module


def test_a_plain_module_is_wrapped_with_fedmodel_prefixes_and_its_own_logits(user_module):
    torch.manual_seed(0)
    wrapped = build_model(model_config("PlainCNN"), DIGITS)
    from fedray_test_user_nets import PlainCNN

    torch.manual_seed(0)
    plain = PlainCNN(1, 8, 10)
    assert isinstance(wrapped, WrappedModule) and wrapped.classifier_name == "head"
    keys = list(wrapped.state_dict())
    assert all(key.startswith(("encoder.", "classifier.")) for key in keys)
    assert [key for key in keys if key.startswith("classifier.")] == ["classifier.weight", "classifier.bias"]
    assert (wrapped.feature_dim, wrapped.tap_names, wrapped.projector) == (64, (), None)
    assert num_flat_weights(wrapped) == num_flat_weights(SmallCNN(1, 8, 10)) == 38_282  # cnn_small's architecture
    x = example_batch(DIGITS, 5)
    assert torch.equal(wrapped(x), plain(x))
    assert wrapped.encode(x).shape == (5, 64)
    check_model_output(wrapped, DIGITS, "PlainCNN")


def test_a_factory_gets_the_dataset_arguments_it_names_and_model_kwargs(user_module):
    model = build_model(model_config("sequential", kwargs={"hidden": 12}), DIGITS)
    assert model.feature_dim == 12 and model.classifier.out_features == 10
    assert model(example_batch(DIGITS)).shape == (2, 10)


def test_model_classifier_names_a_head_that_is_not_a_linear(user_module):
    model = build_model(model_config("DropoutHead", classifier="head"), DIGITS)
    assert model.feature_dim == 24
    assert [key for key in model.state_dict() if key.startswith("classifier.")] == ["classifier.1.weight", "classifier.1.bias"]
    check_model_output(model, DIGITS, "DropoutHead")
    with pytest.raises(ConfigError, match="model.classifier: DropoutHead has no submodule 'tail'"):
        build_model(model_config("DropoutHead", classifier="tail"), DIGITS)


def test_a_fedmodel_subclass_is_used_as_is_with_a_projection_head(user_module):
    model = build_model(model_config("TinyFedModel", projection_dim=8), DIGITS)
    assert type(model).__name__ == "TinyFedModel" and isinstance(model, FedModel)
    assert model.tap_names == ("hidden",) and model.project(model.encode(example_batch(DIGITS))).shape == (2, 8)
    with pytest.raises(ConfigError, match="model.classifier: .* builds a fedray.FedModel, which names its own classifier"):
        build_model(model_config("TinyFedModel", classifier="classifier"), DIGITS)


def test_a_classifier_that_is_not_applied_last_or_a_wrong_class_count_is_refused(user_module):
    with pytest.raises(ValueError, match="'fc' is not the last layer applied to the features"):
        check_model_output(build_model(model_config("SoftmaxAfterTheClassifier"), DIGITS), DIGITS, "m")
    with pytest.raises(ValueError, match=r"maps a batch of shape \[2, 1, 8, 8\] to \[2, 7\]; fedray needs logits \[2, 10\]"):
        check_model_output(build_model(model_config("seven_classes"), DIGITS), DIGITS, "m")


def test_the_users_module_is_shipped_with_the_run(user_module):
    config = load_config(None, [f"model.name={MODULE}:PlainCNN"])
    assert user_module_paths(config) == [str(user_module / f"{MODULE}.py")]
    assert user_module_paths(load_config(None, ["model.name=torchvision:resnet18"])) == []  # installed


# ---------------------------------------------------------------------- algorithms on a wrapped model


@pytest.mark.parametrize("algorithm", ["fedproto", "fedsc"])
def test_prototype_algorithms_train_a_wrapped_model(user_module, algorithm):
    """A client update of a prototype algorithm (features = the classifier's input) on a wrapped model."""
    _, data, alg = setup(algorithm, f"model.name={MODULE}:PlainCNN")
    model = initial_model(alg)
    broadcast = alg.broadcast(alg.init_server_state(model), 1)
    before = get_flat_weights(model)
    update = alg.client_update(context(alg, data, model, 0, 1), broadcast)
    assert not torch.equal(get_flat_weights(model), before)  # it trained
    prototypes = update.sums["class_sums"] if algorithm == "fedproto" else update.payload["prototypes"]
    assert prototypes.shape == (10, 64) and torch.isfinite(prototypes).all()  # per-class means of the classifier's input
    assert prototypes.abs().sum() > 0


def test_a_personal_head_splits_by_prefix_on_a_wrapped_model(user_module):
    model = build_model(model_config("PlainCNN"), DIGITS)
    split = ParameterSplit.from_model(model, ("classifier.",))
    assert split.personal_keys == ("classifier.weight", "classifier.bias") and split.num_personal == 64 * 10 + 10


# ---------------------------------------------------------------------- torchvision


def test_torchvision_resnet18_builds_untrained_with_the_class_count():
    grey = build_model(ModelConfig(name="torchvision:resnet18"), DIGITS)  # 1 channel: repeated to 3
    assert grey.classifier.weight.shape == (10, 512) and grey.feature_dim == 512
    assert grey.encoder.conv1.in_channels == 3 and grey.grey_to_rgb
    check_model_output(grey, DIGITS, "torchvision:resnet18")
    colour = DatasetInfo("cifar10", 10, 3, 32, (0.5,) * 3, (0.25,) * 3, "crop_flip")
    check_model_output(build_model(ModelConfig(name="torchvision:resnet18"), colour), colour, "torchvision:resnet18")
    with pytest.raises(ConfigError, match="model.kwargs: weights: fedray builds torchvision models untrained"):
        build_model(ModelConfig(name="torchvision:resnet18", kwargs={"weights": "DEFAULT"}), DIGITS)
    with pytest.raises(ConfigError, match="'resnet19' is not a torchvision classification model"):
        load_config(None, ["model.name=torchvision:resnet19"])


# ---------------------------------------------------------------------- model.init


def test_model_init_loads_the_wrapped_or_the_modules_own_state_dict(user_module):
    torch.manual_seed(1)
    trained = build_model(model_config("PlainCNN"), DIGITS)
    torch.save(trained.state_dict(), "wrapped.pt")
    from fedray_test_user_nets import PlainCNN

    torch.manual_seed(2)
    own = PlainCNN(1, 8, 10)
    torch.save(own.state_dict(), "own.pt")  # keys body.0.weight ... head.weight
    for path, source in (("wrapped.pt", trained), ("own.pt", own)):
        torch.manual_seed(3)
        loaded = build_model(model_config("PlainCNN", init=path), DIGITS)
        x = example_batch(DIGITS)
        assert torch.equal(loaded(x), source(x)), path
    # a built-in model, with a projection head that the file does not hold (it keeps its initialisation)
    torch.save(SmallCNN(1, 8, 10).state_dict(), "cnn.pt")
    with_head = build_model(ModelConfig(name="cnn_small", projection_dim=4, init="cnn.pt"), DIGITS)
    assert torch.equal(with_head.classifier.weight, torch.load("cnn.pt")["classifier.weight"])
    with torch.device("meta"):  # a shapes-only build (parameter masks, splits) reads no file
        build_model(ModelConfig(name="cnn_small", init="cnn.pt"), DIGITS)


def test_model_init_errors_name_the_key(user_module):
    with pytest.raises(ConfigError, match=r"model.init: no file .*nowhere.pt"):
        build_model(ModelConfig(init="nowhere.pt"), DIGITS)
    state = SmallCNN(1, 8, 10).state_dict()
    torch.save({**state, "classifier.weight": torch.zeros(3, 64)}, "shape.pt")
    mismatch = r"model.init: .*shape.pt does not fit model SmallCNN: shape of classifier.weight \[3, 64\] vs \[10, 64\]"
    with pytest.raises(ConfigError, match=mismatch):
        build_model(ModelConfig(init="shape.pt"), DIGITS)
    torch.save({key: value for key, value in state.items() if key != "classifier.bias"} | {"extra": torch.zeros(1)}, "keys.pt")
    with pytest.raises(ConfigError, match="missing classifier.bias; unexpected extra"):
        build_model(ModelConfig(init="keys.pt"), DIGITS)
    Path("junk.pt").write_text("not a checkpoint")
    with pytest.raises(ConfigError, match=r"model.init: cannot load .*junk.pt with torch.load\(weights_only=True\)"):
        build_model(ModelConfig(init="junk.pt"), DIGITS)


def test_model_init_is_made_absolute_and_other_keys_only_apply_to_external_models(user_module):
    assert load_config(None, ["model.init=w.pt"]).model.init == str(user_module / "w.pt")
    with pytest.raises(ConfigError, match="model.kwargs: applies to torchvision:NAME and package.module:Name models"):
        load_config(None, ["model.kwargs={hidden: 3}"])
    with pytest.raises(ConfigError, match="model.name: unknown model; choose one of cnn_small"):
        load_config(None, ["model.name=vgg"])


# ---------------------------------------------------------------------- algorithm requirements


def test_every_personalised_algorithm_requires_per_client_test_splits():
    from fedray.algorithms.requirements import BATCHNORM, FEATURE_TAPS, IMAGES, PERSONAL_TEST_SPLITS, PROJECTION_HEAD

    for name in ("fedper", "fedrep", "lg_fedavg", "ditto", "fedcosr", "local", "fedbn"):
        assert PERSONAL_TEST_SPLITS in get_algorithm_class(name).requires, name
    assert BATCHNORM in get_algorithm_class("fedbn").requires
    assert PROJECTION_HEAD in get_algorithm_class("moon").requires
    assert FEATURE_TAPS in get_algorithm_class("fedrcl").requires
    for name in ("fedavg_byol", "fedema", "fedu", "hetero_ssfl"):
        assert IMAGES in get_algorithm_class(name).requires, name
    assert get_algorithm_class("fedavg").requires == frozenset()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algorithm.name=fedbn", *PERSONALISED], "model.name / model.norm: fedbn needs BatchNorm layers and model 'cnn_small' has none"),
        (
            ["algorithm.name=fedbn", "model.name=resnet8", "model.norm=group", *PERSONALISED],
            "model.name / model.norm: fedbn needs BatchNorm layers and model 'resnet8' has none",
        ),
        (["algorithm.name=fedrep"], "data.client_test_fraction / eval.personalized: fedrep needs per-client test splits"),
        (
            ["algorithm.name=fedrcl", f"model.name={MODULE}:PlainCNN"],
            f"model.name: fedrcl needs intermediate feature maps (the model's tap_names) and model '{MODULE}:PlainCNN' has none",
        ),
        (
            ["algorithm.name=fedavg_byol", "data.name=breast_cancer", "model.name=mlp", "data.num_clients=4", "train.clients_per_round=2"],
            "data.name: fedavg_byol needs images (it trains on two augmented views of each) and data.name='breast_cancer' holds features",
        ),
    ],
)
def test_an_unmet_requirement_is_a_config_error_before_ray(user_module, overrides, message):
    with pytest.raises(ConfigError) as raised:
        prepare_data(load_config(None, overrides))
    assert message in str(raised.value) and len(str(raised.value).splitlines()) == 2


def test_met_requirements_pass(user_module):
    prepare_data(load_config(None, ["algorithm.name=fedbn", "model.name=resnet8", *PERSONALISED]))
    prepare_data(load_config(None, ["algorithm.name=fedrcl", f"model.name={MODULE}:TinyFedModel"]))


# ---------------------------------------------------------------------- the CLI: exit 2, one line, nothing written


def _bad_weights(path: Path) -> None:
    torch.save({"encoder.fc.weight": torch.zeros(2, 2)}, path)


CLI_CASES = [
    (
        "module-does-not-import",
        ["run", "--set", "model.name=nets:Net"],
        {"nets.py": "import no_such_package_anywhere\n"},
        "model.name: cannot import module 'nets' of 'nets:Net' (ModuleNotFoundError",
    ),
    (
        "output-shape",
        ["run", "--set", "model.name=nets:seven_classes"],
        {"nets.py": USER_MODULE},
        "model.name: nets:seven_classes maps a batch of shape [2, 1, 8, 8] to [2, 7]; fedray needs logits [2, 10]",
    ),
    (
        "weights-mismatch",
        ["run", "--set", "model.init=w.pt"],
        {"w.pt": _bad_weights},
        "does not fit model SmallCNN: missing encoder.conv1.weight",
    ),
    (
        "fedbn-on-cnn-small",
        ["run", "--set", "algorithm.name=fedbn", "--set", "data.client_test_fraction=0.25", "--set", "eval.personalized=true"],
        {},
        "model.name / model.norm: fedbn needs BatchNorm layers",
    ),
    (
        "fedper-without-client-test-splits",
        ["run", "--set", "algorithm.name=fedper"],
        {},
        "set data.client_test_fraction=0.25 and eval.personalized=true",
    ),
]


@pytest.mark.parametrize(("args", "files", "expected"), [case[1:] for case in CLI_CASES], ids=[case[0] for case in CLI_CASES])
def test_bad_model_inputs_exit_2_with_one_line_and_write_nothing(tmp_path, args, files, expected):
    create_files(tmp_path, files)
    before = tree(tmp_path)
    result = run_fedray_preloaded(args, tmp_path)
    assert_rejected(result, expected)
    assert tree(tmp_path) == before


# ---------------------------------------------------------------------- end to end

# ``fedray run`` training the user's model (``my_model:DigitsNet`` with ``model.kwargs``) from its working
# directory: ``test_plugins.py::test_fedray_run_cli_runs_a_users_algorithm_callback_and_model``; its server
# and Ray worker actors importing the shipped module: ``test_plugins.py::test_python_api_runs_users_code_on_the_session_ray``.


@pytest.mark.slow
def test_the_example_model_module_runs_every_way_its_docstring_shows(tmp_path):
    """examples/plugins/my_model.py with examples/my_model_digits.yaml (copied, laid out as in examples/),
    checked as `fedray run` does before Ray starts, from the module's directory as its docstring says."""
    examples = Path(__file__).resolve().parents[2] / "examples"
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    shutil.copy(examples / "plugins" / "my_model.py", plugins)
    shutil.copy(examples / "my_model_digits.yaml", tmp_path)
    code = textwrap.dedent("""
        from fedray.plugins import load_config
        from fedray.runtime.experiment import prepare_data
        for overrides in ([], ["algorithm.name=fedbn", "data.client_test_fraction=0.25", "eval.personalized=true"],
                          ["model.name=my_model:TappedDigitsNet", "algorithm.name=fedrcl"]):
            prepare_data(load_config("../my_model_digits.yaml", overrides))
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", code], cwd=plugins, capture_output=True, text=True, env=subprocess_env(), timeout=300)
    assert result.stdout.strip() == "ok", result.stderr[-3000:]
