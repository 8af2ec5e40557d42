"""User code that fails (issue 42, item 5): a plug-in algorithm that raises or returns what the runtime
cannot use, and ``output.callbacks`` that raise, need arguments or call ``sys.exit``.

Each case is a real run (the local backend, and the session's Ray for the errors that cross actors)
of a user module written into the test's directory. An algorithm's failure is one ``fedray:`` line
naming the algorithm, the method, the client and the round, with the user's frames below it, and
exit 1; what can be checked at import is refused before Ray (exit 2). A callback that raises is
reported and switched off, and the run goes on to the same results; one that calls ``sys.exit``
stops the run with exit 1 and the resume command.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fedray.config import ConfigError
from fedray.layout import SUMMARY_FILE
from fedray.plugins import build_config
from fedray.runtime import list_checkpoints, run_experiment
from fedray.runtime.errors import UserCodeError

from e2e_helpers import comparable_rows, round_rows
from preloaded_cli import run_fedray_preloaded
from test_bad_inputs import assert_rejected

REPO = Path(__file__).resolve().parents[2]
MODULE = "brokenlab"
USER_CODE = textwrap.dedent("""
    import sys
    from abc import ABC, abstractmethod

    import torch

    from fedray import Algorithm, Callback, ClientUpdate
    from fedray.algorithms.fedavg import FedAvg


    def load_the_batch(client_id):
        raise ValueError(f"no batch for client {client_id}")  # the line the frames must show


    class RaisesInClientUpdate(FedAvg):
        name = "raises_in_client_update"

        def client_update(self, ctx, broadcast):
            return load_the_batch(ctx.client_id)


    class RaisesInAggregate(FedAvg):
        name = "raises_in_aggregate"

        def aggregate(self, server_state, round, results):
            raise RuntimeError("cannot aggregate")


    class RaisesInEvaluation(FedAvg):
        name = "raises_in_evaluation"

        def evaluate_global(self, model, broadcast, x, y):
            if broadcast["round"] > 2:  # the model after round 2 is evaluated with round 3's broadcast
                raise ZeroDivisionError("no test rows")
            return super().evaluate_global(model, broadcast, x, y)

        def broadcast(self, server_state, round):
            return {**super().broadcast(server_state, round), "round": round}


    class ReturnsADict(FedAvg):
        name = "returns_a_dict"

        def client_update(self, ctx, broadcast):
            return {"sums": super().client_update(ctx, broadcast).sums}


    class ReturnsFloatSums(FedAvg):
        name = "returns_float_sums"

        def client_update(self, ctx, broadcast):
            update = super().client_update(ctx, broadcast)
            return ClientUpdate(sums={**update.sums, "num_samples": float(ctx.num_samples)}, metrics=update.metrics)


    class CallsSysExit(FedAvg):
        name = "calls_sys_exit"

        def client_update(self, ctx, broadcast):
            sys.exit(0)


    class NoClientUpdate(Algorithm):
        name = "no_client_update"


    class Abstract(FedAvg, ABC):
        name = "abstract"

        @abstractmethod
        def local_loss(self, ctx):
            ...


    class FailsOnRoundTwo(Callback):
        def on_round_end(self, run, row, client_rows):
            if row["round"] == 2:
                raise KeyError("dashboard")


    class FailsAtTheEnd(Callback):
        def on_run_end(self, run):
            raise OSError("the tracking server is down")


    class NeedsArguments(Callback):
        def __init__(self, path):
            self.path = path


    class FailsToStart(Callback):
        def __init__(self):
            raise ConnectionError("no tracking server")


    class ExitsAfterRoundOne(Callback):
        def on_round_end(self, run, row, client_rows):
            sys.exit(0)
