"""The targets of every task (``data.task``) from every kind of source: regression and multilabel tables
(CSV and Parquet written with pandas and pyarrow, a regression table made from scikit-learn's diabetes
study), arrays from a user's module, the built-in ``diabetes`` table; the output size and target
statistics in ``DatasetInfo``; partitions over the task's partition labels; missing values refused
by column name or dropped and counted; and each bad input as one line naming its key."""

from __future__ import annotations

import logging
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fedray.config import ConfigError, DataConfig
from fedray.data import build_federated_dataset, load_dataset
from fedray.tasks import Regression


def write_diabetes_csv(path: Path) -> pd.DataFrame:
    """scikit-learn's diabetes table as a CSV with a client column (three sites by age)."""
    from sklearn.datasets import load_diabetes

    frame = load_diabetes(as_frame=True).frame
    frame["site"] = np.select([frame["age"] < -0.03, frame["age"] < 0.03], ["young", "middle"], "old")
    frame.to_csv(path, index=False)
    return frame


def diabetes_config(path: Path, **overrides) -> DataConfig:
    settings = dict(
        name="table",
        path=str(path),
        task="regression",
        target_columns=["target"],
        client_column="site",
        partition="natural",
        num_clients=3,
        test_fraction=0.2,
    )
    return DataConfig(**{**settings, **overrides})


# ------------------------------------------------------------------------------------ regression
def test_a_regression_table_from_the_diabetes_study(tmp_path: Path) -> None:
    frame = write_diabetes_csv(tmp_path / "diabetes.csv")
    data = build_federated_dataset(diabetes_config(tmp_path / "diabetes.csv"), seed=0)
    assert data.train.y.dtype == np.float32 and data.train.y.shape == (len(data.train), 1)
    assert data.info.num_classes == 1 and data.info.modality == "features" and data.info.input_shape == (10,)
    assert len(data.train) + len(data.test) == len(frame) == 442
    # Every site is a client and tests on a fifth of its own rows.
    assert data.client_names == ("middle", "old", "young")
    sizes = frame["site"].value_counts().sort_index().to_numpy()
    np.testing.assert_array_equal(data.clients.sizes, sizes - np.rint(0.2 * sizes).astype(int))
    # The rows keep their targets: each training row's target is the target of the row with its features.
    by_features = {tuple(np.float32(row[:10])): np.float32(row[10]) for row in frame.drop(columns="site").to_numpy()}
    assert all(by_features[tuple(x)] == y for x, y in zip(data.train.x, data.train.y[:, 0]))
    # The target statistics are the training split's (not the test split's, nor all rows').
    assert data.info.target_mean == pytest.approx((float(data.train.y.mean(dtype=np.float64)),))
    assert data.info.target_std == pytest.approx((float(data.train.y.std(dtype=np.float64)),))
    assert data.info.target_mean != pytest.approx((float(frame["target"].mean()),), abs=1e-9)
    assert dict(data.info.columns) == {
        "client": ("site",),
        "targets": ("target",),
        "inputs": ("age", "sex", "bmi", "bp", "s1", "s2", "s3", "s4", "s5", "s6"),
    }
    assert data.task == "regression"


