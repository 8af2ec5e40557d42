"""Buffered asynchronous aggregation (``train.mode: async``, FedBuff): the staleness weights, the
buffered update, exact agreement with synchronous rounds when nothing is stale, the schedule's
invariants, rounds that cannot fill their buffer, reproducibility over worker counts and a resume,
the sync default and bad inputs. Ray-free: real engines and workers in this process
(fedray.testing.Federation, the local backend) and the real CLI for bad inputs (each a fork of a preloaded
process, tests/preloaded_cli.py)."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import fedray
from e2e_helpers import CrashAfterRound, comparable_rows, final_weights, round_rows
from fedray.algorithms import RoundResults
from fedray.algorithms.base import weighted_sums
from fedray.runtime import list_checkpoints, load_checkpoint
from fedray.systems.fedbuff import buffered_results, staleness_weights
from fedray.testing import Federation
from fedray.tracking import read_metrics
from preloaded_cli import run_fedray_preloaded
from test_bad_inputs import assert_rejected

REPO = Path(__file__).resolve().parents[2]
ON = "systems.enabled=true"
ASYNC = [ON, "train.mode=async"]
# every client takes the same time: compute is negligible next to identical bandwidths
EQUAL_DEVICES = [
    "systems.devices.flops_per_second={median: 1.0e30, sigma: 0}",
    "systems.devices.download_mbps={median: 20, sigma: 0}",
    "systems.devices.upload_mbps={median: 5, sigma: 0}",
]
# ten clients of varied devices, four training at once, a buffer of two: updates arrive stale
STALE = [*ASYNC, "data.num_clients=10", "systems.fedbuff.concurrency=4", "systems.fedbuff.buffer_size=2"]


def rows_without_wall_time(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "seconds"} for row in rows]


def run_async(federation: Federation, rounds: int) -> list[dict]:
    """``rounds`` asynchronous rounds; each round's row and client rows (less wall time)."""
    results = [federation.engine.run_round(round) for round in range(1, rounds + 1)]
    return [{"round": rows_without_wall_time([r["round"]])[0], "clients": r["clients"]} for r in results]


# --------------------------------------------------------------------- the maths


def test_staleness_weights_are_fedbuffs_polynomial():
    staleness = np.array([0, 1, 3, 8])
    assert np.allclose(staleness_weights(staleness, 0.5), 1 / np.sqrt(1 + staleness), rtol=0, atol=1e-15)
    assert staleness_weights(staleness, 0.5)[0] == 1.0  # a fresh update counts fully, exactly
    assert np.array_equal(staleness_weights(staleness, 0.0), np.ones(4))
    assert np.allclose(staleness_weights(staleness, 1.0), [1, 1 / 2, 1 / 4, 1 / 9])


def _results(models: list[torch.Tensor], sizes: list[int]) -> RoundResults:
    sums = [weighted_sums(model, size) for model, size in zip(models, sizes)]
    total = {key: sum(s[key] for s in sums) for key in sums[0]}
    return RoundResults(sums=total, payloads={}, client_metrics={}, num_clients=len(models), excluded_clients=[])


def test_the_buffered_update_weights_each_update_by_its_staleness():
    """w + Σ s(τ_k) n_k (w_k − w_{v_k}) / Σ n_k: fresh updates against w, stale ones against the
    weights they started from, discounted."""
    g = torch.Generator().manual_seed(0)
    current, old = torch.randn(50, generator=g), torch.randn(50, generator=g)
    fresh = [current + 0.1 * torch.randn(50, generator=g) for _ in range(2)]
    stale = [old + 0.1 * torch.randn(50, generator=g) for _ in range(3)]
    fresh_sizes, stale_sizes = [2, 3], [4, 1, 5]
    combined = buffered_results([(_results(fresh, fresh_sizes), 1.0, current), (_results(stale, stale_sizes), 0.5, old)], current)
    delta = sum(n * (w.double() - current.double()) for w, n in zip(fresh, fresh_sizes))
    delta = delta + 0.5 * sum(n * (w.double() - old.double()) for w, n in zip(stale, stale_sizes))
    expected = current.double() + delta / sum(fresh_sizes + stale_sizes)
    mean = combined.sums["weights"] / combined.sums["num_samples"]
    assert torch.allclose(mean, expected, rtol=0, atol=1e-12)
    assert combined.num_clients == 5 and float(combined.sums["num_samples"]) == 15.0
    # fresh updates alone: exactly the sums of a synchronous round of the same clients
    alone = _results(fresh, fresh_sizes)
    only_fresh = buffered_results([(alone, 1.0, current)], current)
    assert torch.equal(only_fresh.sums["weights"], alone.sums["weights"])
    assert torch.equal(only_fresh.sums["num_samples"], alone.sums["num_samples"])


