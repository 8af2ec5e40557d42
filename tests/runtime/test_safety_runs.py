"""Nothing lost, nothing misreported (issue 42): real runs on the local backend (one worker, no Ray)
that another run, a callback, a deleted file or an edited ``config.yaml`` must not corrupt.

- a second run of the same ``output.name`` sharing ``output.client_state_dir`` is refused instead
  of deleting the first run's client state, which still resumes;
- a callback that edits the rows it receives changes neither the metrics nor ``summary.json``;
- metric parts deleted during a run are noticed at its end: the round rows are written again from
  memory, with a warning;
- ``--resume`` after ``config.yaml`` was edited refuses a change to what already ran and records an
  allowed one in ``resumes.json``;
- two runs given the same run directory at the same moment: one runs, the other is refused;
- an ``output.dir`` that cannot be created is one line, exit 2.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
import yaml

from fedray import load_config
from fedray.config import ConfigError
from fedray.layout import RESUMES_FILE, RUN_ID_FILE
from fedray.runtime import list_checkpoints, resume_experiment, run_experiment
from fedray.runtime.experiment import claim_new_run_dir, default_callbacks
from fedray.runtime.resume import ConfigChange
from fedray.runtime.state_store import CLAIM_FILE, join_location, open_location
from fedray.tracking import Callback, read_metrics
from fedray.tracking.metrics_file import METRICS_FILE, list_parts

from e2e_helpers import CrashAfterRound, comparable_rows, final_weights, round_rows
from preloaded_cli import run_fedray_preloaded
from test_bad_inputs import assert_rejected

REPO = Path(__file__).resolve().parents[2]

LOCAL_RUN = [
    "resources.num_workers=1",  # the local backend: no Ray
    "data.num_clients=4",
    "train.clients_per_round=4",
    "train.local_epochs=1",
    "train.rounds=4",
    "checkpoint.every=2",
    "output.tensorboard=false",
    "output.plots=false",
]
FEDPER = ["algorithm.name=fedper", "data.client_test_fraction=0.2", "eval.personalized=true"]  # keeps a personal head per client


def fedray_cli(*args: str, cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_ADDRESS": ""}
    return subprocess.Popen(
        [sys.executable, "-m", "fedray.cli.main", *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def fedray_command(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``fedray ARGS`` run to its end by a fork of a preloaded process (tests/preloaded_cli.py): its exit
    code and output are a ``python -m fedray.cli.main`` process's, without the imports."""
    return run_fedray_preloaded(list(args), cwd)


def finished(process: subprocess.Popen) -> subprocess.CompletedProcess:
    stdout, stderr = process.communicate(timeout=300)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def contents(location: str) -> dict[str, bytes]:
    """Every file under a client state location (a path or a URI): relative path -> bytes."""
    filesystem, root = open_location(location)
    found = {}
    for info in filesystem.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True)):
        if info.type == pafs.FileType.File:
            with filesystem.open_input_stream(info.path) as stream:
                found[info.path[len(root) + 1 :]] = stream.readall()
    return found


