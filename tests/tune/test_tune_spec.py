"""Sweep files, trial resources, the sweep-directory writer and the summary tables — without Ray."""

from __future__ import annotations

import functools
import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from fedray.algorithms import ALGORITHMS
from fedray.cli.main import main
from fedray.config import ConfigError
from fedray.tune import load_sweep, parse_sweep
from fedray.tune.results import SweepResults, write_meta
from fedray.tune.summary import best_trial_lines, comparison_markdown, errored_trials_table, top_trials_table
from fedray.tune.trainable import trial_resources

REPO = Path(__file__).resolve().parents[2]
TINY_BASE = {"data": {"num_clients": 6}, "train": {"rounds": 4, "clients_per_round": 3}}


def spec_from(tmp_path: Path, **fields):
    raw = {"base": TINY_BASE, "space": {"data.alpha": {"grid": [0.1, 0.5]}}, "output": {"dir": str(tmp_path)}, **fields}
    return parse_sweep(raw, tmp_path / "test.yaml", tmp_path)


# ---------------------------------------------------------------------- the sweep file
def test_space_maps_to_tune_domains_and_counts_trials(tmp_path):
    from ray.tune.search.sample import Categorical, Float, Integer

    spec = spec_from(
        tmp_path,
        space={
            "data.alpha": {"grid": [0.1, 0.5, 1.0]},
            "train.lr": {"loguniform": [0.001, 0.1]},
            "train.momentum": {"uniform": [0.0, 0.9]},
            "train.local_epochs": {"randint": [1, 4]},
            "train.optimizer": {"choice": ["sgd", "adam"]},
        },
        num_samples=2,
    )
    space = spec.param_space()
    assert space["data.alpha"] == {"grid_search": [0.1, 0.5, 1.0]}
    assert isinstance(space["train.lr"], Float) and (space["train.lr"].lower, space["train.lr"].upper) == (0.001, 0.1)
    assert isinstance(space["train.local_epochs"], Integer) and space["train.local_epochs"].upper == 4
    assert isinstance(space["train.optimizer"], Categorical) and space["train.optimizer"].categories == ["sgd", "adam"]
    assert spec.num_trials == 6  # 3 grid points x 2 samples
    assert spec.swept_keys == ["data.alpha", "train.lr", "train.momentum", "train.local_epochs", "train.optimizer"]
    assert spec.name == "test" and spec.mode == "max"
    # 3 alphas x 2 lr ends x 2 momentum ends x 2 epoch ends (1 and 3: randint's high is exclusive) x 2 optimizers
    shapes = list(spec.trial_shapes())
    assert len(shapes) == 48 and {s["train.local_epochs"] for s in shapes} == {1, 3}


def test_trial_config_layers_base_overrides_per_algorithm_and_values(tmp_path):
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "base.yaml").write_text(yaml.safe_dump({"train": {"rounds": 7, "lr": 0.3}, "data": {"alpha": 0.9}}))
    sweep = tmp_path / "sweeps" / "s.yaml"
    sweep.parent.mkdir()
    sweep.write_text(
        yaml.safe_dump(
            {
                "base": "../configs/base.yaml",
                "overrides": ["train.lr=0.2", "train.batch_size=8"],
                "per_algorithm": {"fedprox": ["algorithm.mu=0.5", "train.batch_size=4"]},
                "space": {"algorithm.name": {"grid": ["fedavg", "fedprox"]}, "train.lr": {"grid": [0.01]}},
            }
        )
    )
    spec = load_sweep(sweep, ["train.rounds=3"])
    fedavg = spec.trial_config({"algorithm.name": "fedavg", "train.lr": 0.01})
    fedprox = spec.trial_config({"algorithm.name": "fedprox", "train.lr": 0.01})
    assert (fedavg.train.rounds, fedavg.data.alpha, fedavg.train.batch_size, fedavg.train.lr) == (3, 0.9, 8, 0.01)
    assert (fedprox.algorithm.name, fedprox.algorithm.model_extra["mu"], fedprox.train.batch_size) == ("fedprox", 0.5, 4)
    assert fedprox.train.lr == 0.01  # the sampled value wins over every override
    assert "mu" not in (fedavg.algorithm.model_extra or {})


def test_relative_paths_are_pinned_to_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = parse_sweep(
        {"base": {"data": {"root": "mydata"}}, "space": {"seed": {"grid": [0, 1]}}, "output": {"dir": "out"}}, "x.yaml", tmp_path
    )
    assert spec.base["data"]["root"] == str(tmp_path / "mydata")
    assert spec.output.dir == str(tmp_path / "out")


def test_relative_data_files_in_base_overrides_and_space_are_pinned_for_trials_run_elsewhere(tmp_path, monkeypatch):
    """A trial builds its run config in a Ray worker with another working directory: a relative
    data.path / data.test_path, set anywhere in the sweep, must still name the caller's files."""
    from fedray.runtime.experiment import prepare_data

    caller, elsewhere = tmp_path / "caller", tmp_path / "elsewhere"
    caller.mkdir(), elsewhere.mkdir()
    rows = "".join(f"{i % 3},{i % 5},{i % 2}\n" for i in range(24))
    for name in ("train.csv", "other.csv", "test.csv"):
        (caller / name).write_text("a,b,label\n" + rows)
    monkeypatch.chdir(caller)
    table = {"name": "table", "path": "train.csv", "num_clients": 2, "partition": "iid"}
    spec = parse_sweep(
        {
            "base": {"data": table, "train": {"rounds": 1, "clients_per_round": 2}, "model": {"name": "mlp"}},
            "overrides": ["data.test_path=test.csv"],
            "per_algorithm": {"fedprox": ["data.test_path=test.csv"]},
            "space": {"data.path": {"grid": ["train.csv", "other.csv"]}, "algorithm.name": {"grid": ["fedavg", "fedprox"]}},
            "output": {"dir": "out"},
        },
        "x.yaml",
        caller,
    )
    again = parse_sweep(yaml.safe_load(spec.to_yaml()), "sweep.yaml", tmp_path)  # what a resumed sweep reads
    monkeypatch.chdir(elsewhere)
    for sweep in (spec, again):
        for values in sweep.trial_shapes():
            config = sweep.trial_config(values)
            assert config.data.path == str(caller / Path(values["data.path"]).name)
            assert config.data.test_path == str(caller / "test.csv")
            assert config.data.root == str(caller / "data")
            prepare_data(config)  # reads the files: no "data.path: ... does not exist"


