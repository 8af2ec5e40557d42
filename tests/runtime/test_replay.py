"""``fedray replay``: one client's update of one round re-executed from a run's config, checkpoints and
seeds, and compared with the run's record (``output.record_update_hashes`` adds the hash of each
upload to the client rows). Real runs on the local backend with digits: no mocks."""

from __future__ import annotations

import hashlib
import io
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
import torch

import fedray
from fedray.cli.main import main
from fedray.layout import checkpoint_path, list_checkpoints
from fedray.runtime.checkpoint import load_checkpoint, save_checkpoint
from fedray.runtime.replay import ReplayError, replay_client
from fedray.tracking import read_metrics
from fedray.tracking.metrics_file import METRICS_FILE, read_metrics_table, write_parquet_atomically

REPO = Path(__file__).resolve().parents[2]
TINY = [
    "resources.backend=local",
    "resources.num_workers=2",
    "data.num_clients=6",
    "train.clients_per_round=3",
    "train.rounds=3",
    "train.local_epochs=1",
    "model.name=mlp",
    "checkpoint.every=1",  # checkpoint.keep=2: rounds 2 and 3 are kept, round 1's is deleted
    "output.tensorboard=false",
    "output.plots=false",
]


def tiny_run(root: Path, name: str, example: str, *overrides: str) -> Path:
    config = fedray.load_config(REPO / "examples" / example, [*TINY, f"output.dir={root}", f"output.name={name}", *overrides])
    return Path(fedray.run_experiment(config, progress=False).run_dir)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    return {
        "fedavg": tiny_run(root, "fedavg", "fedavg_digits.yaml", "output.record_update_hashes=true"),
        "fedavg_plain": tiny_run(root, "fedavg_plain", "fedavg_digits.yaml"),
        "scaffold": tiny_run(root, "scaffold", "scaffold_digits.yaml", "output.record_update_hashes=true"),
    }


def clients_of(run_dir: Path, round: int) -> list[int]:
    return sorted(int(row["client_id"]) for row in read_metrics(run_dir, "client") if row["round"] == round)


def copy_run(run_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(run_dir, tmp_path / run_dir.name))


def snapshot(run_dir: Path) -> dict[str, str]:
    return {str(path.relative_to(run_dir)): hashlib.sha256(path.read_bytes()).hexdigest() for path in run_dir.rglob("*") if path.is_file()}


def cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["replay", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


# --------------------------------------------------------------------- recording


def test_update_hashes_are_recorded_only_when_asked_and_change_nothing_else(runs):
    with_hashes, plain = read_metrics_table(runs["fedavg"]), read_metrics_table(runs["fedavg_plain"])
    assert "update_hash" not in plain.column_names
    assert sorted(plain.column_names) == sorted(set(with_hashes.column_names) - {"update_hash"})
    clients = read_metrics(runs["fedavg"], "client")
    assert len(clients) == 9 and all(len(row["update_hash"]) == 64 for row in clients)
    assert len({row["update_hash"] for row in clients}) == 9  # one per update
    assert all(row["update_hash"] is None for row in read_metrics(runs["fedavg"], "round"))

    def results(run_dir):
        return [{k: v for k, v in row.items() if k not in ("update_hash", "seconds")} for row in read_metrics_table(run_dir).to_pylist()]

    assert results(runs["fedavg"]) == results(runs["fedavg_plain"])  # bit-identical metrics


# --------------------------------------------------------------------- reproduced


def test_fedavg_client_of_the_last_round_is_reproduced_from_its_checkpoint(runs, capsys):
    run_dir = runs["fedavg"]
    client = clients_of(run_dir, 3)[1]
    before = snapshot(run_dir)
    code, out, err = cli(capsys, run_dir, "--round", 3, "--client", client)
    assert code == 0, out + err
    assert f"replay of client {client} in round 3" in out
    assert f"{run_dir / 'config.yaml'} (the same as in checkpoints/round_000002.pt)" in out
    assert "start      the checkpoint of round 2\n" in out
    assert out.rstrip().endswith("reproduced: the replayed metrics and update hash are the recorded ones, bit for bit")
    assert snapshot(run_dir) == before  # the replay wrote nothing into the run

    result = replay_client(run_dir, 3, client)
    recorded = next(row for row in read_metrics(run_dir, "client") if row["round"] == 3 and row["client_id"] == client)
    compared = {c.name: c for c in result.comparisons}
    assert compared["update_hash"].compared and compared["update_hash"].replayed == recorded["update_hash"]
    assert compared["train_loss"].replayed == recorded["train_loss"]
    assert result.start_round == 2 and result.rerun_rounds == []


def test_an_early_round_is_replayed_by_re_running_the_rounds_before_it(runs):
    """checkpoint.keep=2 deleted round 1's checkpoint: round 2 starts from the initial model, round 1 re-run."""
    run_dir = runs["fedavg"]
    assert [r for r, _ in list_checkpoints(run_dir)] == [2, 3]
    result = replay_client(run_dir, 2, clients_of(run_dir, 2)[0])
    assert result.start_round == 0 and result.rerun_rounds == [1] and result.rerun_differences == []
    assert result.reproduced and result.hash_recorded
    assert "then re-ran round 1 on the local backend (it matches the record)" in "\n".join(result.lines())


def test_a_stateful_client_is_replayed_from_its_stored_state(runs):
    """SCAFFOLD keeps each client's control variate c_i: the replayed client starts from the version it had then."""
    run_dir = runs["scaffold"]
    earlier = set(clients_of(run_dir, 1)) | set(clients_of(run_dir, 2))
    client = next(c for c in clients_of(run_dir, 3) if c in earlier)
    last_round_before = max(r for r in (1, 2) if client in clients_of(run_dir, r))
    result = replay_client(run_dir, 3, client)
    assert result.state_version == last_round_before
    assert result.reproduced, result.differences
    assert result.hash_recorded
    again = replay_client(run_dir, 2, clients_of(run_dir, 2)[-1])  # through the re-run of round 1
    assert again.rerun_rounds == [1] and again.reproduced, again.differences


def test_without_recorded_hashes_the_metrics_alone_are_compared(runs, capsys):
    run_dir = runs["fedavg_plain"]
    code, out, _ = cli(capsys, run_dir, "--round", 3, "--client", clients_of(run_dir, 3)[0])
    assert code == 0, out
    assert "update_hash" in out and "(not recorded)" in out
    assert "the metrics alone are compared" in out
    assert out.rstrip().endswith("reproduced: the replayed metrics are the recorded ones, bit for bit")


def test_pdb_stops_at_the_first_line_of_client_update(runs, capsys, monkeypatch):
    run_dir = runs["fedavg"]
    client = clients_of(run_dir, 3)[0]
    monkeypatch.setattr("sys.stdin", io.StringIO("p ('debugging', ctx.client_id, ctx.round)\nc\n"))
    code, out, _ = cli(capsys, run_dir, "--round", 3, "--client", client, "--pdb")
    assert code == 0, out
    assert "client_update()" in out and "(Pdb)" in out
    assert f"('debugging', {client}, 3)" in out


# --------------------------------------------------------------------- differs


def test_an_edited_learning_rate_is_reported_as_differing(runs, tmp_path, capsys):
    run_dir = copy_run(runs["fedavg_plain"], tmp_path)
    config = run_dir / "config.yaml"
    config.write_text(config.read_text().replace("lr: 0.05", "lr: 0.08", 1))
    code, out, _ = cli(capsys, run_dir, "--round", 3, "--client", clients_of(run_dir, 3)[0])
    assert code == 1, out
    assert "differs from the config in checkpoints/round_000002.pt: train.lr (0.05 → 0.08)" in out
    assert "<- differs" in out
    assert out.splitlines()[-1].startswith("differs: train_loss (recorded ")


def test_a_changed_checkpoint_is_reported_as_differing(runs, tmp_path):
    """A checkpoint whose server weights were changed (and whose checksum was rewritten to match)."""
    run_dir = copy_run(runs["fedavg"], tmp_path)
    contents = load_checkpoint(checkpoint_path(run_dir, 2))
    contents["server_state"]["weights"] = contents["server_state"]["weights"] + 1e-3
    save_checkpoint(run_dir, 2, contents, keep=10)
    result = replay_client(run_dir, 3, clients_of(run_dir, 3)[0])
    assert not result.reproduced
    differing = {c.name for c in result.comparisons if not c.same}
    assert {"train_loss", "update_hash"} <= differing


def test_a_changed_update_hash_is_reported_even_with_equal_metrics(runs, tmp_path, capsys):
    run_dir = copy_run(runs["fedavg"], tmp_path)
    client = clients_of(run_dir, 3)[2]
    table = read_metrics_table(run_dir)
    mine = pc.and_(pc.equal(table["round"], 3), pc.equal(table["client_id"], client))
    hashes = pc.if_else(mine, pa.scalar("0" * 64), table["update_hash"])
    write_parquet_atomically(table.set_column(table.column_names.index("update_hash"), "update_hash", hashes), run_dir / METRICS_FILE)
    code, out, _ = cli(capsys, run_dir, "--round", 3, "--client", client)
    assert code == 1, out
    assert out.splitlines()[-1].startswith(
        "differs: update_hash (recorded 0000000000000000000000000000000000000000000000000000000000000000, replayed "
    )
    assert "train_loss" not in out.splitlines()[-1]


def test_a_corrupt_checkpoint_is_named_and_the_replay_starts_earlier(runs, tmp_path):
    run_dir = copy_run(runs["fedavg"], tmp_path)
    path = checkpoint_path(run_dir, 2)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    result = replay_client(run_dir, 3, clients_of(run_dir, 3)[0])
    text = "\n".join(result.lines())
    assert f"note       checkpoint {path} is corrupt" in text
    assert result.start_round == 0 and result.rerun_rounds == [1, 2]
    assert result.reproduced, result.differences


# --------------------------------------------------------------------- refused


def test_a_client_not_in_the_rounds_cohort_is_one_line_and_exit_2(runs, capsys):
    run_dir = runs["fedavg"]
    cohort = clients_of(run_dir, 2)
    absent = next(c for c in range(6) if c not in cohort)
    code, out, err = cli(capsys, run_dir, "--round", 2, "--client", absent)
    assert code == 2 and out == ""
    assert err == f"fedray: client {absent} did not train in round 2 of {run_dir}; the round's clients: {', '.join(map(str, cohort))}\n"


def test_a_round_the_run_did_not_record_is_one_line_and_exit_2(runs, capsys):
    code, out, err = cli(capsys, runs["fedavg"], "--round", 4, "--client", 0)
    assert code == 2 and out == ""
    assert err == f"fedray: {runs['fedavg']} has no record of round 4: its metrics hold rounds 1-3\n"
    with pytest.raises(ReplayError, match="not a run directory: it does not exist"):
        replay_client(runs["fedavg"] / "missing", 1, 0)


def test_the_replay_hash_is_the_hash_of_the_update_the_worker_sums():
    """update_hash covers every sum as float64 and the payload: any changed bit changes it."""
    from fedray.algorithms import ClientUpdate
    from fedray.runtime.worker import update_hash

    sums = {"weights": torch.arange(4, dtype=torch.float32), "num_samples": torch.tensor(3.0)}
    base = update_hash(ClientUpdate(sums=sums, payload={"counts": torch.ones(2)}))
    assert base == update_hash(ClientUpdate(sums=dict(reversed(list(sums.items()))), payload={"counts": torch.ones(2)}))
    assert base == update_hash(ClientUpdate(sums={k: v.double() for k, v in sums.items()}, payload={"counts": torch.ones(2)}))
    nudged = sums["weights"].clone()
    nudged[2] = torch.nextafter(nudged[2], torch.tensor(10.0))
    assert base != update_hash(ClientUpdate(sums={**sums, "weights": nudged}, payload={"counts": torch.ones(2)}))
    assert base != update_hash(ClientUpdate(sums=sums, payload={"counts": torch.ones(3)}))
    assert base != update_hash(ClientUpdate(sums=sums))


def test_a_vectorised_run_replays_the_client_in_its_group(tmp_path):
    """train.vectorize: a CNN's grouped kernels may round differently for a group than for one client,
    so the client is replayed with its worker's other clients of the round, in the same groups."""
    run_dir = tiny_run(
        tmp_path,
        "vectorised",
        "fedavg_digits.yaml",
        "model.name=cnn_small",
        "train.vectorize=on",
        "train.rounds=2",
        "train.clients_per_round=4",
    )
    result = replay_client(run_dir, 2, clients_of(run_dir, 2)[0])
    assert result.training.startswith("vectorised as in the run, with its worker's other clients of the round: ")
    assert not result.training.endswith("none")  # 4 clients on 2 workers: a group of 2
    assert result.reproduced, result.differences
    with pytest.raises(ReplayError, match="--pdb stops in client_update, which this run does not call"):
        replay_client(run_dir, 2, clients_of(run_dir, 2)[0], debug=True)
