"""ConfigError carries the key and the message as attributes, so callers never parse its text; its
``str()`` is the text ``fedray`` prints (tests/config/test_bad_inputs.py checks it on the command line)."""

from __future__ import annotations

import pickle

import pytest

from fedray.config import ConfigError, load_config_sections, read_yaml
from fedray.tune import parse_sweep


def refused(overrides: list[str]) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        load_config_sections(None, overrides)
    return caught.value


def test_a_field_the_schema_refuses_is_its_key_and_message():
    error = refused(["seed=-1"])
    assert (error.key, error.message, error.within, error.more) == (
        "seed",
        "Input should be greater than or equal to 0 (got -1)",
        "config",
        (),
    )
    assert str(error) == "invalid config:\n  seed: Input should be greater than or equal to 0 (got -1)"
    assert error.detail == "seed: Input should be greater than or equal to 0 (got -1)"


def test_an_unknown_key_lists_the_allowed_ones():
    error = refused(["data.colour=red"])
    assert error.key == "data.colour"
    assert error.message.startswith("unknown key (allowed: alpha, augmentation, ")
    assert str(error) == f"invalid config:\n  data.colour: {error.message}"


def test_several_refused_fields_are_the_first_problem_and_the_others_one_line_each():
    error = refused(["seed=-1", "data.colour=red", "model.width=100000"])
    assert error.key == "seed"
    assert [key for key, _ in error.more] == ["data.colour", "model.width"]
    assert str(error).splitlines() == [
        "invalid config:",
        "  seed: Input should be greater than or equal to 0 (got -1)",
        f"  data.colour: {error.more[0][1]}",
        "  model.width: Input should be less than or equal to 1024 (got 100000)",
    ]


def test_cross_field_checks_name_their_keys():
    section = refused(["systems.enabled=true", "systems.devices.source=file"])  # a section's own check: keyed by the section
    assert (section.key, section.message) == ("systems.devices", "source=file needs systems.devices.file (got {'source': 'file'})")
    whole = refused(["data.num_clients=5", "train.clients_per_round=6"])  # across sections: the message names both keys
    assert (whole.key, whole.message) == (None, "train.clients_per_round (6) must be <= data.num_clients (5)")
    assert str(whole) == "invalid config:\n  train.clients_per_round (6) must be <= data.num_clients (5)"


def test_a_file_or_command_line_problem_stands_without_the_header(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("seed: 1\nseed: 2\n")
    with pytest.raises(ConfigError) as caught:
        read_yaml(path)
    error = caught.value
    assert (error.key, error.within) == (str(path), None)
    assert error.message == "not valid YAML at line 2, column 1: duplicate key 'seed'"
    assert str(error) == f"{path}: not valid YAML at line 2, column 1: duplicate key 'seed'"
    error = refused(["data.alpha"])
    assert (error.key, error.message, error.within) == ("--set 'data.alpha'", "expected KEY=VALUE, e.g. --set data.alpha=0.1", None)


def test_a_sweep_trial_with_an_invalid_run_config_keeps_the_trials_key_and_message(tmp_path):
    raw = {
        "base": {"data": {"num_clients": 6}, "train": {"rounds": 4, "clients_per_round": 3}},
        "space": {"data.alpha": {"uniform": [-1, 1]}},
        "output": {"dir": str(tmp_path)},
    }
    with pytest.raises(ConfigError) as caught:
        parse_sweep(raw, "tune.yaml", tmp_path)
    error = caught.value
    assert (error.key, error.message) == ("data.alpha", "Input should be greater than 0 (got -1)")
    assert error.within == "sweep file tune.yaml: the trial with data.alpha=-1 has an invalid run config"
    assert str(error) == (
        "invalid sweep file tune.yaml: the trial with data.alpha=-1 has an invalid run config:\n"
        "  data.alpha: Input should be greater than 0 (got -1)"
    )
    assert error.detail == "data.alpha: Input should be greater than 0 (got -1)"  # what the sweep records for such a trial


def test_a_sweep_files_own_key_is_named_under_the_files_header(tmp_path):
    with pytest.raises(ConfigError) as caught:
        parse_sweep({"space": {"data.alpha": {"grid": [0.1]}}, "metric": "accuracy"}, "tune.yaml", tmp_path)
    error = caught.value
    assert (error.key, error.within) == ("metric", "sweep file tune.yaml")
    assert str(error).startswith("invalid sweep file tune.yaml:\n  metric: unknown metric 'accuracy' (allowed: test_accuracy, ")


def test_the_attributes_survive_a_pickle():  # Ray carries an error raised in an actor or a trial to the driver
    error = ConfigError("data.path", "runs/x does not exist", within=None, more=[("data.root", "missing")])
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.key, copy.message, copy.within, copy.more, str(copy)) == (
        "data.path",
        "runs/x does not exist",
        None,
        (("data.root", "missing"),),
        "data.path: runs/x does not exist\n  data.root: missing",
    )