def test_a_tokenizer_and_an_hf_model_directory_are_pinned_too_and_other_model_names_are_left_alone(tmp_path, monkeypatch):
    from fedray.tune.spec import SweepSpec, _resolve_paths

    monkeypatch.chdir(tmp_path)
    spec = SweepSpec.model_validate(
        {
            "name": "s",
            "base": {"data": {"tokenizer": "tok"}, "model": {"name": "hf:models/tiny"}},
            "overrides": ["data.tokenizer=other_tok", "model.name=cnn_small"],
            "per_algorithm": {"fedprox": ["model.name=hf:models/small"]},
            "space": {"model.name": {"choice": ["hf:models/a", "torchvision:resnet18", "mylab.nets:Net"]}},
        }
    )
    _resolve_paths(spec)
    assert (spec.base["data"]["tokenizer"], spec.base["model"]["name"]) == (str(tmp_path / "tok"), f"hf:{tmp_path / 'models' / 'tiny'}")
    assert spec.overrides == [f'data.tokenizer="{tmp_path / "other_tok"}"', "model.name=cnn_small"]
    assert spec.per_algorithm == {"fedprox": [f'model.name="hf:{tmp_path / "models" / "small"}"']}
    assert spec.space["model.name"].values == [f"hf:{tmp_path / 'models' / 'a'}", "torchvision:resnet18", "mylab.nets:Net"]


@pytest.mark.parametrize(
    ("sweep", "metric", "mode"), [("regression_diabetes.yaml", "test_rmse", "min"), ("lm_stdlib.yaml", "test_perplexity", "min")]
)
def test_a_sweep_ranks_by_its_tasks_headline_in_its_direction_by_default(sweep, metric, mode):
    spec = load_sweep(REPO / "tune_configs" / sweep)
    assert (spec.metric, spec.mode) == (metric, mode)


def test_a_sweep_over_different_tasks_must_name_its_metric(tmp_path):
    rows = "\n".join(f"{i % 7},{i % 2}" for i in range(60))
    (tmp_path / "t.csv").write_text(f"x,y\n{rows}\n")  # y reads as a class label or as a regression target
    data = {"name": "table", "path": str(tmp_path / "t.csv"), "label_column": "y", "num_clients": 6, "partition": "iid"}
    base = {"data": data, "model": {"name": "mlp"}, "train": {"rounds": 2, "clients_per_round": 3}}
    space = {"data.task": {"grid": ["regression", "classification"]}}
    with pytest.raises(ConfigError, match="the trials learn different tasks"):
        spec_from(tmp_path, base=base, space=space)
    assert spec_from(tmp_path, base=base, space=space, metric="test_loss").mode == "min"


def test_resolved_sweep_yaml_reloads_to_the_same_spec(tmp_path):
    spec = spec_from(tmp_path, scheduler={"type": "asha", "grace_period": 1}, space={"train.lr": {"loguniform": [0.01, 0.1]}})
    again = parse_sweep(yaml.safe_load(spec.to_yaml()), "sweep.yaml", tmp_path)
    assert again == spec


INVALID = [
    ({"space": {"data.alfa": {"grid": [0.1]}}}, ["data.alfa=0.1", "data.alfa: unknown key", "alpha"]),
    ({"space": {"algorithm.mu": {"normal": [0, 1]}}}, ["space.algorithm.mu", "grid, choice, uniform, loguniform, randint"]),
    ({"space": {"train.lr": {"uniform": [0.1, 0.01]}}}, ["space.train.lr", "low must be < high"]),
    ({"space": {"train.lr": {"loguniform": [0, 1]}}}, ["loguniform: low must be > 0"]),
    ({"space": {"train.local_epochs": {"randint": [1, 2.5]}}}, ["randint: low and high must be integers"]),
    ({"space": {"data.alpha": {"uniform": [-1, 1]}}}, ["data.alpha=-1", "data.alpha: Input should be greater than 0"]),
    ({"space": {"data.alpha": {"grid": [0.1, "a"]}}}, ["grid: values must all be numbers, all strings or all booleans"]),
    ({"space": {}}, ["space", "at least one key"]),
    (
        {"base": {"algorithm": {"name": "fedprox", "mu": 0.1}}, "space": {"algorithm.name": {"grid": ["fedprox", "fedavg"]}}},
        ["algorithm.name='fedavg'", "algorithm.mu: unknown key"],
    ),
    ({"per_algorithm": {"nosuch": ["train.lr=0.1"]}}, ["per_algorithm: unknown algorithm(s) nosuch", "fedavg"]),
    ({"metric": "accuracy"}, ["metric", "allowed: test_accuracy, test_loss"]),
    ({"metric": "personal_accuracy"}, ["metric: personal_accuracy needs eval.personalized=true"]),
    ({"scheduler": {"type": "asha", "grace_period": 5}}, ["scheduler.grace_period: 5 must be <= train.rounds (4)"]),
    ({"scheduler": "hyperband"}, ["scheduler.type", "'fifo', 'asha' or 'pbt'"]),
    # the algorithm's own checks (they need the data) run before Ray, naming the trial shape
    (
        {
            "base": {
                **TINY_BASE,
                "eval": {"personalized": True},
                "data": {"num_clients": 6, "client_test_fraction": 0.25},
                "algorithm": {"name": "hetero_ssfl", "architectures": [{"name": "cnn_small"}]},
            }
        },
        ["the trial with data.alpha=0.1", "hetero_ssfl: eval.personalized does not apply"],
    ),
    ({"base": {**TINY_BASE, "data": {"num_clients": 2000}}}, ["data.alpha=0.1 has an invalid run config:\n  data.num_clients"]),
    ({"num_samples": 10**9}, ["num_samples: the sweep has 2,000,000,000 trials", "at most 10,000", "--num-samples"]),
    (
        {
            "space": {f"train.{k}": {"uniform": [0.1, 0.2]} for k in ("lr", "momentum", "weight_decay", "lr_decay", "grad_clip")}
            | {"data.alpha": {"grid": [0.1 * i for i in range(1, 40)]}}
        },
        ["space: 1,248 trial shapes", "at most 1,000"],
    ),
    ({"scheduler": "pbt"}, ["scheduler pbt copies the donor's values", "use choice for data.alpha"]),
    ({"scheduler": "pbt", "space": {"data.alpha": {"choice": [0.1, 0.5]}}}, ["pbt can only change train.* and algorithm.*", "data.alpha"]),
    (
        {"scheduler": {"type": "pbt", "perturbation_interval": 3}, "space": {"train.lr": {"loguniform": [0.01, 0.1]}}},
        ["scheduler.perturbation_interval: 3 must be < train.rounds (4) and a multiple of checkpoint.every (5)"],
    ),
    ({"search": {"type": "optuna"}}, ["search optuna", "use choice for data.alpha"]),
    ({"num_sample": 3}, ["num_sample: unknown key", "num_samples"]),
    ({"overrides": ["train.lr"]}, ["expected KEY=VALUE"]),
    ({"base": "missing.yaml"}, ["config file not found", "missing.yaml"]),
    ({"max_concurrent_trials": 0}, ["max_concurrent_trials", "greater than or equal to 1"]),
]


