"""Out-of-tree algorithms and callbacks (``package.module:ClassName`` and the ``fedray.algorithms``
entry-point group), the import direction config → algorithms, and the lazy public API.

Every test uses a copy of ``examples/plugins/mylab`` in a temporary directory outside the package,
imported from that directory (the current directory), never from ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

import fedray
from fedray.algorithms import RoundResults, get_algorithm_class
from fedray.cli.main import main
from fedray.config import ConfigError
from fedray.data import build_federated_dataset
from fedray.plugins import build_config, user_module_paths
from fedray.tracking import read_metrics

REPO = Path(__file__).resolve().parents[2]
PLUGINS = REPO / "examples" / "plugins"
TINY = {
    "data": {"num_clients": 6},
    "train": {"rounds": 3, "clients_per_round": 4, "local_epochs": 1},
    "checkpoint": {"every": 3},
    "output": {"tensorboard": False, "plots": False},
}


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    """A copy of the example plug-ins in a temporary directory, made the current directory; the
    ``mylab`` modules it imports are forgotten afterwards."""
    project = tmp_path / "project"
    shutil.copytree(PLUGINS, project, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.chdir(project)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield project
    for name in [name for name in sys.modules if name == "mylab" or name.startswith("mylab.")]:
        del sys.modules[name]


def subprocess_env() -> dict[str, str]:
    """The environment of a ``fedray`` subprocess: this checkout's fedray on PYTHONPATH, nothing else."""
    return {**os.environ, "PYTHONPATH": str(REPO)}


# --------------------------------------------------------------------- import direction, lazy API


@pytest.mark.slow
def test_config_does_not_import_the_algorithms_and_import_fedray_is_cheap():
    code = (
        "import sys, fedray.config\n"
        "assert 'fedray.algorithms' not in sys.modules, 'fedray.config imports fedray.algorithms'\n"
        "import fedray\n"
        "heavy = [m for m in ('torch', 'ray', 'fedray.algorithms', 'fedray.runtime') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "import fedray.algorithms\n"
        "upward = [m for m in sys.modules if m.startswith(('fedray.runtime', 'fedray.tune', 'fedray.cli', 'fedray.plugins'))]\n"
        "assert not upward, f'fedray.algorithms imports layers above it: {upward}'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=subprocess_env())


def test_fedrays_packages_import_one_another_without_a_cycle():
    """Every ``fedray.<x>`` import in the source, function-local and type-checking ones included,
    as an edge between fedray's top-level packages and modules: the graph has no cycle."""
    import ast
    from graphlib import CycleError, TopologicalSorter

    package_root = Path(fedray.__file__).parent
    imports: dict[str, set[str]] = {}
    for path in package_root.rglob("*.py"):
        importer = path.relative_to(package_root).parts[0].removesuffix(".py")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            elif isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            else:
                continue
            imported = {m.split(".")[1] for m in modules if m.startswith("fedray.")} - {importer}
            imports.setdefault(importer, set()).update(imported)
    assert {"runtime", "tracking", "config", "algorithms"} <= imports.keys() and "config" in imports["algorithms"]
    try:
        TopologicalSorter(imports).prepare()
    except CycleError as error:
        cycle = error.args[1][::-1]  # graphlib lists each package before the ones that import it
        pytest.fail(f"fedray's packages import one another in a cycle: {' imports '.join(cycle)}")


def test_the_public_api_names_resolve_lazily_with_docstrings():
    for name in fedray.__all__:
        value = getattr(fedray, name)
        assert name == "__version__" or value.__doc__, f"fedray.{name} has no docstring"
    assert fedray.Algorithm is fedray.algorithms.base.Algorithm and issubclass(get_algorithm_class("fedavg"), fedray.Algorithm)
    with pytest.raises(AttributeError):
        fedray.no_such_name  # noqa: B018


# --------------------------------------------------------------------- resolution before Ray


def test_a_module_reference_resolves_and_its_params_are_validated(user_dir):
    config = build_config({"algorithm": {"name": "mylab.fedavgm:FedAvgM", "server_lr": 0.5}})
    assert config.algorithm.model_extra == {"server_lr": 0.5, "server_momentum": 0.9}  # defaults filled
    with pytest.raises(ConfigError, match=r"algorithm\.server_momentum: Input should be less than 1"):
        build_config({"algorithm": {"name": "mylab.fedavgm:FedAvgM", "server_momentum": 1.5}})
    with pytest.raises(ConfigError, match=r"algorithm\.mu: unknown key \(allowed: server_lr, server_momentum\)"):
        build_config({"algorithm": {"name": "mylab.fedavgm:FedAvgM", "mu": 0.1}})
    assert user_module_paths(config) == [str(user_dir / "mylab")]
    assert user_module_paths(build_config()) == []  # built-ins are never shipped


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("mylab.nothere:FedAvgM", r"cannot import module 'mylab.nothere'.*No module named 'mylab.nothere'"),
        ("mylab.fedavgm:FedAvgX", r"module 'mylab.fedavgm' has no 'FedAvgX'"),
        ("mylab.fedavgm:torch", r"'mylab.fedavgm:torch' is not a subclass of fedray.Algorithm"),
        ("mylab.clash:MyFedAvg", r"'mylab.clash:MyFedAvg' declares name = 'fedavg', which is a built-in algorithm"),
        ("fedfoo", r"unknown algorithm 'fedfoo' \(allowed: .*fedavg.*package.module:ClassName"),
        ("mylab.fedavgm:", r"expected 'package.module:ClassName'"),
    ],
)
def test_bad_algorithm_references_are_config_errors(user_dir, name, message):
    (user_dir / "mylab" / "clash.py").write_text(
        "from fedray.algorithms.fedavg import FedAvg\n\nclass MyFedAvg(FedAvg):\n    pass  # keeps name = 'fedavg'\n"
    )
    with pytest.raises(ConfigError, match=r"algorithm\.name: " + message):
        build_config({"algorithm": {"name": name}})


