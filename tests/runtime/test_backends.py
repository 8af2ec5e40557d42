"""The two backends (``resources.backend``): the local pool (the workers in the driver process) and
Ray's worker actors give the same partials, so bit-identical metrics and weights; which backend a
run picks; a resumed local run; and debugging a client update in one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import fedray
from e2e_helpers import CrashAfterRound, comparable_rows, final_weights, round_rows
from fedray.config import ConfigError
from fedray.config.schema import ResourcesConfig
from fedray.runtime.ray_start import uses_ray
from fedray.tracking import read_metrics
from preloaded_cli import RAY_STARTED, run_fedray_preloaded

REPO = Path(__file__).resolve().parents[2]


def run(tmp_path: Path, example: str, backend: str, overrides: list[str], callbacks=()) -> Path:
    config = fedray.load_config(
        REPO / "examples" / example,
        [
            f"output.dir={tmp_path}",
            f"output.name={backend}",
            f"resources.backend={backend}",
            "data.num_clients=8",
            "train.clients_per_round=4",
            "train.local_epochs=1",
            "train.rounds=3",
            "checkpoint.every=2",
            "output.tensorboard=false",
            "output.plots=false",
            *overrides,
        ],
    )
    summary = fedray.run_experiment(config, progress=False, extra_callbacks=list(callbacks))
    assert summary.backend == backend
    return Path(summary.run_dir)


# --------------------------------------------------------------------- choosing the backend


@pytest.mark.parametrize(
    ("backend", "workers", "address", "expected"),
    [
        ("auto", 1, None, False),
        ("auto", 2, None, True),
        ("auto", 1, "auto", True),
        ("local", 2, None, False),
        ("ray", 1, None, True),
    ],
)
def test_which_backend_a_run_uses(backend, workers, address, expected, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert uses_ray(ResourcesConfig(backend=backend, num_workers=workers), address) is expected


def test_ray_address_in_the_environment_means_ray_and_contradicts_local(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    assert uses_ray(ResourcesConfig(backend="auto", num_workers=1), None)
    with pytest.raises(ConfigError, match="resources.backend: local runs without Ray"):
        uses_ray(ResourcesConfig(backend="local"), None)


def test_local_backend_with_an_address_is_one_line_and_exit_2(tmp_path):
    """The real ``fedray run`` (a fork of the preloaded CLI process, tests/preloaded_cli.py)."""
    result = run_fedray_preloaded(
        ["run", "--address", "127.0.0.1:1", "--set", "resources.backend=local", "--set", f"output.dir={tmp_path}"],
        cwd=tmp_path,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "fedray: invalid config:",
        "  resources.backend: local runs without Ray, but a Ray address is given (127.0.0.1:1); set "
        "resources.backend=ray (or auto) to use that cluster, or drop the address",
    ]
    assert not any(tmp_path.iterdir())


def test_a_one_worker_run_starts_no_ray(tmp_path):
    """``fedray run`` with one worker runs on the local pool: no Ray process, no workers.json. The real
    CLI in a fork of the preloaded process (tests/preloaded_cli.py), which reports a Ray initialised
    by the command in an extra line of error."""
    result = run_fedray_preloaded(
        [
            "run",
            "--quiet",
            *("--set", "resources.num_workers=1", "--set", "train.rounds=2", "--set", "data.num_clients=6"),
            *("--set", "train.clients_per_round=3", "--set", f"output.dir={tmp_path}", "--set", "output.name=run"),
            *("--set", "output.plots=false", "--set", "output.tensorboard=false"),
        ],
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert RAY_STARTED not in result.stderr
    assert "local backend, no Ray" in result.stdout
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["backend"] == "local"
    assert not (tmp_path / "run" / "workers.json").exists()
    assert len(read_metrics(tmp_path / "run", "round")) == 2


# --------------------------------------------------------------------- same results on either backend


# The Ray side of this check runs for a small representative set (a Ray run of two workers costs
# tens of seconds): a stateful-client algorithm (scaffold: its global model is FedAvg's weighted mean,
# plus control variates in the state store) and the newest path, a regression task (float targets,
# RMSE sums).
# The other algorithms' uploads (fedper's personal heads and personalised evaluation, fedsc's
# per-client prototypes) are partials summed by the same worker code on either backend; their runs'
# determinism is proven on the local backend by their own tests (tests/runtime/test_state_store.py's
# FedPer resume, tests/e2e/test_e2e_personalized.py's FedCoSR resume,
# tests/e2e/test_e2e_prototype_algorithms.py), and hetero_ssfl (per-client architectures, a public
# set) has its own Ray run compared with a local-backend run bit for bit:
# tests/e2e/test_e2e_hetero_ssfl.py::test_killed_worker_on_ray_gives_the_same_federation.
@pytest.mark.slow
@pytest.mark.parametrize(
    ("example", "overrides"),
    [
        ("scaffold_digits.yaml", []),  # client state (control variates) in the state store
        ("regression_diabetes.yaml", ["data.min_samples_per_client=2"]),  # a regression (data.task): float targets, RMSE sums
    ],
)
def test_local_and_ray_runs_of_two_workers_are_bit_identical(ray_session, tmp_path, example, overrides):
    local = run(tmp_path, example, "local", ["resources.num_workers=2", *overrides])
    on_ray = run(tmp_path, example, "ray", ["resources.num_workers=2", *overrides])
    assert comparable_rows(round_rows(local)) == comparable_rows(round_rows(on_ray))
    assert read_metrics(local, "client") == read_metrics(on_ray, "client")
    local_state = fedray.runtime.load_checkpoint(fedray.runtime.list_checkpoints(local)[-1][1])["server_state"]
    ray_state = fedray.runtime.load_checkpoint(fedray.runtime.list_checkpoints(on_ray)[-1][1])["server_state"]
    assert local_state.keys() == ray_state.keys()
    for key, value in local_state.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, ray_state[key]), key


def test_a_resumed_local_run_is_bit_identical_to_an_uninterrupted_one(tmp_path):
    whole = run(tmp_path / "whole", "scaffold_digits.yaml", "local", ["train.rounds=4"])
    with pytest.raises(RuntimeError, match="simulated driver crash"):
        run(tmp_path / "cut", "scaffold_digits.yaml", "local", ["train.rounds=4"], [CrashAfterRound(3)])
    fedray.resume_experiment(tmp_path / "cut" / "local", progress=False)
    assert comparable_rows(round_rows(tmp_path / "cut" / "local")) == comparable_rows(round_rows(whole))
    assert torch.equal(final_weights(tmp_path / "cut" / "local"), final_weights(whole))


# --------------------------------------------------------------------- debugging in one process


@pytest.mark.slow  # a fedray process on a terminal
def test_breakpoint_in_client_update_stops_in_the_callers_terminal(tmp_path):
    """A user algorithm calls ``breakpoint()``: pdb reads the commands from this process's stdin."""
    (tmp_path / "debugged.py").write_text(
        textwrap.dedent(
            """
            from fedray.algorithms.fedavg import FedAvg

            class Debugged(FedAvg):
                name = "debugged"

                def client_update(self, ctx, broadcast):
                    breakpoint()
                    return super().client_update(ctx, broadcast)
            """
        )
    )
    env = {key: value for key, value in os.environ.items() if key != "PYTHONBREAKPOINT"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedray.cli.main",
            "run",
            "--quiet",
            "--set",
            "algorithm.name=debugged:Debugged",
            "--set",
            "resources.num_workers=1",
            "--set",
            "train.rounds=1",
            "--set",
            "data.num_clients=4",
            "--set",
            "train.clients_per_round=2",
            "--set",
            f"output.dir={tmp_path / 'runs'}",
            "--set",
            "output.plots=false",
        ],
        input="p ('client', ctx.client_id)\nc\n" * 2,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**env, "PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}"},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.count("(Pdb)") >= 2
    assert result.stdout.count("('client', ") == 2


def test_client_rows_carry_the_clients_samples_and_natural_ids(tmp_path):
    """A natural partition (one client per stdlib module): each client row names the module it is."""
    config = fedray.load_config(
        REPO / "examples" / "fedavg_text_stdlib.yaml",
        [
            f"output.dir={tmp_path}",
            "output.name=run",
            "train.rounds=1",
            "train.local_epochs=1",
            "output.plots=false",
            "output.tensorboard=false",
        ],
    )
    summary = fedray.run_experiment(config, progress=False)
    data = fedray.runtime.prepare_data(config)
    rows = read_metrics(summary.run_dir, "client")
    assert len(rows) == config.train.clients_per_round
    for row in rows:
        client = int(row["client_id"])
        assert row["num_samples"] == data.clients.sizes[client]
        assert row["client_name"] == data.client_names[client]