# --------------------------------------------------------------------- against synchronous rounds


@pytest.mark.parametrize("workers", [1, 2])
def test_fresh_buffers_are_exactly_synchronous_rounds(tmp_path, workers):
    """Concurrency = buffer = cohort and every client equally fast: each buffer is a whole cohort,
    trained from the current model (staleness 0), so each round is the synchronous round of the same
    clients, bit for bit: model, metrics, clock and bytes. MOON: its client state too."""
    common = [ON, *EQUAL_DEVICES, "algorithm.name=moon", "model.projection_dim=16", f"resources.num_workers={workers}"]
    buffered = Federation(tmp_path / "async", [*common, "train.mode=async", "systems.fedbuff.buffer_size=3"])
    synchronous = Federation(tmp_path / "sync", common)
    for round in range(1, 4):
        result = buffered.engine.run_round(round)
        cohort = [client["client_id"] for client in result["clients"]]
        assert len(cohort) == 3 and all(client["staleness"] == 0 for client in result["clients"])
        row = rows_without_wall_time([result["round"]])[0]
        assert row.pop("staleness_mean") == 0 and row.pop("staleness_max") == 0
        assert row == synchronous.run_round(round, cohort)
    assert torch.equal(buffered.state["weights"], synchronous.state["weights"])
    assert np.array_equal(buffered.versions, synchronous.versions)


# --------------------------------------------------------------------- the schedule


def test_stale_rounds_keep_the_buffer_and_concurrency_and_discount_stale_updates(tmp_path):
    federation = Federation(tmp_path / "a", STALE)
    rounds = run_async(federation, 6)
    concurrency = 4
    for result in rounds:
        row, clients = result["round"], result["clients"]
        staleness = [client["staleness"] for client in clients]
        assert row["aggregated"] == row["clients"] == len(clients) == 2
        assert len({client["client_id"] for client in clients}) == 2  # a client contributes once per buffer
        assert math.isclose(row["staleness_mean"], np.mean(staleness)) and row["staleness_max"] == max(staleness)
        assert all(0 <= s < row["round"] for s in staleness)
    assert len(federation.engine.buffered.schedule.clients) <= concurrency
    assert rounds[0]["round"]["selected"] >= concurrency  # C start at once, more as slots free up
    times = [result["round"]["sim_time"] for result in rounds]
    assert all(later > earlier for earlier, later in zip(times, times[1:]))
    assert max(result["round"]["staleness_max"] for result in rounds) >= 1
    # the discount acts exactly where updates are stale: without it, the same schedule, other models
    undiscounted = run_async(Federation(tmp_path / "b", [*STALE, "systems.fedbuff.staleness_exponent=0"]), 6)
    first_stale = next(i for i, result in enumerate(rounds) if result["round"]["staleness_max"] > 0)
    for index, (discounted, plain) in enumerate(zip(rounds, undiscounted)):
        assert discounted["round"]["sim_time"] == plain["round"]["sim_time"]
        same_model = discounted["round"]["test_loss"] == plain["round"]["test_loss"]
        assert same_model == (index < first_stale)