def test_a_bad_plugin_path_exits_2_before_ray(user_dir, tmp_path):
    out = tmp_path / "runs"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedray.cli.main",
            "run",
            "--quiet",
            "--set",
            "algorithm.name=mylab.fedavgm_typo:FedAvgM",
            "--set",
            f"output.dir={out}",
        ],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert "algorithm.name: cannot import module 'mylab.fedavgm_typo'" in result.stderr
    assert "Started a local Ray instance" not in result.stderr and not out.exists()  # nothing ran


def test_fedray_submit_validates_the_plugin_before_contacting_the_cluster(user_dir, tmp_path, monkeypatch, capsys):
    """From outside the working directory: the plug-in imports from the directory that is uploaded.
    Port 9 (discard) has no job server, so exit 2 naming the key shows the check came first."""
    monkeypatch.chdir(tmp_path)
    submit = ["submit", "--address", "http://127.0.0.1:9", "--working-dir", "project", "--"]
    assert main([*submit, "run", "--set", "algorithm.name=mylab.fedavgm:FedAvgM", "--set", "algorithm.server_lr=0"]) == 2
    assert "algorithm.server_lr: Input should be greater than 0" in capsys.readouterr().err
    sweep = {"base": {"algorithm": {"name": "mylab.fedavgm:FedAvgM"}}, "space": {"algorithm.server_momentum": {"grid": [0.5, 1.5]}}}
    (user_dir / "sweep.yaml").write_text(yaml.safe_dump(sweep))
    assert main([*submit, "tune", "project/sweep.yaml"]) == 2
    assert "algorithm.server_momentum=1.5 has an invalid run config" in capsys.readouterr().err


def test_callbacks_are_checked_before_ray(user_dir):
    with pytest.raises(ConfigError, match=r"output\.callbacks\.0: unknown callback 'wandb' \(allowed: mlflow"):
        build_config({"output": {"callbacks": ["wandb"]}})
    with pytest.raises(ConfigError, match=r"output\.callbacks\.1: 'mylab.fedavgm:FedAvgM' is not a subclass of fedray.Callback"):
        build_config({"output": {"callbacks": ["mylab.loggers:JsonLinesLogger", "mylab.fedavgm:FedAvgM"]}})
    config = build_config({"output": {"callbacks": ["mylab.loggers:JsonLinesLogger"]}})
    assert user_module_paths(config) == [str(user_dir / "mylab")]


def write_distribution(site_dir: Path, name: str, entry_points: dict[str, str]) -> None:
    """An installed distribution's metadata as pip writes it (``*.dist-info`` with entry points)."""
    dist_info = site_dir / f"{name}-0.1.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    lines = "".join(f"{key} = {value}\n" for key, value in entry_points.items())
    (dist_info / "entry_points.txt").write_text(f"[fedray.algorithms]\n{lines}")


def test_installed_packages_register_names_through_entry_points(user_dir, tmp_path, monkeypatch):
    site_dir = tmp_path / "site"
    shutil.move(user_dir / "mylab", site_dir / "mylab")  # installed, not in the current directory
    write_distribution(site_dir, "mylab_plugins", {"fedavgm_installed": "mylab.fedavgm:FedAvgM"})
    monkeypatch.syspath_prepend(str(site_dir))
    config = build_config({"algorithm": {"name": "fedavgm_installed", "server_momentum": 0.5}})
    assert get_algorithm_class(config.algorithm.name).__name__ == "FedAvgM"
    assert "fedavgm_installed" in list(fedray.algorithms.ALGORITHMS)

    write_distribution(site_dir, "rogue_plugins", {"fedavg": "mylab.fedavgm:FedAvgM"})
    with pytest.raises(ConfigError, match=r"entry point 'mylab.fedavgm:FedAvgM' .* registers 'fedavg', which is a built-in"):
        build_config({"algorithm": {"name": "fedavg"}})