@pytest.mark.parametrize("fields, expected", INVALID, ids=[str(i) for i in range(len(INVALID))])
def test_invalid_sweep_files_name_the_key_and_what_is_allowed(tmp_path, fields, expected):
    with pytest.raises(ConfigError) as error:
        spec_from(tmp_path, **fields)
    for text in expected:
        assert text in str(error.value), str(error.value)


@pytest.mark.skipif(importlib.util.find_spec("optuna") is not None, reason="optuna is installed")
def test_optuna_search_without_optuna_says_how_to_install_it(tmp_path):
    with pytest.raises(ConfigError, match=r"optuna is not installed; pip install 'fedray\[optuna\]'"):
        spec_from(tmp_path, search="optuna", space={"data.alpha": {"choice": [0.1, 0.5]}}, num_samples=4)


class _Pwned:
    """Unpickling this creates the file ``path``: a stand-in for code a crafted tuner.pkl would run."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


def crafted_sweep_dir(tmp_path: Path, meta: dict | None) -> Path:
    """A folder laid out like a sweep directory whose tuner.pkl runs code when unpickled."""
    import pickle

    sweep_dir = tmp_path / "crafted"
    (sweep_dir / "tune" / "crafted").mkdir(parents=True)
    (sweep_dir / "sweep.yaml").write_text(yaml.safe_dump({"base": TINY_BASE, "space": {"seed": {"grid": [0]}}}))
    if meta is not None:
        (sweep_dir / "meta.json").write_text(json.dumps(meta))
    (sweep_dir / "tune" / "crafted" / "tuner.pkl").write_bytes(pickle.dumps(_Pwned(str(tmp_path / "pwned"))))
    return sweep_dir


BAD_CLI = [
    (lambda t: ["tune", str(t / "bad.yaml")], "algorithm.tau: unknown key"),
    (lambda t: ["tune", "--resume", str(t / "nowhere")], "nowhere is not a fedray sweep directory (it needs meta.json and sweep.yaml)"),
    (lambda t: ["tune", "--resume", str(crafted_sweep_dir(t, None))], "crafted is not a fedray sweep directory (it needs meta.json"),
    (lambda t: ["tune", "--resume", str(crafted_sweep_dir(t, {"status": "failed"}))], "meta.json holds no digest of the Tune state"),
    (
        lambda t: ["tune", "--resume", str(crafted_sweep_dir(t, {"status": "failed", "tune_state_sha256": {"tuner.pkl": "0" * 64}}))],
        "the Tune state was not written by fedray (unrecorded or changed: tuner.pkl)",
    ),
    (lambda t: ["tune", str(t / "good.yaml"), "--space", "data.alpha=normal:[0, 1]"], "expected KEY=KIND:[VALUES] with KIND one of grid"),
    (lambda t: ["tune", str(t / "good.yaml"), "--space", "data.alpha=grid:0.5"], "the values must be a YAML list"),
    (lambda t: ["tune", str(t / "good.yaml"), "--space", "data.alfa=grid:[0.5]"], "data.alfa: unknown key"),
    (lambda t: ["tune", str(t / "good.yaml"), "--num-samples", "0"], "num_samples: Input should be greater than or equal to 1"),
    (lambda t: ["tune", str(t / "good.yaml"), "--num-samples", str(10**9)], "at most 10,000"),
    (lambda t: ["tune", str(t / "good.yaml"), "--max-concurrent", "0"], "max_concurrent_trials"),
    (lambda t: ["tune", "--resume", str(t), "--space", "seed=grid:[1]"], "--resume takes the sweep directory only"),
    (lambda t: ["tune", str(t / "good.yaml"), "--trust-tune-state"], "--trust-tune-state goes with --resume"),
    (lambda t: ["tune", str(t / "good.yaml"), "--top", "-1"], "--top: expected a positive number"),
    (lambda t: ["tune", str(t / "missing.yaml")], "config file not found"),
    (lambda t: ["tune", "--resume", str(t / "good.yaml")], "good.yaml is not a fedray sweep directory"),
]


@pytest.mark.parametrize("argv, message", BAD_CLI, ids=[str(i) for i in range(len(BAD_CLI))])
def test_bad_tune_inputs_exit_2_with_one_line_before_ray_starts(tmp_path, monkeypatch, capsys, argv, message):
    import ray

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray was started for invalid input")

    monkeypatch.setattr(ray, "init", no_ray)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump({"base": TINY_BASE, "space": {"algorithm.tau": {"grid": [0.1]}}}))
    (tmp_path / "good.yaml").write_text(yaml.safe_dump({"base": TINY_BASE, "space": {"data.alpha": {"grid": [0.1, 0.5]}}}))
    args = argv(tmp_path)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("fedray: ") and "Traceback" not in err
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # nothing written
    assert not (tmp_path / "pwned").exists()  # the crafted tuner.pkl was never unpickled


def test_trusted_resume_of_a_crafted_folder_is_the_users_choice(tmp_path):
    # the crafted pickle would run with --trust-tune-state: this documents what the flag means
    import pickle

    sweep_dir = crafted_sweep_dir(tmp_path, {"status": "failed"})
    pickle.loads((sweep_dir / "tune" / "crafted" / "tuner.pkl").read_bytes())
    assert (tmp_path / "pwned").exists()


def test_tune_state_record_accepts_a_copy_in_flight_and_the_previous_version_but_no_other(tmp_path):
    # Tune saves into a staging directory and copies it into tune/ in the background: a driver killed
    # before, while or after the copy lands must leave a folder that resumes without --trust-tune-state.
    from fedray.config import ConfigError
    from fedray.tune.results import read_meta
    from fedray.tune.trust import DIGESTS_KEY, VERSIONS_KEPT, record_tune_state, verify_tune_state

    sweep_dir, experiment, staging = tmp_path / "sweep", tmp_path / "sweep" / "tune" / "sweep", tmp_path / "staging"
    for folder in (experiment / "trial_0", staging / "trial_0"):
        folder.mkdir(parents=True)
    (sweep_dir / "meta.json").write_text(json.dumps({"status": "running"}))
    state = "experiment_state-2026.json"
    (experiment / "tuner.pkl").write_bytes(b"tuner")
    (experiment / state).write_bytes(b"version 1")
    record_tune_state(sweep_dir, experiment)
    # version 2 saved to staging and recorded in the same step; the copy has not landed yet
    (staging / state).write_bytes(b"version 2")
    (staging / "trial_0" / "params.pkl").write_bytes(b"params")
    record_tune_state(sweep_dir, experiment, staging)
    verify_tune_state(sweep_dir, experiment)  # killed before the copy: version 1 is still accepted
    (experiment / state).write_bytes(b"version 2")
    (experiment / "trial_0" / "params.pkl").write_bytes(b"params")
    verify_tune_state(sweep_dir, experiment)  # killed after it, before any later record
    # the version in tune/ and the last ones saved stay accepted (VERSIONS_KEPT in all); older ones do not
    for version in range(3, 3 + VERSIONS_KEPT):
        (staging / state).write_bytes(f"version {version}".encode())
        record_tune_state(sweep_dir, experiment, staging)
    assert len(read_meta(sweep_dir)[DIGESTS_KEY][state]) == VERSIONS_KEPT
    verify_tune_state(sweep_dir, experiment)
    (experiment / state).write_bytes(f"version {2 + VERSIONS_KEPT}".encode())
    verify_tune_state(sweep_dir, experiment)
    (experiment / state).write_bytes(b"version 1")
    with pytest.raises(ConfigError, match=f"unrecorded or changed: {state}"):
        verify_tune_state(sweep_dir, experiment)
    (experiment / state).write_bytes(f"version {2 + VERSIONS_KEPT}".encode())
    (experiment / "trial_0" / "params.pkl").write_bytes(b"edited")
    with pytest.raises(ConfigError, match="unrecorded or changed: trial_0/params.pkl"):
        verify_tune_state(sweep_dir, experiment)


def test_space_option_and_sizes_replace_the_files_values_and_shadowed_sets_are_named(tmp_path, capsys, monkeypatch):
    from fedray.tune.spec import parse_space_option, shadowed_overrides

    assert parse_space_option("data.alpha=grid:[0.5]") == ("data.alpha", {"grid": [0.5]})
    assert parse_space_option("train.lr = loguniform:[1e-3, 0.1]") == ("train.lr", {"loguniform": [1e-3, 0.1]})
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({"base": TINY_BASE, "space": {"data.alpha": {"grid": [0.1, 0.5]}}, "num_samples": 2}))
    spec = load_sweep(sweep, ["data.alpha=0.3", "train.lr=0.2"], ["data.alpha=grid:[0.5]", "train.momentum=uniform:[0, 0.9]"], 3, 2)
    assert spec.space["data.alpha"].values == [0.5] and spec.space["train.momentum"].kind == "uniform"
    assert (spec.num_samples, spec.max_concurrent_trials, spec.num_trials) == (3, 2, 3)
    assert shadowed_overrides(spec, ["data.alpha=0.3", "train.lr=0.2"]) == ["data.alpha=0.3"]
    # the CLI warns about the shadowed --set (and validates before starting anything)
    import ray

    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # as in a fresh process, whatever ran before
    monkeypatch.setattr(ray, "init", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
    monkeypatch.chdir(tmp_path)
    assert main(["tune", str(sweep), "--set", "data.alpha=0.3"]) == 130
    err = capsys.readouterr().err
    assert "warning: --set data.alpha=0.3 is shadowed by the sweep's space (data.alpha: {'grid': [0.1, 0.5]})" in err
    [sweep_dir] = (tmp_path / "sweeps").iterdir()
    assert json.loads((sweep_dir / "meta.json").read_text())["status"] == "failed"  # not "running"


# ---------------------------------------------------------------------- tune_configs/
@functools.cache
def shipped_sweep(path: Path):
    """``load_sweep`` of a file of tune_configs/ (it checks every trial shape, seconds each), once for
    this module: the tests below read the same loaded sweeps."""
    return load_sweep(path)


@pytest.mark.parametrize("path", sorted((REPO / "tune_configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_sweep_file_is_valid(path):
    raw = yaml.safe_load(path.read_text())
    base = raw.get("base")
    base = yaml.safe_load((path.parent / base).read_text()) if isinstance(base, str) else base or {}
    names = {(base.get("algorithm") or {}).get("name", "fedavg")}
    space_names = (raw.get("space") or {}).get("algorithm.name")
    if space_names:
        names |= set(next(iter(space_names.values())))
    missing = sorted(name for name in names if name not in ALGORITHMS)
    if missing:
        pytest.skip(f"algorithm(s) {', '.join(missing)} not registered yet")
    spec = shipped_sweep(path)
    assert 1 <= spec.num_trials <= (200 if path.stem == "compare_algorithms" else 100)  # the comparison table is large by design
    offline = ("digits", "diabetes", "pystdlib_chars")  # every shipped sweep runs on data that ships with fedray's dependencies
    assert all(spec.trial_config(values).data.name in offline for values in spec.trial_shapes())


def test_shipped_sweeps_cover_every_algorithm_of_the_design():
    design = {"fedavg", "fedprox", "fedproto", "moon", "fedsc", "fedskc", "fedrcl", "fedcosr", "fedper", "local", "hetero_ssfl"}
    registered = {name for name in design if name in ALGORITHMS}
    covered = {shipped_sweep(p).base["algorithm"]["name"] for p in (REPO / "tune_configs").glob("*.yaml") if p.stem != "compare_algorithms"}
    assert registered <= covered, f"no sweep in tune_configs/ for {sorted(registered - covered)}"
    compared = shipped_sweep(REPO / "tune_configs" / "compare_algorithms.yaml").space["algorithm.name"].values
    assert registered <= set(compared)


# ---------------------------------------------------------------------- trial resources
def test_trial_reserves_driver_and_server_in_bundle_0_and_one_bundle_per_worker(tmp_path):
    spec = spec_from(
        tmp_path,
        base={**TINY_BASE, "resources": {"cpus_per_worker": 2, "gpus_per_worker": 0.25, "server_cpus": 0.5}},
        space={"resources.num_workers": {"grid": [1, 3]}},
        driver_cpus=0.5,
    )
    resources = trial_resources(spec)
    three = resources({"resources.num_workers": 3})
    assert three.head_bundle_is_empty  # the driver runs in bundle 0 uncharged, leaving bundle 0 to the server
    assert three.bundles == [{"CPU": 1.0}] + [{"CPU": 2.0, "GPU": 0.25}] * 3
    assert resources({"resources.num_workers": 1}).bundles == [{"CPU": 1.0}, {"CPU": 2.0, "GPU": 0.25}]


# ---------------------------------------------------------------------- the sweep-directory writer
def fake_trial(trial_id, status, config, error=None):
    return SimpleNamespace(trial_id=trial_id, status=status, config=config, get_error=lambda: error)


def tune_result(round, accuracy, seconds=1.0, **extra):
    """A result as Tune hands it to callbacks: the engine's row plus Tune's bookkeeping."""
    return {
        "round": round,
        "test_accuracy": accuracy,
        "test_loss": 1.0 - accuracy,
        "clients": 3,
        "seconds": seconds,
        "training_iteration": round,
        "time_total_s": 10.0 * round,
        "time_this_iter_s": 1.5,
        "timestamp": 17e8,
        "pid": 123,
        "done": False,
        "trial_id": "ignored",
        "date": "2026-01-01",
        "config": {"data.alpha": 0.1},
        **extra,
    }


def test_writer_tracks_status_best_round_and_engine_metrics(tmp_path):
    spec = spec_from(tmp_path, space={"data.alpha": {"grid": [0.1, 0.5]}, "train.rounds": {"grid": [2, 4]}})
    writer = SweepResults(tmp_path, spec)
    writer.setup()
    a = fake_trial("a", "RUNNING", {"data.alpha": 0.1, "train.rounds": 4})
    b = fake_trial("b", "PENDING", {"data.alpha": 0.5, "train.rounds": 4})
    c = fake_trial("c", "PENDING", {"data.alpha": 0.5, "train.rounds": 2})
    trials = [a, b, c]
    writer.on_step_end(0, trials)
    assert pq.read_table(tmp_path / "trials.parquet").column("status").to_pylist() == ["RUNNING", "PENDING", "PENDING"]
    for round, accuracy in [(1, 0.3), (2, 0.6), (3, 0.5)]:
        writer.on_trial_result(0, trials, a, tune_result(round, accuracy))
    writer.on_trial_result(0, trials, a, tune_result(2, 0.6, seconds=9.0))  # a restored trial re-reports round 2
    b.status = c.status = "RUNNING"
    writer.on_trial_result(0, trials, b, tune_result(1, 0.1))
    writer.on_trial_result(0, trials, c, tune_result(1, 0.2))
    writer.on_trial_result(0, trials, c, tune_result(2, 0.25))
    writer.on_trial_complete(0, trials, a)  # ASHA stopped it (Tune calls this while it is still RUNNING)
    writer.on_trial_complete(0, trials, c)
    b.status = "ERROR"
    b.get_error = lambda: "Traceback (most recent call last):\n  File x\nRuntimeError: worker pool died\n"
    writer.on_trial_error(0, trials, b)
    d = fake_trial("d", "RUNNING", {"data.alpha": 0.1, "train.rounds": 4})
    trials.append(d)
    writer.on_trial_result(0, trials, d, tune_result(1, 0.5))
    a.status = c.status = d.status = "TERMINATED"  # d: the sweep was interrupted (no on_trial_complete)
    writer.on_experiment_end(trials)

    rows = {r["trial_id"]: r for r in pq.read_table(tmp_path / "trials.parquet").to_pylist()}
    assert list(pq.read_table(tmp_path / "trials.parquet").schema.names) == [
        "trial_id",
        "status",
        "data.alpha",
        "train.rounds",
        "round",
        "latest_metric",
        "best_metric",
        "best_round",
        "wall_time_s",
        "run_dir",
        "error",
    ]
    assert rows["a"] | {} == {
        "trial_id": "a",
        "status": "STOPPED_EARLY",
        "data.alpha": 0.1,
        "train.rounds": 4,
        "round": 2,
        "latest_metric": 0.6,
        "best_metric": 0.6,
        "best_round": 2,
        "wall_time_s": 20.0,
        "run_dir": "trials/a",
        "error": None,
    }
    assert (rows["b"]["status"], rows["b"]["error"]) == ("ERROR", "RuntimeError: worker pool died")
    assert (rows["c"]["status"], rows["c"]["round"], rows["c"]["best_metric"]) == ("TERMINATED", 2, 0.25)
    assert (rows["d"]["status"], rows["d"]["round"]) == ("PENDING", 1)  # it continues when the sweep resumes

    rounds = pq.read_table(tmp_path / "rounds.parquet").to_pylist()
    assert [(r["trial_id"], r["round"]) for r in rounds] == [("a", 1), ("a", 2), ("a", 3), ("b", 1), ("c", 1), ("c", 2), ("d", 1)]
    assert set(rounds[0]) == {"trial_id", "round", "test_accuracy", "test_loss", "clients", "seconds"}
    assert rounds[1]["seconds"] == 9.0  # the re-reported round replaced the first report
    assert not list(tmp_path.glob("*.tmp"))


def test_writer_keeps_earlier_rows_when_a_sweep_resumes(tmp_path):
    spec = spec_from(tmp_path)
    first = SweepResults(tmp_path, spec)
    first.setup()
    done = fake_trial("done", "RUNNING", {"data.alpha": 0.1})
    first.on_trial_result(0, [done], done, tune_result(4, 0.8))
    first.on_trial_complete(0, [done], done)
    done.status = "TERMINATED"

    resumed = SweepResults(tmp_path, spec)
    resumed.setup()
    done_again = fake_trial("done", "TERMINATED", {"data.alpha": 0.1})
    late = fake_trial("late", "RUNNING", {"data.alpha": 0.5})
    resumed.on_trial_result(0, [done_again, late], late, tune_result(1, 0.4))
    rows = {r["trial_id"]: r for r in pq.read_table(tmp_path / "trials.parquet").to_pylist()}
    assert (rows["done"]["status"], rows["done"]["round"], rows["done"]["best_metric"]) == ("TERMINATED", 4, 0.8)
    rounds = pq.read_table(tmp_path / "rounds.parquet").to_pylist()
    assert [(r["trial_id"], r["round"]) for r in rounds] == [("done", 4), ("late", 1)]


# ---------------------------------------------------------------------- summary tables
def write_sweep(tmp_path, spec, trials: list[dict], rounds: list[dict]) -> Path:
    write_meta(tmp_path, spec, "2026-01-01T00:00:00+00:00", None, "finished")
    pd.DataFrame(trials).to_parquet(tmp_path / "trials.parquet")
    pd.DataFrame(rounds).to_parquet(tmp_path / "rounds.parquet")
    return tmp_path


def test_comparison_table_is_mean_and_std_over_seeds_per_algorithm_and_alpha(tmp_path):
    spec = spec_from(
        tmp_path, space={"algorithm.name": {"grid": ["fedavg", "fedprox"]}, "data.alpha": {"grid": [0.1, 0.5]}, "seed": {"grid": [0, 1]}}
    )
    final = {("fedavg", 0.1): [0.5, 0.7], ("fedavg", 0.5): [0.8, 0.8], ("fedprox", 0.1): [0.6, 0.6], ("fedprox", 0.5): [0.9, 0.7]}
    trials, rounds = [], []
    for (algorithm, alpha), values in final.items():
        for seed, value in enumerate(values):
            trial_id = f"{algorithm}-{alpha}-{seed}"
            trials.append(
                {
                    "trial_id": trial_id,
                    "status": "TERMINATED",
                    "algorithm.name": algorithm,
                    "data.alpha": alpha,
                    "seed": seed,
                    "best_metric": value,
                    "best_round": 2,
                    "round": 2,
                }
            )
            rounds += [{"trial_id": trial_id, "round": 1, "test_accuracy": 0.1}, {"trial_id": trial_id, "round": 2, "test_accuracy": value}]
    trials = [{**t, "error": None} for t in trials]
    trials.append(
        {
            "trial_id": "x",
            "status": "ERROR",
            "algorithm.name": "fedavg",
            "data.alpha": 0.1,
            "seed": 2,
            "best_metric": None,
            "best_round": None,
            "round": 0,
            "error": "RuntimeError: boom | bang",
        }
    )
    trials.append(
        {
            "trial_id": "y",
            "status": "ERROR",
            "algorithm.name": "hetero_ssfl",
            "data.alpha": 0.5,
            "seed": 0,
            "best_metric": None,
            "best_round": None,
            "round": 0,
            "error": "hetero_ssfl: eval.personalized does not apply",
        }
    )
    text = comparison_markdown(write_sweep(tmp_path, spec, trials, rounds))
    assert "| algorithm | 0.1 | 0.5 |" in text
    assert "| fedavg | 60.00% ± 10.00% (n=2); 1 errored | 80.00% ± 0.00% (n=2) |" in text
    assert "| fedprox | 60.00% ± 0.00% (n=2) | 80.00% ± 10.00% (n=2) |" in text
    # an algorithm whose every trial errored keeps its row, and every errored trial is listed with its error
    assert "| hetero_ssfl | — | 1 errored |" in text
    assert "### errored trials (2)" in text
    assert "| x | fedavg | 0.1 | 2 | RuntimeError: boom \\| bang |" in text
    assert "| y | hetero_ssfl | 0.5 | 0 | hetero_ssfl: eval.personalized does not apply |" in text


def test_a_relative_model_init_is_pinned_to_the_callers_directory(tmp_path, monkeypatch):
    """Tune runs a trial in its own working directory: the trial must still find the weights."""
    import torch

    from fedray.models import SmallCNN

    monkeypatch.chdir(tmp_path)
    torch.save(SmallCNN(1, 8, 10).state_dict(), "w.pt")
    spec = spec_from(tmp_path, base={**TINY_BASE, "model": {"init": "w.pt"}})
    monkeypatch.chdir(tmp_path.parent)
    assert spec.trial_config({"data.alpha": 0.1}).model.init == str(tmp_path / "w.pt")


def test_comparison_table_marks_personalised_algorithms(tmp_path):
    """A personalised algorithm's test_accuracy is a global model with an untrained head: its row never
    stands unmarked beside the global algorithms' rows."""
    base = {**TINY_BASE, "data": {"num_clients": 6, "client_test_fraction": 0.25}, "eval": {"personalized": True}}
    spec = spec_from(tmp_path, base=base, space={"algorithm.name": {"grid": ["fedavg", "fedper"]}})
    trials = [
        {"trial_id": name, "status": "TERMINATED", "algorithm.name": name, "best_metric": 0.5, "best_round": 1, "round": 1, "error": None}
        for name in ("fedavg", "fedper")
    ]
    rounds = [{"trial_id": name, "round": 1, "test_accuracy": 0.5, "personal_accuracy": 0.9} for name in ("fedavg", "fedper")]
    text = comparison_markdown(write_sweep(tmp_path, spec, trials, rounds))
    # both mean tables, and both paired tables (fedper − fedavg: the reference has no row of its own there)
    assert text.count("| fedper (personalised) |") == 4 and text.count("| fedavg |") == 2
    assert "Rows marked (personalised) are evaluated by each client's own model" in text


