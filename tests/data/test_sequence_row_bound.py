"""A table's sequence column without ``data.seq_len`` is padded to its longest row: one outlying row
(200,000 tokens among rows of a few) must not pad every row to its length. Past a bound it is an
error naming the row and its length; ``data.seq_len`` decides instead when it is set."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fedray.config import ConfigError, DataConfig
from fedray.data import load_dataset


def write_rows(path: Path, rows: list[list[int]]) -> None:
    pq.write_table(pa.table({"seq": rows, "label": [index % 2 for index in range(len(rows))]}), path)


def test_one_huge_row_is_refused_without_seq_len_naming_it(tmp_path):
    path = tmp_path / "ids.parquet"
    write_rows(path, [[5, 6], [7] * 200_000, [8, 9, 9], [4]])
    cfg = DataConfig(name="table", path=str(path), sequence_column="seq", num_clients=1, test_fraction=0.25)
    with pytest.raises(ConfigError) as error:
        load_dataset(cfg, seed=0)
    message = str(error.value)
    assert message.startswith("data.seq_len: not set, and row 1 of ")
    assert f"{path} has 200000 tokens" in message and "set data.seq_len" in message and "\n" not in message


def test_with_seq_len_the_huge_row_is_an_error_of_seq_len_and_short_rows_pad_to_it(tmp_path):
    path = tmp_path / "ids.parquet"
    write_rows(path, [[5, 6], [7] * 200_000, [8, 9, 9], [4]])
    cfg = DataConfig(name="table", path=str(path), sequence_column="seq", seq_len=8, num_clients=1, test_fraction=0.25)
    with pytest.raises(ConfigError, match=r"row 1 of .* has 200000 tokens, more than data.seq_len=8"):
        load_dataset(cfg, seed=0)
    write_rows(path, [[5, 6], [7] * 5000, [8, 9, 9], [4]])  # long rows are fine once seq_len says how long
    cfg = DataConfig(name="table", path=str(path), sequence_column="seq", seq_len=5000, num_clients=1, test_fraction=0.25)
    train, test, info = load_dataset(cfg, seed=0)
    assert info.seq_len == 5000 and np.concatenate([train.x, test.x]).shape == (4, 5000)


def test_rows_up_to_the_bound_still_pad_to_the_longest(tmp_path):
    path = tmp_path / "ids.parquet"
    write_rows(path, [[5, 6], [7] * 4096, [8, 9, 9], [4]])
    cfg = DataConfig(name="table", path=str(path), sequence_column="seq", num_clients=1, test_fraction=0.25)
    train, test, info = load_dataset(cfg, seed=0)
    assert info.seq_len == 4096 and np.concatenate([train.x, test.x]).shape == (4, 4096)
