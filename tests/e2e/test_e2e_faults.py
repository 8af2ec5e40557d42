"""Faults a run must survive or report clearly: damaged checkpoints and metric files, a reused run
directory, a diverged run, a full disk, a killed server actor, SIGTERM to the driver.

The Ray-free tests come first; the ones marked ``slow`` run real simulations: the engine's own faults
(damaged files on resume, a diverged run) on the local backend, the killed server actor on the
session's real Ray (an actor's death is Ray's), SIGTERM in a real `fedray run` process.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import ray
import torch

from fedray.cli.main import main
from fedray.config import ConfigError
from fedray import load_config
from fedray.runtime import CheckpointError, RunError, TrainingDiverged, list_checkpoints, load_checkpoint, resume_experiment, run_experiment
from fedray.runtime.checkpoint import save_checkpoint
from fedray.tracking import Callback, MetricsParquet, RunContext, read_metrics
from fedray.tracking.atomic import DiskFullError
from fedray.tracking.metrics_file import METRICS_FILE, PARTS_DIR, MetricsError, check_metrics_cover, list_parts, write_table_atomically

from e2e_helpers import CrashAfterRound, comparable_rows, round_rows

REPO = Path(__file__).resolve().parents[2]


def flip_bytes_in_largest_entry(path: Path, count: int = 64) -> None:
    """Invert ``count`` bytes in the middle of the largest stored entry of a torch zip file: the
    tensor data, which ``torch.load`` reads back as other numbers without complaint."""
    with zipfile.ZipFile(path) as archive:
        entry = max(archive.infolist(), key=lambda info: info.file_size)
    raw = bytearray(path.read_bytes())
    name_length, extra_length = (
        int.from_bytes(raw[entry.header_offset + 26 : entry.header_offset + 28], "little"),
        int.from_bytes(raw[entry.header_offset + 28 : entry.header_offset + 30], "little"),
    )
    start = entry.header_offset + 30 + name_length + extra_length + entry.file_size // 2
    raw[start : start + count] = bytes(255 - b for b in raw[start : start + count])
    path.write_bytes(bytes(raw))


# ---------------------------------------------------------------------------------------- Ray-free


def test_flipped_bytes_in_checkpoint_tensor_data_are_reported(tmp_path):
    weights = torch.randn(5000)
    for round in (2, 4):
        save_checkpoint(
            tmp_path, round, {"server_state": {"weights": weights}, "state_versions": torch.zeros(3, dtype=torch.int64)}, keep=2
        )
    newest = list_checkpoints(tmp_path)[-1][1]
    flip_bytes_in_largest_entry(newest)
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(newest)
    message = str(caught.value)
    assert "round_000004.pt is corrupt (checksum mismatch" in message
    assert "Earlier checkpoints: round_000002.pt; delete round_000004.pt" in message
    assert torch.equal(load_checkpoint(list_checkpoints(tmp_path)[0][1])["server_state"]["weights"], weights)


def test_a_full_disk_is_reported_and_leaves_no_temporary_file(tmp_path):
    """The temporary file is a link to /dev/full, whose writes fail with ENOSPC for real."""
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full")
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "round_000002.pt.tmp").symlink_to("/dev/full")
    with pytest.raises(DiskFullError, match=r"no space left on device while writing .*round_000002\.pt"):
        save_checkpoint(tmp_path, 2, {"server_state": {"w": torch.ones(1000)}, "state_versions": torch.zeros(1)}, keep=2)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == []
    (tmp_path / "m.parquet.tmp").symlink_to("/dev/full")
    with pytest.raises(DiskFullError, match="no space left on device"):
        write_table_atomically([{"round": 1}], tmp_path / "m.parquet")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoints"]


def _drive(run: RunContext, metrics: MetricsParquet, rounds: range) -> None:
    for round in rounds:
        metrics.on_round_end(run, {"round": round, "test_accuracy": round / 10}, [{"client_id": c, "loss": float(c)} for c in range(3)])


def test_metrics_parts_are_append_only_and_rebuilt_on_resume(tmp_path):
    config = load_config(None, ["train.rounds=12", "checkpoint.every=4"])
    run = RunContext(config=config, run_dir=tmp_path, data=None, server=None, start_round=0)
    metrics = MetricsParquet(min_interval=0.0)  # a part every round, replaced by one part per checkpoint interval
    metrics.on_run_start(run)
    _drive(run, metrics, range(1, 5))
    first_part = list_parts(tmp_path)[0][2]
    stamp = first_part.stat().st_mtime_ns, first_part.stat().st_ino
    _drive(run, metrics, range(5, 11))  # a crash after round 10: checkpoints 4 and 8
    assert [(first, last) for first, last, _ in list_parts(tmp_path)] == [(1, 4), (5, 8), (9, 9), (10, 10)]
    assert (first_part.stat().st_mtime_ns, first_part.stat().st_ino) == stamp  # written once, never rewritten
    assert [r["round"] for r in read_metrics(tmp_path)] == list(range(1, 11))

    (tmp_path / METRICS_FILE).write_bytes(b"PAR1 truncated")  # a damaged leftover metrics.parquet plays no part
    check_metrics_cover(tmp_path, 8)
    resumed = RunContext(config=config, run_dir=tmp_path, data=None, server=None, start_round=8)
    metrics = MetricsParquet(min_interval=0.0)
    metrics.on_run_start(resumed)
    assert [r["round"] for r in resumed.history] == list(range(1, 9))  # the summary sees every round
    assert [(first, last) for first, last, _ in list_parts(tmp_path)] == [(1, 8)]  # rounds 9, 10 are recomputed
    _drive(resumed, metrics, range(9, 13))
    metrics.on_run_end(resumed)
    assert not (tmp_path / PARTS_DIR).exists()
    table = pq.read_table(tmp_path / METRICS_FILE).to_pylist()
    assert [r["round"] for r in table if r["scope"] == "round"] == list(range(1, 13))
    assert len([r for r in table if r["scope"] == "client"]) == 12 * 3
    assert read_metrics(tmp_path) == [r for r in table if r["scope"] == "round"]


def test_resume_refuses_missing_or_damaged_metric_parts(tmp_path):
    config = load_config(None, ["train.rounds=8", "checkpoint.every=2"])
    run = RunContext(config=config, run_dir=tmp_path, data=None, server=None, start_round=0)
    metrics = MetricsParquet(min_interval=1e9)
    metrics.on_run_start(run)
    _drive(run, metrics, range(1, 5))
    parts = list_parts(tmp_path)
    parts[0][2].unlink()
    with pytest.raises(MetricsError, match=r"the metrics of round\(s\) 1, 2 \(up to the checkpoint of round 4\) are missing"):
        check_metrics_cover(tmp_path, 4)
    damaged = parts[1][2]
    raw = bytearray(damaged.read_bytes())
    raw[4:40] = bytes(36)  # the first data page
    damaged.write_bytes(bytes(raw))
    with pytest.raises(MetricsError, match=r"rounds_000003-000004\.parquet is damaged"):
        check_metrics_cover(tmp_path, 4)


def test_a_second_run_with_the_same_name_is_refused_and_the_first_is_untouched(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "round_000005.pt").write_bytes(b"the first run's checkpoint")
    config = load_config(None, [f"output.dir={tmp_path}", "output.name=run", "seed=1", "train.rounds=2"])
    with pytest.raises(ConfigError, match="already exists; choose another output.name, delete it, or continue it with"):
        run_experiment(config, progress=False)
    assert sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*")) == ["checkpoints", "checkpoints/round_000005.pt"]


# ---------------------------------------------------------------------------------------- on Ray


class KillServerAfterRound(Callback):
    """Kills the server actor after ``round`` (its checkpoint is written first), as a lost process would."""

    def __init__(self, round: int) -> None:
        self.round = round

    def on_round_end(self, run, row, client_rows):
        if row["round"] == self.round:
            ray.kill(run.server.actor)


@pytest.mark.slow
def test_damaged_files_on_resume_are_reported_then_the_fallback_resumes(tmp_path, tiny_overrides, capsys):
    # two workers on the local backend (the checks are the engine's; bit-identical to Ray's workers)
    overrides = tiny_overrides + ["checkpoint.every=1", "checkpoint.keep=2", "resources.backend=local"]
    config = load_config(None, overrides)
    run_dir = tmp_path / "run"
    with pytest.raises(RuntimeError, match="simulated"):
        run_experiment(config, progress=False, extra_callbacks=[CrashAfterRound(3)])
    assert [r for r, _ in list_checkpoints(run_dir)] == [2, 3]

    # 1. flipped bytes in the newest checkpoint's tensor data: refused, naming the fallback (exit 2)
    newest = list_checkpoints(run_dir)[-1][1]
    flip_bytes_in_largest_entry(newest)
    assert main(["run", "--resume", str(run_dir), "--quiet"]) == 2
    error = capsys.readouterr().err
    assert "round_000003.pt is corrupt (checksum mismatch" in error and "Earlier checkpoints: round_000002.pt" in error

    # 2. the metric parts of the first rounds deleted: refused (exit 2) instead of a silently shorter history
    saved = tmp_path / "parts-copy"
    shutil.copytree(run_dir / PARTS_DIR, saved)
    newest.unlink()  # follow the advice: fall back to round 2
    shutil.rmtree(run_dir / PARTS_DIR)
    assert main(["run", "--resume", str(run_dir), "--quiet"]) == 2
    assert "the metrics of round(s) 1, 2 (up to the checkpoint of round 2) are missing" in capsys.readouterr().err

    # 3. parts back, metrics.parquet truncated: the resume rebuilds every row and finishes
    shutil.copytree(saved, run_dir / PARTS_DIR)
    (run_dir / METRICS_FILE).write_bytes(b"PAR1 half a file")
    summary = resume_experiment(run_dir, progress=False)
    assert summary.rounds == 4
    rows = round_rows(run_dir)
    assert [r["round"] for r in rows] == [1, 2, 3, 4]
    assert summary.best_test_accuracy == max(r["test_accuracy"] for r in rows)
    clean = load_config(None, overrides + [f"output.dir={tmp_path / 'clean'}"])
    run_experiment(clean, progress=False)
    assert comparable_rows(rows) == comparable_rows(round_rows(tmp_path / "clean" / "run"))


@pytest.mark.slow
def test_a_run_whose_every_update_is_excluded_fails(tmp_path, tiny_overrides):
    config = load_config(None, tiny_overrides + ["train.lr=1e30", "train.local_epochs=3", "resources.backend=local"])
    with pytest.raises(
        TrainingDiverged, match=r"round 1: all 4 client updates were non-finite .* lower train\.lr \(now 1e\+30\)"
    ) as raised:
        run_experiment(config, progress=False)
    assert raised.value.round == 1 and isinstance(raised.value, RunError)  # the CLI prints it as one line, exit 1
    assert not (tmp_path / "run").exists()  # it failed in its first round: nothing was recorded as if it had trained


@pytest.mark.slow
@pytest.mark.ray
def test_a_killed_server_actor_is_reported_with_how_to_resume(ray_session, tmp_path, tiny_overrides):
    # the server actor is Ray's (one worker actor beside it is enough)
    config = load_config(None, tiny_overrides + ["resources.backend=ray", "resources.num_workers=1"])
    with pytest.raises(
        RunError, match=r"the server actor died .*continue it from its checkpoint of round 2 with `fedray run --resume .*run`"
    ):
        run_experiment(config, progress=False, extra_callbacks=[KillServerAfterRound(2)])
    assert [r for r, _ in list_checkpoints(tmp_path / "run")] == [2]


@pytest.mark.slow
def test_sigterm_stops_the_driver_like_ctrl_c_with_the_real_resume_command(tmp_path):
    """A real `fedray run` process with its own local Ray, sent SIGTERM after its first round."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_ADDRESS": ""}
    command = [
        sys.executable,
        "-m",
        "fedray.cli.main",
        "run",
        "--quiet",
        "--set",
        f"output.dir={tmp_path}",
        "--set",
        "output.name=run",
        "--set",
        "train.rounds=500",
        "--set",
        "checkpoint.every=1",
        "--set",
        "resources.num_workers=1",
        "--set",
        "output.plots=false",
    ]
    process = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not list_checkpoints(tmp_path / "run") and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.5)
        assert list_checkpoints(tmp_path / "run"), "no round finished in time"
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, stderr[-3000:]
    assert f"`fedray run --resume {tmp_path / 'run'}`" in stderr
    assert "SIGTERM received" not in stderr and "Traceback" not in stderr