def test_top_trials_table_ranks_by_the_sweep_mode_and_prints_integers_as_integers(tmp_path):
    spec = spec_from(tmp_path, metric="test_loss")
    # t4 led the sweep (lowest loss) before it diverged: an errored trial is never ranked, whatever it reported
    trials = [
        {"trial_id": t, "status": s, "data.alpha": a, "best_metric": m, "best_round": b, "round": 4, "error": e, "run_dir": f"trials/{t}"}
        for t, s, a, m, b, e in [
            ("t1", "TERMINATED", 0.1, 0.9, 3, None),
            ("t2", "TERMINATED", 0.5, 0.2, 7, None),
            ("t3", "ERROR", 1.0, None, None, "ValueError: bad"),
            ("t4", "ERROR", 2.0, 0.05, 3, "FloatingPointError: diverged"),
        ]
    ]
    pq.write_table(
        pa.Table.from_pylist(
            trials,
            schema=pa.schema(
                [
                    ("trial_id", pa.string()),
                    ("status", pa.string()),
                    ("data.alpha", pa.float64()),
                    ("best_metric", pa.float64()),
                    ("best_round", pa.int64()),
                    ("round", pa.int64()),
                    ("error", pa.string()),
                    ("run_dir", pa.string()),
                ]
            ),
        ),
        tmp_path / "trials.parquet",
    )
    write_meta(tmp_path, spec, "2026-01-01T00:00:00+00:00", None, "finished")
    text = top_trials_table(tmp_path, 5)
    assert json.loads((tmp_path / "meta.json").read_text())["mode"] == "min"
    lines = text.splitlines()
    assert "t2" in lines[1] and "0.2000" in lines[1] and "t1" in lines[2] and "t3" not in text and "t4" not in text
    assert lines[1].split()[-2:] == ["7", "4"] and ".0" not in lines[1].split()[-2]  # best_round, rounds: no "7.0"
    assert best_trial_lines(tmp_path)[0].startswith("best trial         t2 ")
    errored = errored_trials_table(tmp_path)
    assert "t3" in errored and "ValueError: bad" in errored and "t4" in errored and "t1" not in errored