def tree(directory: Path) -> dict[str, bytes]:
    return {str(path.relative_to(directory)): path.read_bytes() for path in sorted(directory.rglob("*")) if path.is_file()}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The uninterrupted runs the tests compare with, each run once for the module: name -> summary."""
    directory, runs = tmp_path_factory.mktemp("uninterrupted"), {}

    def run(name: str, overrides: list[str]):
        if name not in runs:
            runs[name] = run_experiment(load_config(None, overrides + [f"output.dir={directory}", f"output.name={name}"]), progress=False)
        return runs[name]

    return run


def plain_run(uninterrupted, rounds: int = 4):
    """The plain local run of ``rounds`` rounds (LOCAL_RUN), uninterrupted."""
    return uninterrupted(f"plain{rounds}", LOCAL_RUN + [f"train.rounds={rounds}"])


# --------------------------------------------------------------------- 1. shared client state locations


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_second_run_of_the_same_name_cannot_take_the_first_runs_client_state(tmp_path, request, where, uninterrupted):
    """Two results folders, one ``output.client_state_dir``, the same ``output.name``: the second run
    is refused before it writes anything, and the first, interrupted, resumes to the result of an
    uninterrupted run from the state it left."""
    state_dir = str(tmp_path / "state") if where == "local" else request.getfixturevalue("s3").uri(f"{tmp_path.name}/state")
    shared = FEDPER + LOCAL_RUN + ["output.name=exp1", f"output.client_state_dir={state_dir}"]
    first = load_config(None, shared + [f"output.dir={tmp_path / 'A'}"])
    with pytest.raises(RuntimeError, match="simulated driver crash"):
        run_experiment(first, progress=False, extra_callbacks=[CrashAfterRound(3)])
    first_dir = tmp_path / "A" / "exp1"
    location = join_location(state_dir, "exp1")
    state_before = contents(location)
    assert CLAIM_FILE in state_before and len(state_before) > 4  # the claim and a state per client

    second = load_config(None, shared + [f"output.dir={tmp_path / 'B'}"])
    with pytest.raises(
        ConfigError, match=rf"output.client_state_dir: .*exp1 holds the client state of another run \({re.escape(str(first_dir))} on "
    ):
        run_experiment(second, progress=False)
    assert not (tmp_path / "B").exists()  # refused before anything was written
    assert contents(location) == state_before

    resume_experiment(first_dir, progress=False)
    reference = uninterrupted("fedper", FEDPER + LOCAL_RUN)
    assert comparable_rows(round_rows(first_dir)) == comparable_rows(round_rows(reference.run_dir))
    assert (first_dir / RUN_ID_FILE).is_file()


def test_the_refusal_is_one_line_with_exit_code_2(tmp_path):
    shared = FEDPER + LOCAL_RUN + ["train.rounds=1", "output.name=exp1", f"output.client_state_dir={tmp_path / 'state'}"]
    run_experiment(load_config(None, shared + [f"output.dir={tmp_path / 'A'}"]), progress=False)
    overrides = [argument for override in shared + [f"output.dir={tmp_path / 'B'}"] for argument in ("--set", override)]
    result = fedray_command("run", "--quiet", *overrides, cwd=tmp_path)
    assert_rejected(result, "output.client_state_dir: ")
    assert "holds the client state of another run" in result.stderr
    assert not (tmp_path / "B").exists()


# --------------------------------------------------------------------- 2. callbacks get copies


class RowEditor(Callback):
    """Overwrites every value it is given, as a careless logging callback might."""

    def on_round_end(self, run, row, client_rows):
        row["test_accuracy"], row["round"] = 123.0, -1
        for client in client_rows:
            client["train_loss"], client["client_id"] = -5.0, -1


def test_a_callback_that_edits_its_rows_changes_no_record(tmp_path, uninterrupted):
    config = load_config(None, LOCAL_RUN + [f"output.dir={tmp_path}", "output.name=edited"])
    edited = run_experiment(config, progress=False, callbacks=[RowEditor(), *default_callbacks(config, progress=False, on_ray=False)])
    reference = plain_run(uninterrupted)

    summary = json.loads((Path(edited.run_dir) / "summary.json").read_text())
    assert summary["rounds"] == 4 and summary["final_test_accuracy"] == reference.final_test_accuracy < 1
    assert comparable_rows(round_rows(edited.run_dir)) == comparable_rows(round_rows(reference.run_dir))
    assert read_metrics(edited.run_dir, "client") == read_metrics(reference.run_dir, "client")


# --------------------------------------------------------------------- 3. metric parts deleted mid-run


class PartDeleter(Callback):
    """Deletes the metric parts of rounds 1-2 once round 4 has ended."""

    def on_round_end(self, run, row, client_rows):
        if row["round"] == 4:
            for _, last, path in list_parts(run.run_dir):
                if last <= 2:
                    path.unlink()


def test_metric_parts_deleted_during_a_run_are_written_again_from_memory_with_a_warning(tmp_path, caplog, uninterrupted):
    overrides = LOCAL_RUN + ["train.rounds=6", f"output.dir={tmp_path}"]
    reference = plain_run(uninterrupted, rounds=6)
    with caplog.at_level(logging.WARNING, logger="fedray.tracking.metrics_file"):
        damaged = run_experiment(load_config(None, overrides + ["output.name=damaged"]), progress=False, extra_callbacks=[PartDeleter()])

    assert "the metrics of round(s) 1-2 were removed" in caplog.text and "client rows are lost" in caplog.text
    compacted = pq.read_table(Path(damaged.run_dir) / METRICS_FILE).to_pylist()  # in round order, as written
    assert [row["round"] for row in compacted if row["scope"] == "round"] == [1, 2, 3, 4, 5, 6]
    assert comparable_rows(round_rows(damaged.run_dir)) == comparable_rows(round_rows(reference.run_dir))
    assert {row["round"] for row in read_metrics(damaged.run_dir, "client")} == {3, 4, 5, 6}


def test_a_damaged_metric_part_is_refused_in_one_line_whose_remedy_resumes(tmp_path, uninterrupted):
    overrides = LOCAL_RUN + ["train.rounds=6", f"output.dir={tmp_path}"]
    with pytest.raises(RuntimeError, match="simulated driver crash"):
        run_experiment(load_config(None, overrides + ["output.name=cut"]), progress=False, extra_callbacks=[CrashAfterRound(5)])
    run_dir = tmp_path / "cut"
    assert [r for r, _ in list_checkpoints(run_dir)] == [2, 4]
    part = next(path for first, last, path in list_parts(run_dir) if (first, last) == (3, 4))
    part.write_bytes(part.read_bytes()[: part.stat().st_size // 2])  # cut short, as by a full disk

    result = fedray_command("run", "--resume", str(run_dir), "--quiet", cwd=tmp_path)
    assert_rejected(
        result,
        f"fedray: cannot resume {run_dir}: metrics_parts/rounds_000003-000004.parquet is damaged (Parquet magic bytes not found "
        "in footer. Either the file is corrupted or this is not a parquet file.), so the metrics of rounds 3-4 cannot be rebuilt; ",
    )
    remedy = re.search(
        r"the metrics of rounds 1-2 are intact: delete (.+), then resume again to continue from the checkpoint of round 2$",
        result.stderr.strip(),
    )
    assert remedy is not None, result.stderr
    assert remedy.group(1).split(", ") == ["metrics_parts/rounds_000003-000004.parquet", "checkpoints/round_000004.pt"]

    for name in remedy.group(1).split(", "):  # follow the advice
        (run_dir / name).unlink()
    resume_experiment(run_dir, progress=False)
    whole = plain_run(uninterrupted, rounds=6)
    assert comparable_rows(round_rows(run_dir)) == comparable_rows(round_rows(whole.run_dir))
    assert {row["round"] for row in read_metrics(run_dir, "client")} == set(range(1, 7))


# --------------------------------------------------------------------- 4. resuming an edited config


def test_which_config_changes_a_resume_allows():
    assert ConfigChange("train.rounds", 30, 40).allowed
    assert not ConfigChange("train.rounds", 30, 20).allowed
    assert ConfigChange("resources.num_workers", 2, 4).allowed and ConfigChange("output.callbacks", [], ["mlflow"]).allowed
    for key in (
        "train.lr",
        "seed",
        "data.alpha",
        "algorithm.name",
        "algorithm.mu",
        "model.width",
        "eval.batch_size",
        "output.client_state_dir",
    ):
        assert not ConfigChange(key, 1, 2).allowed, key


def test_resume_refuses_an_edited_config_and_records_an_allowed_change(tmp_path):
    with pytest.raises(RuntimeError, match="simulated driver crash"):
        run_experiment(
            load_config(None, LOCAL_RUN + [f"output.dir={tmp_path}", "output.name=run"]),
            progress=False,
            extra_callbacks=[CrashAfterRound(3)],
        )
    run_dir = tmp_path / "run"
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())

    edited = json.loads(json.dumps(saved))
    edited["train"]["lr"], edited["seed"], edited["model"]["width"] = 0.5, 3, 32
    (run_dir / "config.yaml").write_text(yaml.safe_dump(edited, sort_keys=False))
    before = tree(run_dir)
    refused = fedray_command("run", "--resume", str(run_dir), "--quiet", cwd=tmp_path)
    assert_rejected(refused, "changed since the checkpoint of round 2: seed (0 → 3), model.width (16 → 32), train.lr (0.05 → 0.5)")
    assert tree(run_dir) == before

    saved["train"]["rounds"] = 6
    (run_dir / "config.yaml").write_text(yaml.safe_dump(saved, sort_keys=False))
    extended = fedray_command("run", "--resume", str(run_dir), "--quiet", cwd=tmp_path)
    assert extended.returncode == 0, extended.stderr[-3000:]
    resumes = json.loads((run_dir / RESUMES_FILE).read_text())
    assert [(r["round"], r["changes"]) for r in resumes] == [(2, {"train.rounds": [4, 6]})]
    assert [row["round"] for row in round_rows(run_dir)] == [1, 2, 3, 4, 5, 6]


def test_an_unchanged_resume_records_nothing_and_matches_an_uninterrupted_run(tmp_path, uninterrupted):
    with pytest.raises(RuntimeError, match="simulated driver crash"):
        run_experiment(
            load_config(None, LOCAL_RUN + [f"output.dir={tmp_path}", "output.name=cut"]),
            progress=False,
            extra_callbacks=[CrashAfterRound(3)],
        )
    resume_experiment(tmp_path / "cut", progress=False)
    whole = plain_run(uninterrupted)
    assert not (tmp_path / "cut" / RESUMES_FILE).exists()
    assert comparable_rows(round_rows(tmp_path / "cut")) == comparable_rows(round_rows(whole.run_dir))
    assert (final_weights(tmp_path / "cut") == final_weights(whole.run_dir)).all()


# --------------------------------------------------------------------- 5. two runs, one run directory


@pytest.mark.parametrize("name", ["taken", None])
def test_run_directories_are_claimed_atomically(tmp_path, name):
    """Eight threads claim at the same moment: one gets a named run directory, the others are
    refused; unnamed runs each get their own."""
    config = load_config(None, [f"output.dir={tmp_path}"] + ([f"output.name={name}"] if name else []))
    start, claimed, refused = threading.Barrier(8), [], []

    def claim() -> None:
        start.wait()
        try:
            claimed.append(claim_new_run_dir(config)[0])
        except ConfigError as error:
            refused.append(str(error))

    threads = [threading.Thread(target=claim) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if name:
        assert claimed == [tmp_path / name] and len(refused) == 7
        assert all("already exists" in error for error in refused)
    else:
        assert len(set(claimed)) == 8 and not refused


@pytest.mark.slow  # two fedray processes
def test_two_runs_started_together_with_one_name_one_runs_the_other_is_refused(tmp_path):
    overrides = LOCAL_RUN + ["train.rounds=2", f"output.dir={tmp_path / 'runs'}", "output.name=same"]
    arguments = ["run", "--quiet", *[argument for override in overrides for argument in ("--set", override)]]
    results = [finished(process) for process in [fedray_cli(*arguments, cwd=tmp_path) for _ in range(2)]]
    assert sorted(result.returncode for result in results) == [0, 2], [result.stderr[-2000:] for result in results]
    assert_rejected(next(result for result in results if result.returncode == 2), "the run directory")
    assert len(list_checkpoints(tmp_path / "runs" / "same")) == 1
    assert [row["round"] for row in round_rows(tmp_path / "runs" / "same")] == [1, 2]


# --------------------------------------------------------------------- 10. an output.dir that cannot be created


def test_an_output_dir_that_cannot_be_created_is_one_line(tmp_path):
    result = fedray_command("run", "--quiet", "--set", "resources.num_workers=1", "--set", "output.dir=/proc/fedray-runs", cwd=tmp_path)
    assert_rejected(result, "output.dir: cannot create /proc/fedray-runs/")
