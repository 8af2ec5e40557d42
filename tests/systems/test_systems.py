"""The systems model (``systems``): per-client draws, availability, the simulated clock, selection
under over-selection, deadlines and dropouts, client state of dropped clients, resume, the off switch
and bad inputs. Ray-free: real engines and workers in this process (fedray.testing.Federation, the
local backend) and the real CLI for bad inputs (each a fork of a preloaded process, tests/preloaded_cli.py)."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import fedray
from e2e_helpers import CrashAfterRound, comparable_rows, final_weights, round_rows
from fedray.config.schema import SelectionConfig
from fedray.models import forward_flops
from fedray.runtime.state_store import NO_STATE
from fedray.seeding import sample_cohort
from fedray.systems import ROW_KEYS
from fedray.systems.availability import BernoulliAvailability, DiurnalAvailability, TraceAvailability, read_trace
from fedray.systems.clock import client_durations, payload_bytes
from fedray.systems.devices import Devices, build_devices
from fedray.systems.draws import uniform
from fedray.systems.selection import plan_round
from fedray.testing import Federation
from preloaded_cli import run_fedray_preloaded
from test_bad_inputs import assert_rejected

REPO = Path(__file__).resolve().parents[2]
ON = "systems.enabled=true"


def write_devices(path: Path, flops: list[float], down: list[float], up: list[float]) -> str:
    rows = "".join(f"{i},{f},{d},{u}\n" for i, (f, d, u) in enumerate(zip(flops, down, up)))
    path.write_text("client_id,flops_per_second,download_mbps,upload_mbps\n" + rows)
    return str(path)


# --------------------------------------------------------------------- draws and availability


def test_draws_depend_only_on_seed_round_and_client_id():
    ids = np.arange(10_000)
    whole = uniform(7, 102, 3, ids)
    assert np.array_equal(whole, uniform(7, 102, 3, ids))
    assert np.array_equal(whole[[5, 9_999, 17]], uniform(7, 102, 3, np.array([5, 9_999, 17])))  # not on who else is drawn
    assert not np.array_equal(whole, uniform(7, 102, 4, ids)) and not np.array_equal(whole, uniform(8, 102, 3, ids))
    assert whole.min() >= 0 and whole.max() < 1 and abs(whole.mean() - 0.5) < 0.01


def test_bernoulli_availability_is_deterministic_and_has_its_rate():
    availability = BernoulliAvailability(200_000, seed=3, probability=0.3)
    online = availability.online(round=5, time=0.0)
    assert np.array_equal(online, BernoulliAvailability(200_000, seed=3, probability=0.3).online(5, 123.0))
    assert abs(online.mean() - 0.3) < 0.005
    assert abs((online & availability.online(6, 0.0)).mean() - 0.09) < 0.005  # rounds independent


def test_diurnal_availability_follows_the_day_and_has_its_mean():
    availability = DiurnalAvailability(100_000, seed=0, probability=0.4, amplitude=0.5, day_seconds=100.0)
    rates = [availability.online(round, time).mean() for round, time in enumerate(np.arange(0, 100, 5.0), start=1)]
    assert abs(np.mean(rates) - 0.4) < 0.01
    # time zones spread uniformly: the population rate stays near the mean all day, each client's swings
    client_rates = availability.probabilities(np.array([0.0, 25.0, 50.0, 75.0])[:, None])
    assert np.allclose(client_rates.mean(axis=1), 0.4, atol=0.01)
    assert client_rates[:, 0].max() - client_rates[:, 0].min() > 0.25  # 0.2 .. 0.6 over a whole day


def test_trace_availability_online_and_offline_times(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text("client_id,start,end\n0,0,10\n0,20,30\n2,5,25\n")
    trace = TraceAvailability(3, read_trace(str(path), 3, period=40.0))
    assert trace.online(1, 6.0).tolist() == [True, False, True]
    assert trace.online(1, 15.0).tolist() == [False, False, True]
    assert trace.online(1, 46.0).tolist() == [True, False, True]  # wraps every 40 s
    assert trace.offline_at(np.array([0, 2]), 46.0).tolist() == [50.0, 65.0]


# --------------------------------------------------------------------- the clock


def test_client_duration_is_download_plus_compute_plus_upload():
    devices = Devices(np.array([1e9, 4e9]), np.array([1e6, 2e6]), np.array([5e5, 1e6]))
    durations = client_durations(devices, np.array([1, 0]), np.array([8e9, 2e9]), download_bytes=1e6, upload_bytes=1e6)
    assert durations.tolist() == [0.5 + 2.0 + 1.0, 1.0 + 2.0 + 2.0]


def test_devices_from_a_file_are_in_bytes_per_second(tmp_path):
    config = fedray.load_config(
        None,
        [
            ON,
            "systems.devices.source=file",
            f"systems.devices.file={write_devices(tmp_path / 'd.csv', [1e9, 2e9], [8, 16], [1, 2])}",
            "data.num_clients=2",
            "train.clients_per_round=1",
        ],
    )
    devices = build_devices(config.systems.devices, 0, 2)
    assert devices.flops_per_second.tolist() == [1e9, 2e9]
    assert devices.download_bytes_per_second.tolist() == [1e6, 2e6] and devices.upload_bytes_per_second.tolist() == [125_000, 250_000]


def test_the_rows_clock_and_bytes_match_the_hand_computed_round(tmp_path):
    """sim_time = max over the cohort of B_down / bw + n_c · E · F · 3 / speed + B_up / bw, with
    round 1's upload timed at the broadcast's size B; bytes counted from the float32 tensors sent."""
    devices = write_devices(tmp_path / "d.csv", [1e9] * 6, [8.0] * 6, [8.0] * 6)  # 1e6 bytes/s both ways
    run = Federation(tmp_path / "run", [ON, "systems.devices.source=file", f"systems.devices.file={devices}", "train.clients_per_round=2"])
    weights = run.state["weights"].numel()
    forward = forward_flops(run.initial_model, run.data.info)
    row = run.run_round(1, [1, 4])
    broadcast = weights * 4
    expected = max(2 * broadcast / 1e6 + run.data.clients.sizes[c] * 1 * forward * 3 / 1e9 for c in (1, 4))
    assert math.isclose(row["sim_time"], expected, rel_tol=1e-12)
    assert row["bytes_down"] == 2 * broadcast and row["bytes_up"] == 2 * (broadcast + 4)  # weights and n_k
    assert (row["selected"], row["aggregated"], row["dropped"], row["late"]) == (2, 2, 0, 0)
    second = run.run_round(2, [1, 4])  # now timed at the measured upload, 4 bytes more
    expected = max(broadcast / 1e6 + (broadcast + 4) / 1e6 + run.data.clients.sizes[c] * forward * 3 / 1e9 for c in (1, 4))
    assert math.isclose(second["sim_time"] - row["sim_time"], expected, rel_tol=1e-9)


# --------------------------------------------------------------------- selection


def test_over_selection_aggregates_exactly_the_k_fastest(tmp_path):
    speeds = [1e8, 5e9, 2e8, 4e9, 3e8, 3e9]  # clients 1, 3, 5 are fast
    devices = write_devices(tmp_path / "d.csv", speeds, [100.0] * 6, [100.0] * 6)
    run = Federation(
        tmp_path / "run", [ON, "systems.devices.source=file", f"systems.devices.file={devices}", "systems.selection.over_selection=2"]
    )
    durations = run.engine.systems.durations(np.arange(6), payload_bytes(run.algorithm.broadcast(run.state, 1)))  # as round 1 times them
    row = run.run_round(1)
    assert (row["selected"], row["aggregated"], row["late"], row["dropped"]) == (6, 3, 3, 0)
    assert sorted(run.results[-1].client_metrics) == sorted(np.argsort(durations)[:3].tolist()) == [1, 3, 5]
    assert math.isclose(row["sim_time"], float(np.sort(durations)[2]), rel_tol=1e-12)  # closed at the K-th report


def test_the_deadline_makes_slow_clients_late_and_closes_the_round():
    config = SelectionConfig(deadline_seconds=2.0)
    plan = plan_round(config, 0, 1, 10.0, np.array([3, 4, 7]), np.array([1.0, 3.0, 1.5]), np.full(3, np.inf), target=3)
    assert plan.reporting.tolist() == [3, 7] and (plan.late, plan.dropped) == (1, 0)
    assert plan.end_time == 12.0


def test_a_client_that_goes_offline_before_it_finishes_drops():
    plan = plan_round(SelectionConfig(), 0, 1, 0.0, np.array([0, 1]), np.array([5.0, 5.0]), np.array([4.0, np.inf]), target=2)
    assert plan.reporting.tolist() == [1] and plan.dropped == 1
    assert plan.duration == 5.0


def test_dropped_clients_train_nothing_and_store_no_client_state(tmp_path):
    """SCAFFOLD with half the clients dropping: only the aggregated clients' control variates are stored."""
    run = Federation(
        tmp_path, ["algorithm.name=scaffold", ON, "systems.selection.dropout=0.5", "data.num_clients=10", "train.clients_per_round=6"]
    )
    stored_before = {}
    for round in (1, 2, 3):
        row = run.run_round(round)
        trained = sorted(run.results[-1].client_metrics)
        assert row["aggregated"] == len(trained) == row["selected"] - row["dropped"] - row["late"]
        assert row["dropped"] > 0
        for client in range(10):
            if client in trained:
                assert run.versions[client] == round
            else:
                assert run.versions[client] == stored_before.get(client, NO_STATE)
        stored_before = {client: int(run.versions[client]) for client in range(10) if run.versions[client] != NO_STATE}


