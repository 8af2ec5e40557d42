"""fedray.run_experiment as a notebook calls it (fedray/runtime/experiment.py), on the local backend:
a plain mapping of config sections is validated and run like a RunConfig, a bad key in it is a
ConfigError naming the key, anything else a TypeError that says what to pass; the name of a new run's
directory is a plain, filesystem-safe name whatever the dataset is called."""

from __future__ import annotations

import pytest

import fedray
from fedray.config import ConfigError, validate_config
from fedray.runtime.experiment import new_run_dir


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


def test_the_run_directory_of_a_users_dataset_has_no_colon(tmp_path):
    """``data.name: mylab.data:Reviews`` names a run ``fedavg-mylab.data.Reviews-<time>``: a ``:`` is refused by
    Windows and misread by scp, rsync and PATH-like lists."""
    config = validate_config({"data": {"name": "mylab.data:Reviews"}, "output": {"dir": str(tmp_path)}})
    run_dir = new_run_dir(config)
    assert run_dir.parent == tmp_path and ":" not in run_dir.name
    assert run_dir.name.startswith("fedavg-mylab.data.Reviews-")