def test_writer_records_config_errors_as_errors_and_keeps_integer_metrics_integers(tmp_path):
    from fedray.tune.results import CONFIG_ERROR, read_table

    spec = spec_from(tmp_path)
    writer = SweepResults(tmp_path, spec)
    writer.setup()
    ok = fake_trial("ok", "RUNNING", {"data.alpha": 0.1})
    bad = fake_trial("bad", "RUNNING", {"data.alpha": 0.5})
    writer.on_trial_result(0, [ok, bad], ok, tune_result(1, 0.5))
    writer.on_trial_result(0, [ok, bad], ok, tune_result(2, 0.6, clients=None))  # a metric missing in one round
    writer.on_trial_result(0, [ok, bad], bad, {"test_accuracy": float("nan"), "round": 0, CONFIG_ERROR: "data.root: not found"})
    bad.status = "TERMINATED"  # for Tune the trial ended normally: it reported and returned
    writer.on_trial_complete(0, [ok, bad], bad)
    rows = {r["trial_id"]: r for r in pq.read_table(tmp_path / "trials.parquet").to_pylist()}
    assert (rows["bad"]["status"], rows["bad"]["error"], rows["bad"]["round"]) == ("ERROR", "data.root: not found", 0)
    assert writer.counts() == {"RUNNING": 1, "ERROR": 1} and writer.best() == ("ok", 0.6)
    rounds = pq.read_table(tmp_path / "rounds.parquet")
    assert rounds.schema.field("clients").type == pa.int64() and rounds.column("clients").to_pylist() == [3, None]
    assert str(read_table(tmp_path / "rounds.parquet")["clients"].dtype) == "Int64"
    assert [r["trial_id"] for r in rounds.to_pylist()] == ["ok", "ok"]  # the config error is no round
    # the config error survives a resume (Tune's callback state), although Tune calls the trial TERMINATED
    resumed = SweepResults(tmp_path, spec)
    resumed.set_state(writer.get_state())
    resumed.setup()
    resumed.on_step_end(0, [ok, bad])
    assert {r["trial_id"]: r["status"] for r in pq.read_table(tmp_path / "trials.parquet").to_pylist()}["bad"] == "ERROR"


