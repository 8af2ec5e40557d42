"""Metric writing over long runs (no Ray): few part files however long the checkpoint interval, a
bounded number of rows held in the driver, and parts concatenated with their columns unified; reading
the metrics of a path that is no directory is an error."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fedray import load_config
from fedray.tracking import MetricsParquet, RunContext, read_metrics
from fedray.tracking.metrics_file import (
    MAX_UNWRITTEN_ROWS,
    MERGED_PARTS,
    METRICS_FILE,
    PARTS_DIR,
    concatenate_atomically,
    list_parts,
    read_metrics_table,
)


def _run(tmp_path: Path, rounds: int, checkpoint_every: int) -> RunContext:
    config = load_config(None, [f"train.rounds={rounds}", f"checkpoint.every={checkpoint_every}"])
    return RunContext(config=config, run_dir=tmp_path, data=None, server=None, start_round=0)


def _round_end(metrics: MetricsParquet, run: RunContext, round: int, clients: int = 3) -> None:
    row = {"round": round, "train_loss": 1 / round, **({"test_accuracy": round / 1000} if round % 10 == 0 else {})}
    metrics.on_round_end(run, row, [{"client_id": c, "train_loss": c / 10} for c in range(clients)])


def test_parts_between_checkpoints_are_merged_so_files_stay_few(tmp_path):
    rounds = 3 * MERGED_PARTS + 5
    run = _run(tmp_path, rounds, checkpoint_every=10_000)
    metrics = MetricsParquet(min_interval=0.0)  # a part every round
    metrics.on_run_start(run)
    for round in range(1, rounds):
        _round_end(metrics, run, round)
    spans = [(first, last) for first, last, _ in list_parts(tmp_path)]
    merged = [(k * MERGED_PARTS + 1, (k + 1) * MERGED_PARTS) for k in range(3)]
    assert spans == merged + [(r, r) for r in range(3 * MERGED_PARTS + 1, rounds)]
    assert metrics.unwritten == []  # every row is in a part: the driver holds none
    assert [r["round"] for r in read_metrics(tmp_path)] == list(range(1, rounds))
    _round_end(metrics, run, rounds)  # the last round closes the segment: one part
    assert [(first, last) for first, last, _ in list_parts(tmp_path)] == [(1, rounds)]
    metrics.on_run_end(run)
    assert not (tmp_path / PARTS_DIR).exists()
    table = pq.read_table(tmp_path / METRICS_FILE)
    assert table.num_rows == rounds * 4
    assert table["round"].to_pylist() == [r for r in range(1, rounds + 1) for _ in range(4)]
    assert table.schema.field("test_accuracy").type == pa.float64()  # null in most parts, typed in the file


def test_a_part_is_written_once_the_unwritten_rows_pass_the_limit(tmp_path):
    run = _run(tmp_path, rounds=10, checkpoint_every=10)
    metrics = MetricsParquet(min_interval=1e9)  # the interval alone would wait for the checkpoint
    metrics.on_run_start(run)
    _round_end(metrics, run, 1, clients=10)
    assert list_parts(tmp_path) == [] and len(metrics.unwritten) == 11
    _round_end(metrics, run, 2, clients=MAX_UNWRITTEN_ROWS)
    assert [(first, last) for first, last, _ in list_parts(tmp_path)] == [(1, 2)]
    assert metrics.unwritten == []
    assert read_metrics_table(tmp_path).num_rows == 11 + MAX_UNWRITTEN_ROWS + 1


def test_concatenation_unifies_columns_and_keeps_the_row_order(tmp_path):
    first, second = tmp_path / "a.parquet", tmp_path / "b.parquet"
    pq.write_table(pa.table({"round": [1, 1], "loss": [None, None], "count": [1, 2]}), first)
    pq.write_table(pa.table({"round": [2], "loss": [0.5], "extra": ["x"]}), second)
    tail = pa.table({"count": [2.5], "round": [3]})
    concatenate_atomically([first, second], tmp_path / "all.parquet", tail)
    table = pq.read_table(tmp_path / "all.parquet")
    assert table.column_names == ["round", "loss", "count", "extra"]
    assert table.schema.field("count").type == pa.float64()
    assert table.to_pylist() == [
        {"round": 1, "loss": None, "count": 1.0, "extra": None},
        {"round": 1, "loss": None, "count": 2.0, "extra": None},
        {"round": 2, "loss": 0.5, "count": None, "extra": "x"},
        {"round": 3, "loss": None, "count": 2.5, "extra": None},
    ]
    assert table.equals(pa.concat_tables([pq.read_table(first), pq.read_table(second), tail], promote_options="permissive"))


def test_parts_of_many_checkpoint_intervals_are_merged(tmp_path):
    run = _run(tmp_path, rounds=1000, checkpoint_every=1)  # a part per round, each closing its interval
    metrics = MetricsParquet(min_interval=1e9)
    metrics.on_run_start(run)
    for round in range(1, 2 * MERGED_PARTS + 3):
        _round_end(metrics, run, round)
    spans = [(first, last) for first, last, _ in list_parts(tmp_path)]
    assert spans == [(1, MERGED_PARTS), (MERGED_PARTS + 1, 2 * MERGED_PARTS), (2 * MERGED_PARTS + 1,) * 2, (2 * MERGED_PARTS + 2,) * 2]
    assert [r["round"] for r in read_metrics(tmp_path)] == list(range(1, 2 * MERGED_PARTS + 3))
    assert len(read_metrics(tmp_path, scope="client")) == 3 * (2 * MERGED_PARTS + 2)


def test_reading_the_metrics_of_a_path_that_is_no_directory_is_an_error_not_an_empty_run(tmp_path):
    """fedray.read_metrics("runs/mistyped") must not read as a run without rounds."""
    import fedray

    with pytest.raises(FileNotFoundError, match=f"^{tmp_path / 'mistyped'} is not a run directory: it does not exist$"):
        fedray.read_metrics(tmp_path / "mistyped")
    (tmp_path / "summary.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="summary.json is not a run directory: it is a file$"):
        fedray.read_metrics(tmp_path / "summary.json")
    assert fedray.read_metrics(tmp_path) == []  # a run directory before its first round