def test_regression_targets_from_several_columns_or_one_list_column(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x, first, second = rng.normal(size=12), rng.normal(size=12) * 10, rng.normal(size=12) + 5
    pq.write_table(pa.table({"x": x, "a": first, "b": second}), tmp_path / "columns.parquet")
    pq.write_table(pa.table({"x": x, "ab": [[p, q] for p, q in zip(first, second)]}), tmp_path / "list.parquet")
    common = dict(name="table", task="regression", partition="iid", num_clients=2, test_fraction=0.25)
    by_columns = load_dataset(DataConfig(path=str(tmp_path / "columns.parquet"), target_columns=["a", "b"], **common), seed=0)
    by_list = load_dataset(DataConfig(path=str(tmp_path / "list.parquet"), target_columns=["ab"], **common), seed=0)
    for train, test, info in (by_columns, by_list):
        assert info.num_classes == 2 and train.y.shape == (9, 2) and test.y.shape == (3, 2) and train.y.dtype == np.float32
        assert info.input_shape == (1,)  # x only: the targets are not features
        np.testing.assert_allclose(info.target_mean, train.y.mean(axis=0, dtype=np.float64))
    np.testing.assert_array_equal(by_columns[0].y, by_list[0].y)
    np.testing.assert_allclose(np.sort(np.concatenate([by_columns[0].y, by_columns[1].y])[:, 1]), np.sort(second.astype(np.float32)))
    # A float label column is a regression target with data.task=regression and no target_columns.
    train, _, info = load_dataset(DataConfig(path=str(tmp_path / "columns.parquet"), label_column="a", **common), seed=0)
    assert info.num_classes == 1 and train.y.shape == (9, 1) and info.input_shape == (2,)


def test_the_built_in_diabetes_table_is_a_regression() -> None:
    # "diabetes" is served by the loaders; the config schema's list of names is another module's.
    cfg = DataConfig(task="regression", partition="iid", num_clients=4).model_copy(update={"name": "diabetes"})
    data = build_federated_dataset(cfg, seed=0)
    assert (len(data.train), len(data.test)) == (354, 88) and data.train.y.shape == (354, 1)
    assert data.info.num_classes == 1 and data.info.input_shape == (10,) and 140 < data.info.target_mean[0] < 160
    with pytest.raises(ConfigError, match="data.task: data.name=diabetes has regression targets, not the targets of classification"):
        load_dataset(cfg.model_copy(update={"task": "classification"}), seed=0)


def test_label_skew_partitions_skew_a_regression_over_target_deciles(tmp_path: Path) -> None:
    write_diabetes_csv(tmp_path / "diabetes.csv")
    cfg = diabetes_config(tmp_path / "diabetes.csv", client_column=None, partition="dirichlet", num_clients=6, alpha=0.1)
    data = build_federated_dataset(cfg, seed=0)
    deciles = Regression.partition_labels(data.train.y)
    distribution = data.label_distribution()
    assert distribution.shape == (6, 10) and distribution.sum() == len(data.train)
    for k in range(6):
        np.testing.assert_array_equal(distribution[k], np.bincount(deciles[data.clients.client(k)], minlength=10))
    # α = 0.1 concentrates each client on a few deciles: far from the near-uniform iid split.
    iid = build_federated_dataset(cfg.model_copy(update={"partition": "iid"}), seed=0).label_distribution()
    assert (distribution.max(axis=1) / distribution.sum(axis=1)).mean() > 2 * (iid.max(axis=1) / iid.sum(axis=1)).mean()


# ------------------------------------------------------------------------------------ multilabel
def test_multilabel_targets_from_0_1_columns_or_one_list_column(tmp_path: Path) -> None:
    labels = np.array([[1, 0, 1], [0, 0, 1], [1, 1, 0], [0, 1, 0], [1, 0, 0], [0, 0, 0]], dtype=np.int64)
    frame = pd.DataFrame({"f": np.arange(6.0), "cat": labels[:, 0], "dog": labels[:, 1], "bird": labels[:, 2]})
    frame.to_csv(tmp_path / "columns.csv", index=False)
    pq.write_table(pa.table({"f": np.arange(6.0), "tags": labels.tolist()}), tmp_path / "list.parquet")
    common = dict(name="table", task="multilabel", partition="iid", num_clients=2, test_fraction=0.5)
    columns = load_dataset(DataConfig(path=str(tmp_path / "columns.csv"), target_columns=["cat", "dog", "bird"], **common), seed=0)
    listed = load_dataset(DataConfig(path=str(tmp_path / "list.parquet"), target_columns=["tags"], **common), seed=0)
    for train, test, info in (columns, listed):
        assert info.num_classes == 3 and train.y.dtype == np.float32 and train.y.shape == (3, 3)
        assert info.target_mean == () and info.input_shape == (1,)
        np.testing.assert_array_equal(np.concatenate([train.y, test.y])[np.argsort(np.concatenate([train.x, test.x])[:, 0])], labels)
    data = build_federated_dataset(DataConfig(path=str(tmp_path / "list.parquet"), target_columns=["tags"], **common), seed=0)
    assert data.label_distribution() is None  # multilabel targets have no partition labels
    with pytest.raises(
        ConfigError, match="data.partition: shards skews labels, and multilabel targets have none; use data.partition=natural"
    ):
        build_federated_dataset(
            DataConfig(path=str(tmp_path / "list.parquet"), target_columns=["tags"], **{**common, "partition": "shards"}), 0
        )
    frame.assign(dog=[0, 2, 1, 0, 1, 0]).to_csv(tmp_path / "bad.csv", index=False)
    # (fedray.tasks writes the value with repr: "np.int64(2)" under numpy 2)
    with pytest.raises(
        ConfigError, match=r"data.target_columns: .*bad.csv: multilabel targets must be 0 or 1, got (np.int64\()?2\)? in row 1"
    ):
        load_dataset(DataConfig(path=str(tmp_path / "bad.csv"), target_columns=["cat", "dog", "bird"], **common), seed=0)


# ------------------------------------------------------------------------------ classification
def test_classification_labels_are_loaded_as_before(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text("a,b,label\n1,2,0\n3,4,2\n5,6,1\n7,8,2\n")
    train, test, info = load_dataset(DataConfig(name="table", path=str(tmp_path / "t.csv"), test_fraction=0.25, num_clients=1), seed=0)
    assert train.y.dtype == np.int64 and train.y.ndim == 1 and info.num_classes == 3
    assert info.target_mean == () and dict(info.columns) == {"targets": ("label",), "inputs": ("a", "b")}
    digits = build_federated_dataset(DataConfig(num_clients=10), seed=0)
    assert digits.train.y.dtype == np.int64 and digits.label_distribution().shape == (10, 10)


def test_a_stray_huge_label_is_refused_with_its_row(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text("a,label\n1,0\n2,1\n3,1000000000000\n4,1\n")
    cfg = DataConfig(name="table", path=str(tmp_path / "t.csv"), test_path=str(tmp_path / "t.csv"), num_clients=2, partition="dirichlet")
    with pytest.raises(ConfigError, match=r"y_train: label 1000000000000 in row 2 would make 1,000,000,000,001 classes; more than 100,000"):
        build_federated_dataset(cfg, seed=0)


USER_MODULE = textwrap.dedent("""
    import numpy as np
    import torch
    from torch.utils.data import TensorDataset

    from fedray.data import UserData


    def regression_arrays():
        rng = np.random.default_rng(0)
        x = rng.normal(size=(40, 3))
        return UserData(x, x @ np.array([1.0, -2.0, 0.5]) + 3.0, client_ids_train=np.arange(40) % 4)


    def regression_torch():
        x = torch.arange(30, dtype=torch.float32).view(10, 3)
        return TensorDataset(x, x[:, :2] * 0.5), None


    def huge_labels_with_a_count():
        return UserData(np.zeros((4, 2)), np.array([0, 1, 150_000, 2]), num_classes=200_000)
""")


def test_user_modules_give_regression_targets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "task_data.py").write_text(USER_MODULE)
    monkeypatch.chdir(tmp_path)
    data = build_federated_dataset(DataConfig(name="task_data:regression_arrays", task="regression", partition="natural", num_clients=4), 0)
    assert data.train.y.shape == (32, 1) and data.info.num_classes == 1 and data.train.y.dtype == np.float32
    np.testing.assert_allclose(data.train.y[:, 0], data.train.x @ np.array([1.0, -2.0, 0.5], dtype=np.float32) + 3.0, rtol=1e-5)
    train, test, info = load_dataset(DataConfig(name="task_data:regression_torch", task="regression", num_clients=2), seed=0)
    assert info.num_classes == 2 and train.y.shape == (8, 2)
    np.testing.assert_allclose(train.y, train.x[:, :2] * 0.5)
    # A classification of float targets says that regression exists.
    with pytest.raises(
        ConfigError, match=r"y_train: labels must be integers, got float64 \(float targets are a regression: set data.task=regression\)"
    ):
        load_dataset(DataConfig(name="task_data:regression_arrays", num_clients=2), seed=0)
    # An explicit class count allows labels beyond the implied bound.
    train, _, info = load_dataset(DataConfig(name="task_data:huge_labels_with_a_count", num_clients=1, partition="iid"), seed=0)
    assert info.num_classes == 200_000


# ------------------------------------------------------------------------------- missing values
def test_missing_values_are_refused_by_column_name_or_dropped_and_counted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    frame = write_diabetes_csv(tmp_path / "diabetes.csv")
    holey = frame.copy()
    holey.loc[[5, 17], "bmi"] = np.nan
    holey.loc[[17, 30, 31], "target"] = np.nan
    holey.to_csv(tmp_path / "holey.csv", index=False)
    cfg = diabetes_config(tmp_path / "holey.csv")
    with pytest.raises(
        ConfigError,
        match=r"data.target_columns: column 'target' of .*holey.csv has 3 missing value\(s\) \(null or NaN\), the first in row 17",
    ):
        build_federated_dataset(cfg, seed=0)
    with pytest.raises(
        ConfigError, match=r"data.feature_columns: column 'bmi' of .*holey.csv has 2 missing value\(s\) .* the first in row 5"
    ):
        build_federated_dataset(cfg.model_copy(update={"target_columns": ["s6"]}), seed=0)
    with caplog.at_level(logging.WARNING, logger="fedray.data.formats"):
        data = build_federated_dataset(cfg.model_copy(update={"missing": "drop"}), seed=0)
    assert len(data.train) + len(data.test) == 442 - 4  # rows 5, 17, 30 and 31
    assert "dropped 4 of 442 rows" in caplog.text and "2 in 'bmi'" in caplog.text and "3 in 'target'" in caplog.text
    assert not np.isnan(data.train.x).any() and not np.isnan(data.train.y).any()
    kept = frame.drop(index=[5, 17, 30, 31])
    assert sorted(np.concatenate([data.train.y, data.test.y])[:, 0].tolist()) == sorted(kept["target"].astype(np.float32).tolist())
    # A column the run does not read may miss values.
    frame.assign(note=[None] * 441 + ["x"]).to_csv(tmp_path / "notes.csv", index=False)
    assert len(build_federated_dataset(diabetes_config(tmp_path / "notes.csv", feature_columns=["bmi"]), seed=0).train) == 354


def test_missing_values_in_list_columns_and_client_ids(tmp_path: Path) -> None:
    pq.write_table(
        pa.table({"f": [1.0, 2.0, 3.0, 4.0], "y": [[0.5, 1.0], [1.0, None], [2.0, float("nan")], [0.0, 0.0]], "who": ["a", "b", "a", "b"]}),
        tmp_path / "t.parquet",
    )
    cfg = DataConfig(
        name="table", path=str(tmp_path / "t.parquet"), task="regression", target_columns=["y"], num_clients=1, partition="iid"
    )
    with pytest.raises(ConfigError, match=r"column 'y' of .* has 2 missing value\(s\) \(null or NaN\), the first in row 1"):
        load_dataset(cfg, seed=0)
    train, test, _ = load_dataset(cfg.model_copy(update={"missing": "drop", "test_fraction": 0.5}), seed=0)
    np.testing.assert_array_equal(np.sort(np.concatenate([train.x, test.x])[:, 0]), [1.0, 4.0])
    pq.write_table(pa.table({"f": [1.0, 2.0, 3.0], "label": [0, 1, 0], "who": ["a", None, "b"]}), tmp_path / "c.parquet")
    with pytest.raises(
        ConfigError, match=r"data.client_column: column 'who' of .* has 1 missing value\(s\) \(null or NaN\), the first in row 1"
    ):
        load_dataset(DataConfig(name="table", path=str(tmp_path / "c.parquet"), client_column="who", num_clients=2), seed=0)


# ----------------------------------------------------------------------------------- bad inputs
@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"name": "digits", "task": "regression"}, "data.task: data.name=digits has class labels, not the targets of regression"),
        ({"name": "wine", "task": "multilabel"}, "data.task: data.name=wine has class labels, not the targets of multilabel"),
        ({"name": "digits", "stride": 4}, "data.stride: is the step between a language model's windows; data.task=classification has none"),
        (
            {"name": "digits", "missing": "drop"},
            "data.missing: applies to the columns of a table (data.name=table), not to data.name=digits",
        ),
        ({"name": "wine", "target_columns": ["a"]}, "data.target_columns: applies to the columns of a table"),
        ({"name": "digits", "tokenizer": "tok"}, "data.tokenizer: turns text into tokens; data.name=digits has no text"),
        ({"target_columns": ["a", "b"]}, "data.target_columns: data.task=classification reads one label per row from data.label_column"),
        ({"task": "regression", "target_columns": ["a", "note"]}, "data.target_columns: column 'note' of t.csv holds string, not numbers"),
        ({"task": "regression", "target_columns": ["nope"]}, "data.target_columns: no column 'nope' in t.csv (columns: a, b, note, label)"),
        ({"task": "language_modeling", "seq_len": 4}, "data.sequence_column: data.task=language_modeling learns the text or token column"),
        ({"tokenizer": "tok"}, "data.tokenizer: a tokenizer turns the text of data.sequence_column into tokens; set data.sequence_column"),
    ],
    ids=lambda value: value if isinstance(value, str) else "-".join(f"{k}={v}" for k, v in value.items()),
)
def test_each_misfit_of_task_and_data_is_one_line_naming_its_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, overrides: dict, expected: str
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("t.csv").write_text("a,b,note,label\n1.5,2,x,0\n3.5,4,y,1\n")
    cfg = DataConfig(**{"name": "table", "path": "t.csv", "num_clients": 1, "partition": "iid", **overrides})
    with pytest.raises(ConfigError) as error:
        build_federated_dataset(cfg, seed=0)
    assert expected in str(error.value) and "\n" not in str(error.value)