# --------------------------------------------------------------------- the example algorithms' maths


def algorithm_of(name: str, **params):
    config = build_config({"algorithm": {"name": name, **params}})
    return get_algorithm_class(name)(config, build_federated_dataset(config.data, 0).info)


def test_fedavgm_is_fedavg_without_momentum_and_accumulates_with_it(user_dir):
    w0, mean = torch.zeros(4), torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    results = RoundResults(
        sums={"weights": 2 * mean, "num_samples": torch.tensor(2.0, dtype=torch.float64)},
        payloads={},
        client_metrics={},
        num_clients=2,
        excluded_clients=[],
    )
    plain = algorithm_of("mylab.fedavgm:FedAvgM", server_momentum=0.0)
    state, _ = plain.aggregate({"weights": w0, "momentum": torch.zeros(4)}, 1, results)
    assert torch.allclose(state["weights"], mean.float())
    heavy = algorithm_of("mylab.fedavgm:FedAvgM", server_momentum=0.5, server_lr=1.0)
    state, _ = heavy.aggregate({"weights": w0, "momentum": torch.ones(4)}, 1, results)
    # v = 0.5·1 + (0 − mean); w = 0 − v = mean − 0.5
    assert torch.allclose(state["weights"], mean.float() - 0.5) and torch.allclose(state["momentum"], 0.5 - mean.float())


def test_trimmed_mean_drops_the_extremes_of_every_coordinate(user_dir):
    algorithm = algorithm_of("mylab.trimmed_mean:TrimmedMean", trim_fraction=0.2)
    vectors = [
        torch.tensor([1.0, -1.0]),
        torch.tensor([2.0, -2.0]),
        torch.tensor([3.0, -3.0]),
        torch.tensor([4.0, -4.0]),
        torch.tensor([1000.0, 1000.0]),
    ]  # one outlier client
    results = RoundResults(
        sums={}, payloads={k: {"weights": v} for k, v in enumerate(vectors)}, client_metrics={}, num_clients=5, excluded_clients=[]
    )
    state, metrics = algorithm.aggregate({"weights": torch.zeros(2)}, 1, results)
    assert torch.allclose(state["weights"], torch.tensor([3.0, -2.0]))  # [2, 3, 4] and [-3, -2, -1]
    assert metrics == {"trimmed_clients": 2.0}


# --------------------------------------------------------------------- end to end: CLI (local backend), Python API on Ray, mlflow