def test_a_round_that_cannot_fill_its_buffer_closes_and_is_counted(tmp_path, caplog):
    """Only client 0 is ever online, for 1.5 of its round durations d: round 1 aggregates its single
    update (a warning), round 2 ends when it goes offline before finishing (dropped, nothing
    aggregated), round 3 has nobody online: each counted, none hangs, the clock moves on."""
    probe = Federation(tmp_path / "probe", [*ASYNC, "systems.fedbuff.buffer_size=2"])
    duration = float(probe.engine.systems.durations(np.array([0]), probe.state["weights"].numel() * 4)[0])
    (tmp_path / "trace.csv").write_text(f"client_id,start,end\n0,0,{1.5 * duration!r}\n")
    trace = ["systems.availability.process=trace", f"systems.availability.trace_file={tmp_path / 'trace.csv'}"]
    federation = Federation(tmp_path / "run", [*ASYNC, *trace, "systems.fedbuff.buffer_size=2"])
    with caplog.at_level(logging.WARNING):
        rows = [result["round"] for result in run_async(federation, 3)]
    assert [(row["selected"], row["aggregated"], row["dropped"]) for row in rows] == [(1, 1, 0), (1, 0, 1), (0, 0, 0)]
    assert rows[0]["sim_time"] == duration and math.isclose(rows[1]["sim_time"], 1.5 * duration)
    assert "round 1 aggregates 1 of systems.fedbuff.buffer_size=2 updates" in caplog.text
    assert "round 2 aggregated no client update (1 dropped, 0 late)" in caplog.text
    assert "round 3 aggregated no client update (no client was online)" in caplog.text
    assert rows[2]["sim_time"] - rows[1]["sim_time"] == federation.config.systems.selection.empty_round_seconds
    assert math.isnan(rows[2]["staleness_mean"]) and rows[0]["test_loss"] == rows[1]["test_loss"] == rows[2]["test_loss"]


def test_compressed_stale_updates_are_what_the_server_receives(tmp_path):
    """Top-k with error feedback under async: each update is compressed against the model its client
    started from, and bytes_up counts the encoded uploads."""
    compression = ["systems.compression.method=topk", "systems.compression.topk_fraction=0.1", "systems.compression.error_feedback=true"]
    federation = Federation(tmp_path, [*STALE, *compression])
    rounds = run_async(federation, 4)
    weights = federation.state["weights"].numel()
    for result in rounds:
        uploads = [client["upload_bytes"] for client in result["clients"]]
        assert all(upload < weights for upload in uploads) and result["round"]["bytes_up"] == sum(uploads)
    assert max(result["round"]["staleness_max"] for result in rounds) >= 1
    assert rounds[-1]["round"]["test_accuracy"] > rounds[0]["round"]["test_accuracy"]


# --------------------------------------------------------------------- reproducibility


def test_the_same_schedule_and_models_on_one_or_two_workers(tmp_path):
    """Which worker trains a client changes nothing but the order in which the test-set loss is
    summed (evaluation is sharded by worker, as in synchronous rounds)."""
    systems = [*STALE, "systems.selection.dropout=0.2", "systems.availability.process=bernoulli", "systems.availability.probability=0.8"]
    one, two = (Federation(tmp_path / str(n), [*systems, f"resources.num_workers={n}"]) for n in (1, 2))
    one_rounds, two_rounds = run_async(one, 5), run_async(two, 5)
    for rounds in (one_rounds, two_rounds):
        for result in rounds:
            del result["round"]["test_loss"]
    assert two_rounds == one_rounds
    assert torch.equal(one.state["weights"], two.state["weights"])
    assert sum(result["round"]["dropped"] for result in one_rounds) > 0


def run_local(tmp_path: Path, name: str, overrides: list[str] = (), callbacks=()) -> Path:
    config = fedray.load_config(
        REPO / "examples" / "fedavg_dropout_digits.yaml",
        [
            f"output.dir={tmp_path}",
            f"output.name={name}",
            "data.num_clients=12",
            "train.local_epochs=1",
            "train.rounds=5",
            "train.mode=async",
            "systems.selection.over_selection=1",
            "systems.selection.deadline_seconds=null",
            "systems.selection.dropout=0.2",
            "systems.fedbuff.concurrency=6",
            "systems.fedbuff.buffer_size=2",
            "checkpoint.every=2",
            "output.tensorboard=false",
            "output.plots=false",
            *overrides,
        ],
    )
    return Path(fedray.run_experiment(config, progress=False, extra_callbacks=list(callbacks)).run_dir)


