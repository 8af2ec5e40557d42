"""Config loading and validation: every error names the key and what is allowed."""

from __future__ import annotations

import pytest
import yaml

from fedray.cli.main import main
from fedray import load_config  # the complete validation (schema + the algorithm's keys)
from fedray.config import ConfigError, save_config


def error_of(overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config(None, overrides)
    return str(caught.value)


def test_defaults_are_fedavg_on_digits():
    config = load_config()
    assert (config.algorithm.name, config.data.name, config.model.name) == ("fedavg", "digits", "cnn_small")


def test_yaml_and_overrides_are_merged_and_typed(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"data": {"alpha": 0.3}, "algorithm": {"name": "fedprox", "mu": 0.5}}))
    config = load_config(path, ["data.alpha=0.1", "train.rounds=7", "algorithm.mu=0"])
    assert config.data.alpha == 0.1 and config.train.rounds == 7
    assert config.algorithm.name == "fedprox" and config.algorithm.mu == 0


def test_algorithm_defaults_are_filled_in():
    assert load_config(None, ["algorithm.name=fedprox"]).algorithm.mu == 0.01


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("data.alpha=0", "data.alpha"),
        ("data.alpha=-1", "greater than 0"),
        ("train.lr=0", "train.lr"),
        ("data.name=imagenet", "'digits'"),
        ("model.name=vgg", "model.name"),
        ("train.rounds=many", "train.rounds"),
        ("data.colour=red", "unknown key (allowed: "),
        ("algorithm.name=fedfoo", "unknown algorithm 'fedfoo' (allowed: "),
        ("algorithm.mu=0.1", "algorithm.mu: unknown key"),  # FedAvg has no μ
        ("resources.gpus_per_worker=1.5", "resources.gpus_per_worker"),
    ],
)
def test_invalid_values_name_the_key(override, expected):
    assert expected in error_of([override])


def test_unknown_key_lists_the_allowed_keys():
    message = error_of(["data.colour=red"])
    assert "data.colour" in message and "alpha" in message and "num_clients" in message


def test_clients_per_round_cannot_exceed_clients():
    message = error_of(["data.num_clients=5", "train.clients_per_round=6"])
    assert "train.clients_per_round" in message and "data.num_clients" in message


def test_more_clients_than_samples_fails_before_ray(tmp_path):
    from fedray.runtime import prepare_data

    config = load_config(None, ["data.num_clients=5000", "train.clients_per_round=10", "data.partition=iid"])
    with pytest.raises(ConfigError, match="num_clients"):
        prepare_data(config)


def test_malformed_override_and_missing_file(tmp_path):
    assert "KEY=VALUE" in error_of(["data.alpha"])
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")


def test_saved_config_round_trips(tmp_path):
    config = load_config(None, ["algorithm.name=fedprox", "algorithm.mu=0.2", "data.alpha=0.7"])
    save_config(config, tmp_path / "config.yaml")
    assert load_config(tmp_path / "config.yaml") == config


def test_cli_exits_2_with_the_key_in_the_message(capsys):
    assert main(["run", "--set", "data.alpha=-1", "--quiet"]) == 2
    assert "data.alpha" in capsys.readouterr().err


def test_unknown_algorithm_lists_the_registered_ones():
    message = error_of(["algorithm.name=fedfoo"])
    assert "fedavg" in message and "fedprox" in message


def test_algorithm_checks_that_need_the_data_fail_before_ray():
    from fedray.runtime import prepare_data

    config = load_config(None, ["algorithm.name=fedrcl", "algorithm.levels=[conv9]"])
    with pytest.raises(ConfigError, match=r"algorithm\.levels.*conv9.*allowed"):
        prepare_data(config)


def test_override_words_are_not_yaml_booleans():
    config = load_config(None, ["output.name=off", "output.tensorboard=false"])
    assert config.output.name == "off" and config.output.tensorboard is False