@pytest.mark.slow
def test_fedray_run_cli_runs_a_users_algorithm_callback_and_model(user_dir, tmp_path):
    """``fedray run`` in a subprocess, the user's directory as its working directory; PYTHONPATH holds
    only fedray. The command imports the out-of-tree algorithm, callback and model (``my_model.py``,
    with ``model.kwargs``) from there, checks the model and trains it. One worker: the local backend,
    no Ray (bit-identical to Ray by design); shipping the same kinds of user code to Ray's server and
    workers is proven by ``test_python_api_runs_users_code_on_the_session_ray`` (runs) and
    ``tests/e2e/test_user_code_sweep.py`` (``fedray tune``'s trials)."""
    config = {
        **TINY,
        # momentum 0 (not the default 0.9): with momentum, DigitsNet's BatchNorm statistics make this tiny run collapse
        "algorithm": {"name": "mylab.fedavgm:FedAvgM", "server_momentum": 0.0},
        "model": {"name": "my_model:DigitsNet", "kwargs": {"width": 8}},
        "resources": {"num_workers": 1},
        "output": {**TINY["output"], "dir": str(tmp_path / "runs"), "name": "cli", "callbacks": ["mylab.loggers:JsonLinesLogger"]},
    }
    (user_dir / "cfg.yaml").write_text(yaml.safe_dump(config))
    result = subprocess.run(
        [sys.executable, "-m", "fedray.cli.main", "run", "cfg.yaml", "--quiet"],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "runs" / "cli"
    assert not (run_dir / "workers.json").exists()  # the local backend: no Ray actors
    rows = read_metrics(run_dir, "round")
    assert [row["round"] for row in rows] == [1, 2, 3]
    assert all(row["server_step_norm"] > 0 for row in rows)  # FedAvgM's own aggregate ran in the server
    assert rows[-1]["test_accuracy"] > 0.2  # the user's model trained, not chance (10 classes)
    logged = [json.loads(line) for line in (run_dir / "rounds.jsonl").read_text().splitlines()]
    assert [row["round"] for row in logged] == [1, 2, 3]  # the out-of-tree callback saw every round
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert (saved["algorithm"]["server_momentum"], saved["algorithm"]["server_lr"]) == (0.0, 1.0)  # given, and the default filled
    assert (saved["model"]["name"], saved["model"]["kwargs"]) == ("my_model:DigitsNet", {"width": 8})


@pytest.mark.slow
@pytest.mark.ray
def test_python_api_runs_users_code_on_the_session_ray(ray_session, user_dir, tmp_path):
    """The session's Ray was started from the repository, so its server and two worker actors can
    import the out-of-tree algorithm, callback and model (``my_model.py``, a single-file module) only
    from the runtime_env fedray ships with the server actor."""
    import ray

    assert str(user_dir) not in ray.get(ray.remote(lambda: sys.path).remote())  # not on the workers' path
    received = []

    class Recorder(fedray.Callback):
        def on_round_end(self, run, row, client_rows):
            received.append((row["round"], len(client_rows)))

    config = fedray.build_config(
        {
            **TINY,
            "algorithm": {"name": "mylab.trimmed_mean:TrimmedMean", "trim_fraction": 0.25},
            "model": {"name": "my_model:DigitsNet", "kwargs": {"width": 8}},
            "resources": {"num_workers": 2, "backend": "ray"},
            "output": {**TINY["output"], "dir": str(tmp_path / "runs"), "name": "api", "callbacks": ["mylab.loggers:JsonLinesLogger"]},
        }
    )
    assert user_module_paths(config) == [str(user_dir / "mylab"), str(user_dir / "my_model.py")]  # what is shipped
    summary = fedray.run_experiment(config, progress=False, extra_callbacks=[Recorder()])
    assert summary.rounds == 3 and summary.final_test_accuracy > 0.2
    assert received == [(1, 4), (2, 4), (3, 4)]
    rows = fedray.read_metrics(summary.run_dir)
    assert [row["trimmed_clients"] for row in rows] == [2.0, 2.0, 2.0]  # int(0.25 · 4) at each end
    assert len((Path(summary.run_dir) / "rounds.jsonl").read_text().splitlines()) == 3
    [placement] = json.loads((Path(summary.run_dir) / "workers.json").read_text())["placements"]
    assert len(placement["worker_node_ids"]) == 2  # the workers were Ray actors


@pytest.mark.slow
def test_mlflow_callback_writes_a_run_that_mlflows_client_reads_back(tmp_path, monkeypatch):
    """On the local backend: run callbacks run in the driver, on Ray too."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    config = fedray.build_config(
        {
            **TINY,
            "data": {"num_clients": 6, "alpha": 0.3},
            "resources": {"backend": "local"},
            "output": {"dir": str(tmp_path / "runs"), "name": "tracked", "tensorboard": False, "callbacks": ["mlflow"]},
        }
    )
    summary = fedray.run_experiment(config, progress=False)

    client = MlflowClient(tracking_uri=(tmp_path / "runs" / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("fedray")
    [run] = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "tracked"
    params = run.data.params
    assert (params["data.alpha"], params["algorithm.name"], params["train.rounds"]) == ("0.3", "fedavg", "3")
    rows = fedray.read_metrics(summary.run_dir)
    for metric in ("test_accuracy", "train_loss", "test_loss"):
        history = sorted(client.get_metric_history(run.info.run_id, metric), key=lambda m: m.step)
        assert [(m.step, m.value) for m in history] == [(row["round"], pytest.approx(row[metric])) for row in rows]
    artifacts = {artifact.path for artifact in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "learning_curve.png", "partition.png"} <= artifacts


@pytest.mark.slow
@pytest.mark.ray
def test_tune_on_a_ray_started_without_the_module_fails_before_any_trial(ray_session, user_dir, tmp_path, capsys):
    """The session's Ray was started elsewhere, without ``mylab``: Tune's trials (which inherit the
    job's runtime_env) could not import it, so the sweep stops before it starts, saying how to fix it."""
    sweep = {
        "base": {**TINY, "algorithm": {"name": "mylab.fedavgm:FedAvgM"}},
        "space": {"algorithm.server_momentum": {"grid": [0.0, 0.5]}},
        "output": {"dir": str(tmp_path / "sweeps")},
    }
    (user_dir / "sweep.yaml").write_text(yaml.safe_dump(sweep))
    assert main(["tune", "sweep.yaml"]) == 2
    err = capsys.readouterr().err
    assert "Ray was started without your module(s) mylab" in err and "py_modules" in err
    assert not (tmp_path / "sweeps").exists()
