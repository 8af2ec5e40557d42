"""The client state store on a local path and on a real S3 endpoint (moto's server on loopback):
atomic writes, round versions, the versions of every kept checkpoint, checksums, the worker cache.
And, end to end (two workers on the local backend, bit-identical to Ray's): a stateful run resumes
from an older checkpoint after the newest one is deleted, a damaged client-state file stops the run
naming client, round and file; on the session's Ray, the check that every node reads the state
location survives a node that dies while it runs."""

from __future__ import annotations

from pathlib import Path

import pyarrow.fs as pafs
import pytest
import torch

from fedray import load_config
from fedray.runtime import list_checkpoints, load_checkpoint, resume_experiment, run_experiment
from fedray.runtime.state_store import (
    NO_STATE,
    ClientStateError,
    ClientStateMissing,
    ClientStateStore,
    client_state_location,
    join_location,
    nodes_missing_location,
    open_location,
)
from fedray.tracking import read_metrics

from e2e_helpers import CrashAfterRound, comparable_rows, final_weights

CPU = torch.device("cpu")


@pytest.fixture(params=["local", "s3"])
def location(request, tmp_path) -> str:
    if request.param == "local":
        return str(tmp_path / "client_state")
    return request.getfixturevalue("s3").uri(f"{tmp_path.name}/client_state")


def files(location: str, client_id: int) -> list[str]:
    filesystem, root = open_location(location)
    return sorted(info.base_name for info in filesystem.get_file_info(pafs.FileSelector(f"{root}/{client_id:07d}")))


def read(location: str, client_id: int, version: int) -> bytes:
    filesystem, root = open_location(location)
    with filesystem.open_input_stream(f"{root}/{client_id:07d}/r{version:06d}.pt") as stream:
        return stream.readall()


def overwrite(location: str, client_id: int, version: int, transform) -> None:
    """Replace a stored file's bytes by ``transform(bytes)``, behind the store's back."""
    data = transform(read(location, client_id, version))
    filesystem, root = open_location(location)
    with filesystem.open_output_stream(f"{root}/{client_id:07d}/r{version:06d}.pt") as stream:
        stream.write(data)


def state(value: float) -> dict[str, torch.Tensor]:
    return {"w": torch.full((4,), value), "b": torch.tensor([value, -value])}


def test_round_versions_and_keep_set(location):
    store = ClientStateStore(location)
    assert store.load(3, NO_STATE, CPU) is None
    store.save(3, 1, state(1), keep=())
    store.save(3, 4, state(4), keep=(1,))
    store.save(3, 6, state(6), keep=(4, 1))  # round 4 loaded, round 1 referred to by a kept checkpoint
    assert files(location, 3) == ["r000001.pt", "r000004.pt", "r000006.pt"]
    other_worker = ClientStateStore(location)  # reads from storage
    assert torch.equal(other_worker.load(3, 1, CPU)["w"], state(1)["w"])
    assert torch.equal(other_worker.load(3, 6, CPU)["b"], state(6)["b"])
    store.save(3, 7, state(7), keep=(6, NO_STATE))
    assert files(location, 3) == ["r000006.pt", "r000007.pt"]
    with pytest.raises(ClientStateMissing, match=r"client 3: state of round 1 \(.*0000003/r000001\.pt\) is missing"):
        other_worker.load(3, 1, CPU)


def test_versions_of_every_kept_checkpoint_survive(location):
    """checkpoint.keep = 3: a client's state of each of the three kept checkpoints stays loadable."""
    store = ClientStateStore(location)
    for version, keep in [(2, ()), (4, (2,)), (6, (4, 2)), (8, (6, 2, 4, 6)), (9, (8, 4, 6, 8))]:
        store.save(5, version, state(version), keep=keep)
    assert files(location, 5) == ["r000004.pt", "r000006.pt", "r000008.pt", "r000009.pt"]
    for version in (4, 6, 8, 9):
        assert torch.equal(ClientStateStore(location).load(5, version, CPU)["w"], state(version)["w"])


def test_writes_are_atomic_whole_files(location):
    store = ClientStateStore(location)
    store.save(2, 3, state(3), keep=())
    store.save(2, 3, state(30), keep=())  # a retried client rewrites its round: replaced whole
    assert files(location, 2) == ["r000003.pt"]  # no temporary file is left behind
    assert torch.equal(ClientStateStore(location).load(2, 3, CPU)["w"], state(30)["w"])