def test_writer_best_skips_a_trial_that_led_and_then_diverged(tmp_path):
    writer = SweepResults(tmp_path, spec_from(tmp_path))
    writer.setup()
    ok = fake_trial("ok", "RUNNING", {"data.alpha": 0.1})
    diverged = fake_trial("diverged", "RUNNING", {"data.alpha": 0.5}, error="Traceback\nFloatingPointError: diverged")
    writer.on_trial_result(0, [ok, diverged], ok, tune_result(1, 0.6))
    writer.on_trial_result(0, [ok, diverged], diverged, tune_result(1, 0.9))
    assert writer.best() == ("diverged", 0.9)
    diverged.status = "ERROR"
    writer.on_trial_error(0, [ok, diverged], diverged)
    assert writer.best() == ("ok", 0.6)
    resumed = SweepResults(tmp_path, spec_from(tmp_path))  # and after a resume, from trials.parquet
    resumed.setup()
    assert resumed.best() == ("ok", 0.6)
    diverged.status = "RUNNING"  # a resumed sweep retries its errored trials: running again, it counts again
    resumed.on_step_end(0, [ok, diverged])
    assert resumed.best() == ("diverged", 0.9)


def test_asha_state_travels_with_the_callback_through_a_pickle(tmp_path):
    # Tuner.restore unpickles the scheduler and the callbacks from one tuner.pkl, then sets the callbacks'
    # states from the last experiment checkpoint: the restored callback must update the scheduler Tune uses.
    import ray.cloudpickle as cloudpickle

    from fedray.tune.schedulers import SchedulerState, make_scheduler

    spec = spec_from(tmp_path, scheduler={"type": "asha", "grace_period": 1}, space={"train.lr": {"grid": [0.1, 0.2]}})
    scheduler = make_scheduler(spec)
    scheduler.set_search_properties("test_accuracy", "max")
    callback = SchedulerState(scheduler)
    pickled = cloudpickle.dumps({"scheduler": scheduler, "callbacks": [callback]})  # tuner.pkl: before any result
    trial = SimpleNamespace(trial_id="t1")
    scheduler.on_trial_add(None, trial)
    assert scheduler.on_trial_result(None, trial, {"round": 1, "test_accuracy": 0.9}) == "CONTINUE"
    saved = cloudpickle.loads(cloudpickle.dumps(callback.get_state()))  # the experiment checkpoint

    restored = cloudpickle.loads(pickled)
    restored["callbacks"][0].set_state(saved)
    fresh = restored["scheduler"]
    weak = SimpleNamespace(trial_id="t2")
    fresh.on_trial_add(None, weak)
    # with the restored rung (t1: 0.9 at round 1), a 0.1 trial is cut at round 1; a fresh ASHA would keep it
    assert fresh.on_trial_result(None, weak, {"round": 1, "test_accuracy": 0.1}) == "STOP"
    empty = cloudpickle.loads(pickled)["scheduler"]
    empty.on_trial_add(None, weak)
    assert empty.on_trial_result(None, weak, {"round": 1, "test_accuracy": 0.1}) == "CONTINUE"


