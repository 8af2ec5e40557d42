"""ε everywhere a run reports (issue 44, item 5), on real ``fedray run`` commands (local backend, each a
fork of a preloaded process, tests/preloaded_cli.py): the
round rows of ``metrics.parquet``, the progress line and TensorBoard's event file carry the
accountant's ε of each round (the dashboard's run view: tests/dashboard/test_dashboard_privacy.py); a
run whose next round would pass ``privacy.target_epsilon`` stops before it with one line and exit
code 3, its rounds so far kept."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from preloaded_cli import run_fedray_preloaded

from fedray.config.privacy import default_delta
from fedray.privacy.accountant import CentralAccountant
from fedray.tracking.metrics_file import METRICS_FILE, read_metrics

POPULATION, COHORT, Z, ROUNDS = 12, 4, 1.5, 3
PRIVATE_RUN = [
    "resources.backend=local",
    "resources.num_workers=1",
    f"data.num_clients={POPULATION}",
    f"train.clients_per_round={COHORT}",
    "train.local_epochs=1",
    "privacy.mechanism=central",
    "privacy.clip=0.5",
    f"privacy.noise_multiplier={Z}",
    "checkpoint.every=1",
]


def fedray_run(directory: Path, overrides: list[str]):
    args = ["run"]
    for override in [*PRIVATE_RUN, f"output.dir={directory / 'runs'}", *overrides]:
        args += ["--set", override]
    result = run_fedray_preloaded(args, directory)
    (run_dir,) = (directory / "runs").iterdir()
    return result, run_dir


def expected_epsilons(rounds: int) -> list[float]:
    accountant = CentralAccountant("rdp", "poisson", POPULATION, COHORT, default_delta(POPULATION))
    return [accountant.epsilon(Z, round) for round in range(1, rounds + 1)]


@pytest.fixture(scope="module")
def private_run(tmp_path_factory):
    directory = tmp_path_factory.mktemp("private")
    result, run_dir = fedray_run(directory, [f"train.rounds={ROUNDS}"])
    assert result.returncode == 0, result.stderr[-3000:]
    return result, run_dir


def test_metrics_parquet_has_the_accountants_epsilon_of_every_round(private_run):
    _, run_dir = private_run
    assert (run_dir / METRICS_FILE).is_file()
    rows = read_metrics(run_dir)
    assert [row["round"] for row in rows] == list(range(1, ROUNDS + 1))
    assert [row["dp_epsilon"] for row in rows] == expected_epsilons(ROUNDS)
    assert all(row["dp_noise_multiplier"] == Z for row in rows)


def test_the_progress_line_shows_the_epsilon_spent(private_run):
    result, _ = private_run
    assert f"ε={expected_epsilons(ROUNDS)[-1]:.3g}" in result.stderr


def test_tensorboard_has_an_epsilon_curve(private_run):
    _, run_dir = private_run
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    scalars = events.Scalars("dp_epsilon")
    assert [event.step for event in scalars] == list(range(1, ROUNDS + 1))
    assert [event.value for event in scalars] == pytest.approx(expected_epsilons(ROUNDS), rel=1e-6)  # stored as float32


def test_a_run_stops_before_the_round_that_would_pass_the_target_epsilon(tmp_path):
    """The budget stop is the driver's (the accountant is the server's): the same on Ray, whose
    shutdown after an exception every Ray run's end exercises."""
    target = (expected_epsilons(3)[1] + expected_epsilons(3)[2]) / 2  # between rounds 2 and 3
    overrides = ["train.rounds=5", f"privacy.target_epsilon={target}", "resources.backend=local"]
    result, run_dir = fedray_run(tmp_path, overrides)
    assert result.returncode == 3, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert re.findall(r"fedray: [^\r\n]*", result.stderr) == [
        f"fedray: round 3 would spend ε = {expected_epsilons(3)[2]:.4g} > privacy.target_epsilon = {target:g} "
        f"(δ = {default_delta(POPULATION):g}); the run stops after round 2; raise the target, the noise multiplier or lower train.rounds"
    ]
    assert [row["dp_epsilon"] for row in read_metrics(run_dir)] == expected_epsilons(2)
    # ended as a finished run of 2 rounds: metrics compacted, the summary written
    assert (run_dir / "metrics.parquet").is_file() and not (run_dir / "metrics_parts").exists()
    assert json.loads((run_dir / "summary.json").read_text())["rounds"] == 2


def test_a_budget_that_round_1_would_pass_stops_the_run_with_the_budget_line_and_exit_3(tmp_path):
    """A new run whose first round would already pass the target: the budget stop (exit 3, one line),
    not a FileNotFoundError of summary.json written into the run directory removed as empty."""
    first = expected_epsilons(1)[0]
    args = ["run"]
    for override in [*PRIVATE_RUN, f"output.dir={tmp_path / 'runs'}", "train.rounds=3", f"privacy.target_epsilon={first / 2}"]:
        args += ["--set", override]
    result = run_fedray_preloaded(args, tmp_path)
    assert result.returncode == 3, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert re.findall(r"fedray: [^\r\n]*", result.stderr) == [
        f"fedray: round 1 would spend ε = {first:.4g} > privacy.target_epsilon = {first / 2:g} "
        f"(δ = {default_delta(POPULATION):g}); the run stops after round 0; raise the target, the noise multiplier or lower train.rounds; "
        "it stopped before its first round, so nothing was kept"
    ]
    assert not (tmp_path / "runs").exists()


def test_the_summary_and_summary_json_carry_epsilon_and_delta(private_run):
    result, run_dir = private_run
    delta = default_delta(POPULATION)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["dp_delta"] == delta and summary["final_metrics"]["dp_epsilon"] == expected_epsilons(ROUNDS)[-1]
    assert f"privacy            ε = {expected_epsilons(ROUNDS)[-1]:.4g}, δ = {delta:.3g}\n" in result.stdout
