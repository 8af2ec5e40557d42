"""The end-of-run summary of ``fedray run`` (fedray/cli/run.py) and ``summary.json``, on real local
runs: a run with the systems model prints its simulated time, the clients aggregated / selected /
dropped / late over all its rounds and the bytes down and up, summed from its metrics (a private
run's ε and δ: tests/privacy/test_privacy_reporting.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from test_bad_inputs import run_fedray

from fedray.cli.run import format_bytes, format_seconds
from fedray.tracking import read_metrics

SYSTEMS_RUN = [
    "resources.backend=local",
    "resources.num_workers=1",
    "data.num_clients=8",
    "train.clients_per_round=4",
    "train.rounds=3",
    "train.local_epochs=1",
    "systems.enabled=true",
    "systems.selection.dropout=0.3",
    "output.tensorboard=false",
    "output.plots=false",
    "output.name=run",
]
COUNTS = ("selected", "aggregated", "dropped", "late", "bytes_down", "bytes_up")


def fedray_run(directory: Path, overrides: list[str]):
    args = ["run", "--quiet"]
    for override in [*overrides, f"output.dir={directory / 'runs'}"]:
        args += ["--set", override]
    return run_fedray(args, directory), directory / "runs" / "run"


@pytest.mark.slow
def test_a_systems_run_sums_up_its_clients_bytes_and_simulated_time(tmp_path):
    result, run_dir = fedray_run(tmp_path, SYSTEMS_RUN)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_metrics(run_dir)
    totals = {key: sum(row[key] for row in rows) for key in COUNTS}
    assert totals["aggregated"] > 0 and totals["dropped"] > 0  # seeded: 30 % of 12 selections drop out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["systems_totals"] == totals and summary["dp_delta"] is None
    assert f"simulated time     {format_seconds(rows[-1]['sim_time'])}\n" in result.stdout
    assert (
        f"clients            {totals['aggregated']} aggregated of {totals['selected']} selected over 3 rounds "
        f"({totals['dropped']} dropped, {totals['late']} late)\n" in result.stdout
    )
    assert f"bytes              {format_bytes(totals['bytes_down'])} down, {format_bytes(totals['bytes_up'])} up\n" in result.stdout


@pytest.mark.slow
def test_a_run_without_the_systems_model_prints_none_of_its_lines(tmp_path):
    result, run_dir = fedray_run(tmp_path, [key for key in SYSTEMS_RUN if not key.startswith("systems.")])
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["systems_totals"] == {}
    assert not any(line.startswith(("simulated time", "clients ", "bytes ", "privacy ")) for line in result.stdout.splitlines())


def test_simulated_time_and_bytes_read_at_a_glance():
    assert [format_seconds(s) for s in (42.4, 3600.0, 93_784.0)] == ["42 s", "3,600 s (1 h)", "93,784 s (1 d 2 h 3 min)"]
    assert [format_bytes(n) for n in (512, 1_500, 2_340_000, 7_000_000_000)] == ["512 B", "1.5 kB", "2.3 MB", "7.0 GB"]


@pytest.mark.slow
def test_a_run_in_which_no_client_is_ever_online_ends_with_a_warning_and_says_so(tmp_path):
    """Documented (docs/guide/systems.md): the run ends (exit 0), but not as an ordinary one."""
    nobody_online = [*SYSTEMS_RUN, "systems.availability.process=bernoulli", "systems.availability.probability=1e-12"]
    result, run_dir = fedray_run(tmp_path, nobody_online)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["systems_totals"]["aggregated"] == 0
    assert [line for line in result.stderr.splitlines() if line.startswith("warning: no client")] == [
        "warning: no client update was aggregated in any of the 3 rounds (nobody was online, or every selected client dropped out "
        "or was late): the model is the initial one; see systems.availability and systems.selection"
    ]
    assert "clients            0 aggregated of 0 selected over 3 rounds (0 dropped, 0 late)\n" in result.stdout
    assert (
        "                   no client update was ever aggregated: the model is the initial one (see the warning above)\n" in result.stdout
    )


@pytest.mark.slow
def test_an_audited_run_prints_its_lower_bound_beside_the_accountants_epsilon(tmp_path):
    overrides = [key for key in SYSTEMS_RUN if not key.startswith("systems.")]
    audit = ["privacy.mechanism=central", "privacy.noise_multiplier=1.0", "privacy.audit.canaries=200"]
    result, run_dir = fedray_run(tmp_path, [*overrides, *audit])
    assert result.returncode == 0, result.stderr[-3000:]
    last = read_metrics(run_dir)[-1]
    line = next(line for line in result.stdout.splitlines() if "privacy audit:" in line)
    assert f"ε ≥ {last['audit_epsilon_lower_bound']:.3g} with 95% confidence" in line
    assert f"the accountant's ε = {last['dp_epsilon']:.4g}" in line