@pytest.mark.parametrize(
    "damage, reason",
    [
        (lambda data: data[:-40] + bytes(b ^ 0xFF for b in data[-40:-20]) + data[-20:], "checksum does not match"),
        (lambda data: data[: len(data) // 2], "checksum does not match"),
        (lambda data: data[:20], "not a fedray client-state file"),
        (lambda data: b"", "not a fedray client-state file"),
    ],
    ids=["flipped-bytes", "truncated", "cut-in-header", "emptied"],
)
def test_damaged_state_is_reported_with_client_round_and_file(location, damage, reason):
    ClientStateStore(location).save(6, 5, state(5), keep=())
    overwrite(location, 6, 5, damage)
    with pytest.raises(ClientStateError, match=rf"client 6: state of round 5 \(.*0000006/r000005\.pt\) is corrupt: .*{reason}"):
        ClientStateStore(location).load(6, 5, CPU)


def test_cache_serves_sticky_clients_without_reading_storage(location):
    store = ClientStateStore(location, cache_size=1)
    store.save(1, 2, state(2), keep=())
    overwrite(location, 1, 2, lambda data: b"")  # what storage holds is no longer readable...
    assert torch.equal(store.load(1, 2, CPU)["w"], state(2)["w"])  # ...the writer never reads it back
    with pytest.raises(ClientStateError):
        ClientStateStore(location).load(1, 2, CPU)
    store.save(4, 2, state(2), keep=())  # cache_size=1: client 1 is evicted and read from storage
    with pytest.raises(ClientStateError):
        store.load(1, 2, CPU)
    by_bytes = ClientStateStore(location, cache_bytes=2 * 24)  # a state(...) holds 6 float32 = 24 bytes
    for client in (7, 8, 9):
        by_bytes.save(client, 1, state(float(client)), keep=())
        overwrite(location, client, 1, lambda data: b"")
    assert torch.equal(by_bytes.load(9, 1, CPU)["w"], state(9.0)["w"]) and torch.equal(by_bytes.load(8, 1, CPU)["w"], state(8.0)["w"])
    with pytest.raises(ClientStateError):  # the oldest went over the byte budget
        by_bytes.load(7, 1, CPU)


def test_locations_follow_output_dir_or_client_state_dir(tmp_path, s3):
    output = load_config(None, [f"output.dir={tmp_path}"]).output
    assert client_state_location(output, tmp_path / "run") == str(tmp_path / "run" / "client_state")
    uri = "s3://bucket/runs?endpoint_override=127.0.0.1:9&scheme=http"
    assert client_state_location(load_config(None, [f"output.dir={uri}"]).output, tmp_path / "run") == (
        "s3://bucket/runs/run/client_state?endpoint_override=127.0.0.1:9&scheme=http"  # straight to the URI
    )
    chosen = load_config(None, [f"output.dir={tmp_path}", f"output.client_state_dir={s3.uri('state')}"]).output
    assert client_state_location(chosen, tmp_path / "run") == join_location(s3.uri("state"), "run")
    assert open_location(join_location(s3.uri("state"), "run"))[1] == f"{s3.bucket}/state/run"
    with pytest.raises(ClientStateError, match="cannot open the client state location 'nosuch://x'"):
        ClientStateStore("nosuch://x")


# ------------------------------------------------------------------ end to end

RESUME_RUN = [
    "algorithm.name=fedper",
    "data.client_test_fraction=0.25",  # FedPer is personalised: it requires per-client test splits
    "eval.personalized=true",
    "data.num_clients=4",
    "train.clients_per_round=4",  # every client trains every round: each round supersedes its state
    "train.local_epochs=1",
    "train.rounds=6",
    "checkpoint.every=2",
    "checkpoint.keep=2",
    "output.name=run",
    "output.tensorboard=false",
    "output.plots=false",
    "resources.backend=local",  # two workers in this process: the resume and the store are the engine's
]


def final_client_states(run_dir: Path, config) -> dict[int, dict[str, torch.Tensor]]:
    versions = load_checkpoint(list_checkpoints(run_dir)[-1][1])["state_versions"]
    store = ClientStateStore(client_state_location(config.output, run_dir))
    return {c: store.load(c, int(v), CPU) for c, v in enumerate(versions)}


@pytest.mark.slow
def test_stateful_run_resumes_from_the_older_kept_checkpoint(tmp_path):
    """Issue: after the newest checkpoint is damaged and deleted, resuming from the older one must
    find the client state that checkpoint refers to, although later rounds superseded it; a damaged
    client-state file stops the resume with the client, round and file named."""
    reference = load_config(None, RESUME_RUN + [f"output.dir={tmp_path / 'reference'}"])
    run_experiment(reference, progress=False)
    crashed = load_config(None, RESUME_RUN + [f"output.dir={tmp_path / 'crashed'}"])
    with pytest.raises(RuntimeError, match="simulated driver crash"):
        run_experiment(crashed, progress=False, extra_callbacks=[CrashAfterRound(5)])  # round 5 superseded round 4's state
    run_dir = tmp_path / "crashed" / "run"
    assert [r for r, _ in list_checkpoints(run_dir)] == [2, 4]
    list_checkpoints(run_dir)[-1][1].unlink()  # "delete round_000004.pt to resume from the newest of them"

    location = client_state_location(crashed.output, run_dir)
    assert all(files(location, c)[0] == "r000002.pt" for c in range(4))  # kept for checkpoint 2
    original = read(location, 2, 2)
    overwrite(location, 2, 2, lambda data: data[:-8] + b"\0" * 8)
    with pytest.raises(ClientStateError, match=r"client 2: state of round 2 \(.*0000002/r000002\.pt\) is corrupt"):
        resume_experiment(run_dir, progress=False)
    overwrite(location, 2, 2, lambda data: original)

    resume_experiment(run_dir, progress=False)
    reference_dir = tmp_path / "reference" / "run"
    assert torch.equal(final_weights(run_dir), final_weights(reference_dir))
    assert comparable_rows(read_metrics(run_dir)) == comparable_rows(read_metrics(reference_dir))
    mine, theirs = final_client_states(run_dir, crashed), final_client_states(reference_dir, reference)
    assert all(torch.equal(mine[c]["personal"], theirs[c]["personal"]) for c in range(4))


def test_a_stateful_run_with_an_unopenable_state_location_fails_before_writing_anything(tmp_path):
    from fedray.config import ConfigError

    config = load_config(
        None,
        [
            "algorithm.name=fedper",
            "data.client_test_fraction=0.25",
            "eval.personalized=true",
            f"output.dir={tmp_path}",
            "output.client_state_dir=nosuch://bucket/state",
        ],
    )
    with pytest.raises(ConfigError, match=r"output.client_state_dir: cannot open the client state location 'nosuch://bucket/state/"):
        run_experiment(config, progress=False)
    assert not any(tmp_path.iterdir())  # no run directory: it failed before Ray and before writing


@pytest.mark.parametrize("dies", [True, False], ids=["node-dies", "node-stays"])
def test_reachability_check_leaves_out_a_node_that_dies_during_it(ray_session, tmp_path, monkeypatch, dies):
    """A node listed alive whose marker read is refused by Ray's scheduler (it is gone) is left out
    of the check instead of failing the run, as on a busy cluster whose second node dies between the
    listing and the read (CI, stop 49); a node still listed alive after such a refusal is an error.
    The phantom node is an ID no node has: Ray itself refuses the pinned read."""
    import ray

    from fedray.runtime import state_store

    real_alive_nodes = state_store.alive_ray_nodes
    phantom = {"NodeID": "ab" * 28, "NodeManagerAddress": "192.0.2.99", "Alive": True}
    listings = iter([[*real_alive_nodes(), phantom]])
    monkeypatch.setattr(
        state_store, "alive_ray_nodes", lambda: next(listings, None) or real_alive_nodes() + ([phantom] if not dies else [])
    )
    location = str(tmp_path / "state")
    if dies:
        assert nodes_missing_location(location, timeout=60) == []
    else:
        with pytest.raises(ray.exceptions.RayError):
            nodes_missing_location(location, timeout=60)
    assert list(Path(location).iterdir()) == []