def test_callbacks_unpickled_on_resume_are_built_by_this_fedrays_code(tmp_path):
    # Tuner.restore unpickles the callbacks from the tuner.pkl that the sweep's first session wrote,
    # maybe with an older fedray: one pickled before SweepResults had `_statuses` crashed the resume.
    import ray.cloudpickle as cloudpickle

    from fedray.tune.progress import SweepProgress
    from fedray.tune.schedulers import make_scheduler
    from fedray.tune.sweep import make_run_config

    spec = spec_from(tmp_path)
    sweep_dir = tmp_path / "s-1"
    sweep_dir.mkdir()
    (sweep_dir / "sweep.yaml").write_text(spec.to_yaml())
    callbacks = make_run_config(spec, sweep_dir, make_scheduler(spec), verbose=False).callbacks
    writer = callbacks[0]
    writer.setup()
    ok, bad = fake_trial("ok", "RUNNING", {"data.alpha": 0.1}), fake_trial("bad", "ERROR", {"data.alpha": 0.5}, error="x")
    writer.on_trial_result(0, [ok, bad], ok, tune_result(1, 0.6))
    writer.on_trial_result(0, [ok, bad], bad, tune_result(1, 0.9))

    restored = cloudpickle.loads(cloudpickle.dumps(callbacks))
    progress = next(c for c in restored if isinstance(c, SweepProgress))
    assert progress.results is restored[0] and restored[0].spec == load_sweep(sweep_dir / "sweep.yaml")
    restored[0].setup()
    assert restored[0].best() == ("ok", 0.6)

    # what unpickling does with the attributes an older fedray's SweepResults pickled (no `_statuses`)
    old_state = {key: value for key, value in writer.__dict__.items() if key != "_statuses"}
    from_old_pickle = SweepResults.__new__(SweepResults)
    from_old_pickle.__setstate__(old_state)
    from_old_pickle.setup()
    assert from_old_pickle.best() == ("ok", 0.6)


