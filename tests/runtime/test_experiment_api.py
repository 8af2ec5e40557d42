"""fedray.run_experiment as a notebook calls it (fedray/runtime/experiment.py), on the local backend:
a plain mapping of config sections is validated and run like a RunConfig, a bad key in it is a
ConfigError naming the key, anything else a TypeError that says what to pass."""

from __future__ import annotations

import pytest

import fedray
from fedray.config import ConfigError


def tiny(tmp_path) -> dict:
    return {
        "resources": {"backend": "local", "num_workers": 1},
        "data": {"num_clients": 4},
        "train": {"rounds": 1, "clients_per_round": 2, "local_epochs": 1},
        "output": {"dir": str(tmp_path), "name": "run", "tensorboard": False, "plots": False},
    }


def test_a_plain_mapping_runs_like_the_run_config_it_validates_to(tmp_path):
    summary = fedray.run_experiment(tiny(tmp_path), progress=False)
    assert (summary.rounds, summary.backend, summary.run_dir) == (1, "local", str(tmp_path / "run"))
    assert fedray.load_config(tmp_path / "run" / "config.yaml").train.clients_per_round == 2


def test_a_mapping_with_a_bad_key_is_a_config_error_and_anything_else_a_type_error(tmp_path):
    bad = tiny(tmp_path)
    bad["train"]["roundz"] = 3
    with pytest.raises(ConfigError, match="train.roundz: unknown key"):
        fedray.run_experiment(bad, progress=False)
    with pytest.raises(TypeError, match=r"takes a RunConfig or a mapping of config sections, not a str; fedray.load_config\(path\)"):
        fedray.run_experiment("examples/fedprox_digits.yaml", progress=False)
    assert not (tmp_path / "run").exists()