def test_a_round_with_nobody_online_is_counted_and_warned(tmp_path, caplog):
    run = Federation(
        tmp_path,
        [ON, "systems.availability.process=bernoulli", "systems.availability.probability=0.02", "systems.selection.empty_round_seconds=30"],
    )
    weights = run.state["weights"].clone()
    with caplog.at_level(logging.WARNING, logger="fedray.systems"):
        row = run.run_round(1)
    assert (row["selected"], row["aggregated"], row["clients"]) == (0, 0, 0)
    assert row["sim_time"] == 30.0 and torch.equal(run.state["weights"], weights)
    assert "round 1 aggregated no client update (no client was online)" in caplog.text


# --------------------------------------------------------------------- off, on without effect, resume


def test_off_adds_nothing_and_on_without_effects_trains_the_same_cohorts(tmp_path):
    off = Federation(tmp_path / "off", ["algorithm.name=scaffold"]).run(3)
    on = Federation(tmp_path / "on", ["algorithm.name=scaffold", ON]).run(3)
    assert not set(ROW_KEYS) & set().union(*off.rows)
    assert "systems" not in off.config.to_dict() and "systems" not in off.engine.checkpoint_state()
    for round, (off_row, on_row) in enumerate(zip(off.rows, on.rows), start=1):
        assert sorted(on.results[round - 1].client_metrics) == sample_cohort(0, round, 6, 3).tolist()
        assert {k: v for k, v in on_row.items() if k not in ROW_KEYS} == off_row
    assert torch.equal(off.state["weights"], on.state["weights"])
    assert on.rows[-1]["sim_time"] > on.rows[0]["sim_time"] > 0