# ---------------------------------------------------------------------- Tune configuration
def test_tune_configuration_follows_the_sweep_file(tmp_path):
    from ray.tune.schedulers import AsyncHyperBandScheduler, FIFOScheduler
    from ray.tune.search import BasicVariantGenerator

    from fedray.tune.schedulers import make_scheduler
    from fedray.tune.sweep import make_run_config, make_tune_config

    spec = spec_from(
        tmp_path,
        space={"train.rounds": {"grid": [3, 6]}},
        scheduler={"type": "asha", "grace_period": 2, "reduction_factor": 3},
        max_concurrent_trials=2,
        max_failures=4,
        num_samples=2,
    )
    tune_config = make_tune_config(spec, make_scheduler(spec))
    assert (tune_config.metric, tune_config.mode, tune_config.num_samples) == ("test_accuracy", "max", 2)
    scheduler = tune_config.scheduler
    assert isinstance(scheduler, AsyncHyperBandScheduler)
    assert (scheduler._time_attr, scheduler._max_t, scheduler._reduction_factor) == ("round", 6, 3)
    # the concurrency limit sits on the variant generator (Tune ignores TuneConfig's for it)
    assert isinstance(tune_config.search_alg, BasicVariantGenerator) and tune_config.search_alg.max_concurrent == 2
    assert tune_config.max_concurrent_trials is None
    fifo = spec_from(tmp_path)
    assert isinstance(make_tune_config(fifo, make_scheduler(fifo)).scheduler, FIFOScheduler)
    # warm trials by default: Tune reuses a trial's process (and fedray its pool) for the next trial
    assert tune_config.reuse_actors is True
    cold = spec_from(tmp_path, reuse_workers=False)
    assert make_tune_config(cold, make_scheduler(cold)).reuse_actors is False
    run_config = make_run_config(spec, tmp_path / "s-1", scheduler, verbose=False)
    assert (run_config.name, run_config.storage_path) == ("s-1", str(tmp_path / "s-1" / "tune"))
    assert run_config.failure_config.max_failures == 4
    # quiet by default: fedray's progress line instead of Tune's table; the scheduler's state is saved
    from fedray.tune.progress import SweepProgress
    from fedray.tune.schedulers import SchedulerState

    assert run_config.verbose == 0 and any(isinstance(c, SweepProgress) for c in run_config.callbacks)
    assert next(c for c in run_config.callbacks if isinstance(c, SchedulerState)).scheduler is scheduler
    verbose = make_run_config(spec, tmp_path / "s-1", scheduler, verbose=True)
    assert verbose.verbose == 2 and not any(isinstance(c, SweepProgress) for c in verbose.callbacks)


def test_pbt_mutates_the_space_and_keeps_perturbed_values_inside_it(tmp_path):
    from ray.tune.schedulers import PopulationBasedTraining

    from fedray.tune.schedulers import KeepInSpace, make_scheduler

    spec = spec_from(
        tmp_path,
        base={**TINY_BASE, "train": {"rounds": 6, "clients_per_round": 3}, "checkpoint": {"every": 2}},
        space={
            "train.lr": {"loguniform": [0.01, 0.1]},
            "train.local_epochs": {"randint": [1, 4]},
            "train.optimizer": {"choice": ["sgd", "adam"]},
        },
        scheduler={"type": "pbt", "perturbation_interval": 2, "quantile_fraction": 0.5, "synch": True},
        num_samples=4,
    )
    scheduler = make_scheduler(spec)
    assert isinstance(scheduler, PopulationBasedTraining) and scheduler._synch and scheduler._quantile_fraction == 0.5
    assert (scheduler._time_attr, scheduler._perturbation_interval) == ("round", 2)
    assert scheduler._hyperparam_mutations["train.optimizer"] == ["sgd", "adam"]
    clip = KeepInSpace(spec.space)
    assert clip({"train.lr": 0.12, "train.local_epochs": 4.4, "train.optimizer": "adam"}) == {
        "train.lr": 0.1,
        "train.local_epochs": 3,
        "train.optimizer": "adam",
    }
    assert clip({"train.lr": 0.05, "train.local_epochs": 0.2, "train.optimizer": "sgd"})["train.local_epochs"] == 1
