"""Hetero-SSFL and FedAvg+BYOL end to end: per-client evaluation, models that stay on the clients, and
identical results after a driver crash + resume (on the local backend, two workers in this process)
and after a worker crash on the session's real local Ray. The killed-worker run on Ray is compared
bit for bit with the uninterrupted local-backend run, so it also proves that Ray's workers and the
local pool give the same Hetero-SSFL federation (per-client architectures, a public set)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedray import load_config
from fedray.plugins import build_config
from fedray.runtime import list_checkpoints, load_checkpoint, resume_experiment, run_experiment
from fedray.runtime.state_store import decode_state
from fedray.tracking import read_metrics

from e2e_helpers import CrashAfterRound, comparable_rows
from fault_injection import crash_overrides

pytestmark = pytest.mark.slow

HETERO = [
    "algorithm.name=hetero_ssfl",
    "algorithm.architectures=[{name: cnn_small, width: 8}, {name: cnn_small, width: 16}]",
    "algorithm.projection_dim=16",
    "algorithm.hidden_dim=32",
    "algorithm.rad_size=64",
    "algorithm.rad_batch_size=32",
    "algorithm.probe_epochs=20",
    "data.num_clients=6",
    "train.clients_per_round=4",
    "train.rounds=4",
    "train.batch_size=32",
    "train.momentum=0.9",
    "eval.every=2",
    "checkpoint.every=2",
    "output.tensorboard=false",
    "output.plots=false",
    "output.name=run",
    "resources.num_workers=2",
    "resources.backend=local",
]


def final_server_state(run_dir) -> dict:
    return load_checkpoint(list_checkpoints(run_dir)[-1][1])["server_state"]


def client_states(run_dir) -> dict[str, dict[str, torch.Tensor]]:
    """The newest stored state of every client (its own model and BYOL target)."""
    states = {}
    for folder in sorted((Path(run_dir) / "client_state").iterdir()):
        newest = sorted(folder.glob("r*.pt"))[-1]
        states[folder.name] = decode_state(newest.read_bytes(), str(newest))
    return states


def assert_same_federation(run_dir, reference_dir) -> None:
    assert comparable_rows(read_metrics(run_dir)) == comparable_rows(read_metrics(reference_dir))
    assert comparable_rows(read_metrics(run_dir, "client")) == comparable_rows(read_metrics(reference_dir, "client"))
    ours, theirs = final_server_state(run_dir), final_server_state(reference_dir)
    assert torch.equal(ours["consensus"], theirs["consensus"])
    assert ours["representations"].keys() == theirs["representations"].keys()
    assert all(torch.equal(ours["representations"][c], theirs["representations"][c]) for c in ours["representations"])
    mine, reference = client_states(run_dir), client_states(reference_dir)
    assert mine.keys() == reference.keys()
    for client, state in mine.items():
        assert all(torch.equal(state[k], reference[client][k]) for k in ("online", "target")), client


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    """An uninterrupted run of two workers on the local backend."""
    out = tmp_path_factory.mktemp("hetero")
    config = load_config(None, HETERO + [f"output.dir={out}"])
    summary = run_experiment(config, progress=False)
    return config, summary, out / "run"


def test_every_client_is_probed_and_no_model_reaches_the_server(baseline):
    _, summary, run_dir = baseline
    rows = read_metrics(run_dir)
    evaluated = [r for r in rows if r.get("probe_accuracy") is not None]
    assert [r["round"] for r in evaluated] == [2, 4]
    for row in evaluated:
        per_architecture = [row["probe_accuracy_cnn_small_w8"], row["probe_accuracy_cnn_small_w16"]]
        assert row["probe_accuracy"] == pytest.approx(sum(per_architecture) / 2)  # 3 clients of each
        assert row["test_accuracy"] == row["probe_accuracy"] > 0.3
    assert summary.final_test_accuracy == evaluated[-1]["probe_accuracy"]
    assert rows[0].get("mean_cka") is None and all(0 < r["mean_cka"] <= 1 for r in rows[1:])  # aligned from round 2
    state = final_server_state(run_dir)
    assert set(state) == {"representations", "num_samples", "consensus"}
    assert {tuple(a.shape) for a in state["representations"].values()} == {(64, 16)}
    assert state["consensus"].shape == (64, 64)
    # a client's newest stored model is from the last round it was selected in.
    last_round = {}
    for row in read_metrics(run_dir, "client"):
        last_round[row["client_id"]] = max(last_round.get(row["client_id"], 0), row["round"])
    for folder in (run_dir / "client_state").iterdir():
        assert sorted(folder.glob("r*.pt"))[-1].name == f"r{last_round[int(folder.name)]:06d}.pt"


@pytest.mark.ray
def test_killed_worker_on_ray_gives_the_same_federation(ray_session, baseline, tmp_path):
    """The suite's real-Ray worker-kill test: a Ray worker SIGKILLed in the middle of round 2 (after
    its first client's update and client state are written) is replaced, its clients re-run with their
    stored models, and the federation is bit-identical to the uninterrupted local-backend run."""
    config, _, run_dir = baseline
    faulty = build_config(
        config.to_dict(),
        [f"output.dir={tmp_path}", "resources.backend=ray", *crash_overrides("HeteroSSFL", 2, tmp_path / "crashed")],
    )
    assert run_experiment(faulty, progress=False).backend == "ray"
    assert load_checkpoint(list_checkpoints(tmp_path / "run")[-1][1])["worker_restarts"] == 1  # it really died
    assert_same_federation(tmp_path / "run", run_dir)


def test_resume_after_a_crash_gives_the_same_federation(baseline, tmp_path):
    config, _, run_dir = baseline
    crashed = config.model_copy(deep=True)
    crashed.output.dir = str(tmp_path)
    with pytest.raises(RuntimeError, match="simulated"):
        run_experiment(crashed, progress=False, extra_callbacks=[CrashAfterRound(3)])
    assert [r for r, _ in list_checkpoints(tmp_path / "run")] == [2]
    resume_experiment(tmp_path / "run", progress=False)
    assert_same_federation(tmp_path / "run", run_dir)


def test_fedavg_byol_probes_the_global_encoder(tmp_path):
    overrides = [
        "algorithm.name=fedavg_byol",
        "algorithm.projection_dim=16",
        "algorithm.hidden_dim=32",
        "algorithm.probe_epochs=20",
        "data.num_clients=6",
        "train.clients_per_round=3",
        "train.rounds=2",
        "train.batch_size=32",
        "output.tensorboard=false",
        "output.plots=false",
        "output.name=run",
        "resources.backend=local",
        f"output.dir={tmp_path}",
    ]
    summary = run_experiment(load_config(None, overrides), progress=False)
    rows = read_metrics(tmp_path / "run")
    assert all(r["probe_accuracy"] == r["test_accuracy"] for r in rows)
    assert summary.final_test_accuracy > 0.3
    assert not (tmp_path / "run" / "client_state").exists()  # stateless: the model is global