@pytest.mark.slow
def test_local_and_ray_runs_of_two_workers_are_bit_identical(ray_session, tmp_path):
    """The groups of clients from different model versions reach Ray's workers in one call, each
    broadcast resolved from the object store."""
    local, on_ray = (
        run_local(tmp_path, backend, [f"resources.backend={backend}", "resources.num_workers=2"]) for backend in ("local", "ray")
    )
    assert comparable_rows(round_rows(local)) == comparable_rows(round_rows(on_ray))
    assert read_metrics(local, "client") == read_metrics(on_ray, "client")
    assert torch.equal(final_weights(local), final_weights(on_ray))


def test_a_resumed_async_run_is_bit_identical(tmp_path):
    whole = run_local(tmp_path, "whole")
    with pytest.raises(RuntimeError, match="simulated driver crash"):
        run_local(tmp_path, "cut", callbacks=[CrashAfterRound(3)])
    checkpoint = load_checkpoint(list_checkpoints(tmp_path / "cut")[-1][1])
    assert len(checkpoint["fedbuff"]["schedule"]["clients"]) > 0  # clients in training travel with it
    assert checkpoint["fedbuff"]["broadcasts"]  # and the models they started from
    fedray.resume_experiment(tmp_path / "cut", progress=False)
    rows = comparable_rows(round_rows(whole))
    assert comparable_rows(round_rows(tmp_path / "cut")) == rows
    assert torch.equal(final_weights(tmp_path / "cut"), final_weights(whole))
    assert max(row["staleness_max"] for row in rows) >= 1


# --------------------------------------------------------------------- the default, bad inputs


def test_sync_is_the_default_and_adds_nothing(tmp_path):
    federation = Federation(tmp_path, [ON])
    assert federation.config.train.mode == "sync" and federation.engine.buffered is None
    saved = federation.config.to_dict()
    assert "mode" not in saved["train"] and "fedbuff" not in saved["systems"]
    row = federation.run_round(1)
    assert "staleness_mean" not in row and "fedbuff" not in federation.engine.checkpoint_state()


BAD_INPUTS = [
    ("scaffold", ["algorithm.name=scaffold"], "scaffold uploads control variates, so its aggregation is not one"),
    ("undeclared", ["algorithm.name=feddyn"], "feddyn does not declare what it uploads"),
    ("buffer_above_concurrency", ["systems.fedbuff.buffer_size=11"], "systems.fedbuff.buffer_size (11) must be <= the concurrency (10"),
    ("concurrency_above_clients", ["systems.fedbuff.concurrency=21"], "systems.fedbuff.concurrency (21) must be <= data.num_clients (20)"),
    ("deadline", ["systems.selection.deadline_seconds=10"], "close synchronous rounds"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("case", "overrides", "expected"), BAD_INPUTS, ids=[case[0] for case in BAD_INPUTS])
def test_bad_async_input_is_one_line_and_exit_2(tmp_path, case, overrides, expected):
    args = [arg for override in [*ASYNC, "resources.num_workers=1", *overrides] for arg in ("--set", override)]
    assert_rejected(run_fedray_preloaded(["run", *args], tmp_path), expected)
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["train.mode=async"], "train.mode=async trains clients on the simulated clock; set systems.enabled=true"),
        ([ON, "systems.fedbuff.buffer_size=2"], "systems.fedbuff keys are set but train.mode is sync"),
    ],
    ids=["without_systems", "keys_in_sync_mode"],
)
def test_async_keys_out_of_place_are_refused(tmp_path, overrides, expected):
    args = [arg for override in ["resources.num_workers=1", *overrides] for arg in ("--set", override)]
    assert_rejected(run_fedray_preloaded(["run", *args], tmp_path), expected)