def run_local(tmp_path: Path, name: str, overrides: list[str], callbacks=()) -> Path:
    config = fedray.load_config(
        REPO / "examples" / "scaffold_digits.yaml",
        [
            f"output.dir={tmp_path}",
            f"output.name={name}",
            "resources.num_workers=1",
            "data.num_clients=8",
            "train.clients_per_round=3",
            "train.local_epochs=1",
            "train.rounds=4",
            "checkpoint.every=2",
            "output.tensorboard=false",
            "output.plots=false",
            *overrides,
        ],
    )
    return Path(fedray.run_experiment(config, progress=False, extra_callbacks=list(callbacks)).run_dir)


def test_a_resumed_run_with_the_systems_model_is_bit_identical(tmp_path):
    systems = [
        ON,
        "systems.availability.process=diurnal",
        "systems.availability.day_seconds=2",
        "systems.selection.over_selection=1.5",
        "systems.selection.dropout=0.3",
    ]
    whole = run_local(tmp_path, "whole", systems)
    with pytest.raises(RuntimeError, match="simulated driver crash"):
        run_local(tmp_path, "cut", systems, [CrashAfterRound(3)])
    fedray.resume_experiment(tmp_path / "cut", progress=False)
    rows = comparable_rows(round_rows(whole))
    assert comparable_rows(round_rows(tmp_path / "cut")) == rows
    assert torch.equal(final_weights(tmp_path / "cut"), final_weights(whole))
    assert all(key in rows[-1] for key in ROW_KEYS) and rows[-1]["sim_time"] > rows[0]["sim_time"]


# --------------------------------------------------------------------- bad inputs


def _trace(text: str):
    return lambda directory: (directory / "trace.csv").write_text("client_id,start,end\n" + text)


TRACE = ["--set", "systems.availability.process=trace", "--set", "systems.availability.trace_file=trace.csv"]
BAD_INPUTS = [
    ("unknown_client", TRACE, _trace("0,0,10\n99,0,10\n"), "unknown client id 99"),
    ("negative_interval", TRACE, _trace("0,-5,10\n"), "is negative or empty"),
    ("overlapping_intervals", TRACE, _trace("1,0,10\n1,5,20\n"), "client 1 has overlapping intervals [0, 10) and [5, 20)"),
    ("nobody_ever_online", TRACE, _trace(""), "no client is ever online"),
    ("impossible_deadline", ["--set", "systems.selection.deadline_seconds=0.001"], lambda directory: None, "but the fastest client needs"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("case", "args", "prepare", "expected"), BAD_INPUTS, ids=[case[0] for case in BAD_INPUTS])
def test_bad_systems_input_is_one_line_and_exit_2(tmp_path, case, args, prepare, expected):
    prepare(tmp_path)
    assert_rejected(run_fedray_preloaded(["run", "--set", ON, "--set", "resources.num_workers=1", *args], tmp_path), expected)
    assert not (tmp_path / "runs").exists()