""")
LOCAL_RUN = {
    "data": {"num_clients": 4},
    "train": {"rounds": 3, "clients_per_round": 4, "local_epochs": 1},
    "checkpoint": {"every": 1},
    "resources": {"num_workers": 1},  # the local backend
    "output": {"tensorboard": False, "plots": False},
}


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    """``brokenlab.py`` in the test's directory, made the current directory (forgotten afterwards)."""
    (tmp_path / f"{MODULE}.py").write_text(USER_CODE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    yield tmp_path
    sys.modules.pop(MODULE, None)


def config_with(tmp_path: Path, algorithm: str = "fedavg", callbacks: tuple[str, ...] = (), **resources):
    return build_config(
        {
            **LOCAL_RUN,
            "algorithm": {"name": algorithm},
            "resources": {**LOCAL_RUN["resources"], **resources},
            "output": {**LOCAL_RUN["output"], "dir": str(tmp_path / "runs"), "name": "run", "callbacks": list(callbacks)},
        }
    )


def fedray_run(directory: Path, *overrides: str) -> subprocess.CompletedProcess:
    """``fedray run --quiet`` in ``directory`` with the local-run settings: a fork of a preloaded process
    (tests/preloaded_cli.py) that imports the user's module from that directory, as ``python -m
    fedray.cli.main`` would, and exits with the command's code."""
    settings = [
        "data.num_clients=4",
        "train.rounds=3",
        "train.clients_per_round=4",
        "train.local_epochs=1",
        "checkpoint.every=1",
        "resources.num_workers=1",
        "output.tensorboard=false",
        "output.plots=false",
        f"output.dir={directory / 'runs'}",
        "output.name=run",
        *overrides,
    ]
    return run_fedray_preloaded(["run", "--quiet", *(a for s in settings for a in ("--set", s))], directory)


# --------------------------------------------------------------------- algorithms


ALGORITHM_FAULTS = [
    # class, method, client (None: server side), round, the problem, a line of the user's frames
    ("RaisesInClientUpdate", "client_update", 0, 1, "raised ValueError: no batch for client 0", 'raise ValueError(f"no batch'),
    ("RaisesInAggregate", "aggregate", None, 1, "raised RuntimeError: cannot aggregate", 'raise RuntimeError("cannot aggregate")'),
    ("RaisesInEvaluation", "evaluate_global", None, 2, "raised ZeroDivisionError: no test rows", "raise ZeroDivisionError"),
    ("ReturnsADict", "client_update", 0, 1, "returned a dict, not a fedray.ClientUpdate", "in client_update"),
    (
        "ReturnsFloatSums",
        "client_update",
        0,
        1,
        "returned sums['num_samples'] of type float: every sum must be a torch tensor",
        "in client_update",
    ),
    ("CallsSysExit", "client_update", 0, 1, "called sys.exit(0)", "sys.exit(0)"),
]


@pytest.mark.parametrize(("name", "method", "client", "round", "problem", "frame"), ALGORITHM_FAULTS, ids=[f[0] for f in ALGORITHM_FAULTS])
def test_an_algorithm_that_fails_is_named_with_its_method_client_and_round(user_dir, name, method, client, round, problem, frame):
    config = config_with(user_dir, f"{MODULE}:{name}")
    with pytest.raises(UserCodeError) as raised:
        run_experiment(config, progress=False)
    error = raised.value
    assert (error.owner, error.method, error.client, error.round) == (f"algorithm {MODULE}:{name}", method, client, round)
    assert error.problem.startswith(problem), error.problem
    assert str(user_dir / f"{MODULE}.py") in error.user_frames and frame in error.user_frames
    assert "fedray/runtime" not in error.user_frames  # the user's frames only
    run_dir = user_dir / "runs" / "run"
    if round == 1:  # nothing was kept, and the error says so
        assert str(error).endswith("it stopped before its first round, so nothing was kept") and not run_dir.exists()
    else:
        assert str(error).endswith(f"continue it from its checkpoint of round {round - 1} with `fedray run --resume {run_dir}`")


def test_the_cli_prints_one_line_and_the_users_frames_below_it(user_dir):
    result = fedray_run(user_dir, f"algorithm.name={MODULE}:RaisesInAggregate")
    assert result.returncode == 1, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert lines[0] == (
        f"fedray: algorithm {MODULE}:RaisesInAggregate: aggregate (round 1) raised RuntimeError: cannot aggregate; "
        "it stopped before its first round, so nothing was kept"
    )
    line = USER_CODE.splitlines().index('        raise RuntimeError("cannot aggregate")') + 1
    assert lines[1:] == [f'  File "{user_dir / MODULE}.py", line {line}, in aggregate', '    raise RuntimeError("cannot aggregate")']
    assert "Traceback" not in result.stderr


def test_an_algorithm_without_client_update_or_with_an_abstract_method_is_refused_before_ray(user_dir):
    result = fedray_run(user_dir, f"algorithm.name={MODULE}:NoClientUpdate")
    assert_rejected(result, f"algorithm.name: '{MODULE}:NoClientUpdate' does not define client_update(self, ctx, broadcast)")
    assert "Started a local Ray instance" not in result.stderr and not (user_dir / "runs").exists()
    with pytest.raises(ConfigError, match=rf"'{MODULE}:Abstract' leaves the abstract method\(s\) local_loss undefined"):
        config_with(user_dir, f"{MODULE}:Abstract")


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.parametrize(
    ("name", "method", "client"), [("RaisesInClientUpdate", "client_update", 0), ("RaisesInAggregate", "aggregate", None)]
)
def test_on_ray_the_error_from_a_worker_or_the_server_actor_is_the_same(ray_session, user_dir, name, method, client):
    config = config_with(user_dir, f"{MODULE}:{name}", backend="ray")
    with pytest.raises(UserCodeError) as raised:
        run_experiment(config, progress=False)
    error = raised.value
    assert type(error) is UserCodeError  # not Ray's wrapper: the driver unwrapped it
    assert (error.owner, error.method, error.client, error.round) == (f"algorithm {MODULE}:{name}", method, client, 1)
    # the user's frames (in the copy of the module Ray shipped to the actor), no frame of Ray's or fedray's
    assert f"{MODULE}.py" in error.user_frames and "site-packages" not in error.user_frames and "fedray/runtime" not in error.user_frames
    assert str(error).endswith("it stopped before its first round, so nothing was kept")


# --------------------------------------------------------------------- callbacks


def test_a_callback_that_raises_is_reported_and_switched_off_and_the_run_is_unchanged(user_dir, caplog):
    reference = run_experiment(config_with(user_dir / "reference"), progress=False)
    with caplog.at_level(logging.WARNING, logger="fedray.runtime.user_code"):
        summary = run_experiment(config_with(user_dir, callbacks=(f"{MODULE}:FailsOnRoundTwo", f"{MODULE}:FailsAtTheEnd")), progress=False)
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 2, warnings
    assert warnings[0].startswith(
        f"warning: callback {MODULE}:FailsOnRoundTwo: on_round_end (round 2) raised KeyError: 'dashboard'; "
        "the callback is switched off for the rest of the run, which goes on"
    )
    assert 'raise KeyError("dashboard")' in warnings[0]
    assert warnings[1].startswith(f"warning: callback {MODULE}:FailsAtTheEnd: on_run_end raised OSError: the tracking server is down")
    assert summary.rounds == 3 and (Path(summary.run_dir) / SUMMARY_FILE).is_file()
    assert comparable_rows(round_rows(summary.run_dir)) == comparable_rows(round_rows(reference.run_dir))
    assert json.loads((Path(summary.run_dir) / SUMMARY_FILE).read_text())["final_metrics"]["test_accuracy"] == reference.final_test_accuracy


def test_a_callback_that_needs_arguments_is_refused_before_anything_is_written(user_dir):
    result = fedray_run(user_dir, f"output.callbacks=[{MODULE}:NeedsArguments]")
    assert_rejected(
        result, f"output.callbacks.0: '{MODULE}:NeedsArguments' cannot be built without arguments (missing a required argument: 'path')"
    )
    assert not (user_dir / "runs").exists()  # no config.yaml left behind to block output.name


def test_a_callback_whose_init_raises_leaves_nothing_behind(user_dir):
    with pytest.raises(UserCodeError, match=rf"callback {MODULE}:FailsToStart: __init__ raised ConnectionError: no tracking server"):
        run_experiment(config_with(user_dir, callbacks=(f"{MODULE}:FailsToStart",)), progress=False)
    assert not (user_dir / "runs").exists()


def test_sys_exit_in_a_callback_stops_the_run_with_exit_1_and_the_resume_command(user_dir):
    result = fedray_run(user_dir, f"output.callbacks=[{MODULE}:ExitsAfterRoundOne]")
    run_dir = user_dir / "runs" / "run"
    assert result.returncode == 1, result.stderr[-3000:]
    assert result.stderr.splitlines()[0] == (
        f"fedray: callback {MODULE}:ExitsAfterRoundOne: on_round_end (round 1) called sys.exit(0); "
        f"continue it from its checkpoint of round 1 with `fedray run --resume {run_dir}`"
    )
    assert [round for round, _ in list_checkpoints(run_dir)] == [1] and not (run_dir / SUMMARY_FILE).exists()
