"""Your own data without and with code: image folders (PNG files written with Pillow), Parquet and
CSV tables (written with pyarrow), the decoded-image cache, the natural partition, a user data module,
and every bad input as the real CLI reports it (exit 2, one line, nothing written)."""

from __future__ import annotations

import io
import os
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from fedray.config import ConfigError, DataConfig
from fedray.data import build_federated_dataset, load_dataset

from preloaded_cli import run_fedray_preloaded
from test_bad_inputs import assert_rejected, create_files, tree


def colour_image(label: int, index: int, size: int = 6, mode: str = "RGB") -> Image.Image:
    """A small image whose pixels encode its label and index, so that arrays can be checked exactly."""
    colour = (40 * label, 10 * index, 200) if mode == "RGB" else 40 * label + index
    return Image.new(mode, (size, size), colour)


def png_bytes(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def write_image_folder(root: Path, counts: dict[str, int], mode: str = "RGB", size: int = 6) -> None:
    for label, (class_name, count) in enumerate(sorted(counts.items())):
        (root / class_name).mkdir(parents=True, exist_ok=True)
        for index in range(count):
            colour_image(label, index, size, mode).save(root / class_name / f"{index}.png")


# --------------------------------------------------------------------------------- image folders
def test_image_folder_with_train_and_test_subfolders(tmp_path: Path) -> None:
    write_image_folder(tmp_path / "pics" / "train", {"cat": 3, "dog": 2})
    write_image_folder(tmp_path / "pics" / "test", {"cat": 1, "dog": 1})
    (tmp_path / "pics" / "train" / "cat" / "notes.txt").write_text("not an image, skipped")
    cfg = DataConfig(name="imagefolder", path=str(tmp_path / "pics"), root=str(tmp_path / "data"), num_clients=2)
    train, test, info = load_dataset(cfg, seed=0)
    assert train.x.shape == (5, 3, 6, 6) and train.x.dtype == np.uint8 and test.x.shape == (2, 3, 6, 6)
    np.testing.assert_array_equal(train.y, [0, 0, 0, 1, 1])
    np.testing.assert_array_equal(test.y, [0, 1])
    np.testing.assert_array_equal(train.x[4, :, 0, 0], [40, 10, 200])  # dog/1.png
    assert (info.modality, info.channels, info.image_size, info.num_classes) == ("image", 3, 6, 2)


def test_image_folder_one_tree_is_split_by_test_fraction_and_resized(tmp_path: Path) -> None:
    write_image_folder(tmp_path / "pics", {"a": 5, "b": 5}, mode="L", size=10)
    cfg = DataConfig(
        name="imagefolder", path=str(tmp_path / "pics"), root=str(tmp_path / "data"), image_size=4, test_fraction=0.2, num_clients=2
    )
    train, test, info = load_dataset(cfg, seed=0)
    assert train.x.shape == (8, 1, 4, 4) and test.x.shape == (2, 1, 4, 4)
    assert info.channels == 1 and info.input_shape == (1, 4, 4)
    assert sorted(np.concatenate([train.y, test.y]).tolist()) == [0] * 5 + [1] * 5
    again_train, again_test, _ = load_dataset(cfg, seed=0)
    np.testing.assert_array_equal(again_test.y, test.y)  # seeded
    np.testing.assert_array_equal(again_train.x, train.x)


def test_image_folder_links_to_folders_are_left_out(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pets = tmp_path / "pets"
    write_image_folder(pets, {"a": 2, "b": 3})
    (pets / "a" / "nested").mkdir()
    colour_image(0, 9).save(pets / "a" / "nested" / "deep.png")  # a real subfolder is read
    os.symlink("..", pets / "a" / "loop")  # a cycle: torchvision walks it ~40 levels deep
    os.symlink("../a", pets / "b" / "sibling")  # would read a's images again as b's
    outside = tmp_path / "elsewhere" / "c"
    write_image_folder(outside.parent, {"c": 1})
    os.symlink(outside, pets / "c")  # a class folder that is a link elsewhere is a class
    os.symlink(".", pets / "everything")  # a class folder that is a link to the tree itself is not
    cfg = DataConfig(name="imagefolder", path=str(pets), root=str(tmp_path / "data"), test_fraction=0.2, num_clients=2)
    with caplog.at_level("WARNING", logger="fedray.data.formats"):
        train, test, info = load_dataset(cfg, seed=0)
    assert len(train) + len(test) == 2 + 1 + 3 + 1
    assert sorted(np.concatenate([train.y, test.y]).tolist()) == [0, 0, 0, 1, 1, 1, 2]
    assert info.num_classes == 4  # a, b, c and the folder "everything", which holds nothing read
    assert "left out 3 link(s) to folders" in caplog.text and "loop -> .." in caplog.text and "sibling -> ../a" in caplog.text


def test_decoded_images_are_cached_and_the_second_load_does_not_decode(tmp_path: Path) -> None:
    write_image_folder(tmp_path / "pics", {"a": 4, "b": 4})
    cfg = DataConfig(name="imagefolder", path=str(tmp_path / "pics"), root=str(tmp_path / "data"), num_clients=2)
    first = load_dataset(cfg, seed=0)
    cached = list((tmp_path / "data" / "cache").glob("imagefolder-*.npz"))
    assert len(cached) == 1
    # Break one image but keep its size and modification time: the cache key is unchanged, so only a
    # load that decodes again would notice.
    victim = tmp_path / "pics" / "a" / "0.png"
    stat = victim.stat()
    victim.write_bytes(b"\0" * stat.st_size)
    os.utime(victim, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    second = load_dataset(cfg, seed=0)
    np.testing.assert_array_equal(second[0].x, first[0].x)
    np.testing.assert_array_equal(second[1].y, first[1].y)
    # A real change to a source file (new mtime) makes a new cache entry, which decodes, and fails.
    victim.touch()
    with pytest.raises(ConfigError, match="cannot read the image .*0.png"):
        load_dataset(cfg, seed=0)


# ---------------------------------------------------------------------------------------- tables
def test_parquet_features_with_client_ids_and_natural_partition(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    writers = np.repeat(["ann", "bob", "cyd"], [6, 10, 4])
    table = pa.table(
        {
            "f1": rng.normal(size=20),
            "f2": rng.integers(0, 5, 20),
            "note": ["x"] * 20,
            "label": rng.integers(0, 3, 20),
            "writer": writers,
        }
    )
    pq.write_table(table, tmp_path / "t.parquet")
    cfg = DataConfig(
        name="table", path=str(tmp_path / "t.parquet"), client_column="writer", partition="natural", num_clients=3, test_fraction=0.25
    )
    data = build_federated_dataset(cfg, seed=0)
    assert data.info.modality == "features" and data.info.input_shape == (2,)  # the numeric columns f1, f2
    assert data.client_names == ("ann", "bob", "cyd")
    # Every client keeps its own rows only, and a quarter of each client's rows went to the test set.
    for k, name in enumerate(data.client_names):
        assert set(data.train.client_ids[data.clients.client(k)]) == {name}
    np.testing.assert_array_equal(data.clients.sizes, [6 - 2, 10 - 2, 4 - 1])
    assert len(data.test) == 5
    # Features are standardised with the training set's statistics.
    np.testing.assert_allclose(data.info.mean, data.train.x.mean(axis=0), rtol=1e-6)
    with pytest.raises(ConfigError, match=r"data.num_clients=3"):
        build_federated_dataset(cfg.model_copy(update={"num_clients": 4}), seed=0)


def test_csv_features_by_name_and_a_test_file(tmp_path: Path) -> None:
    (tmp_path / "train.csv").write_text("a,b,c,y\n1,2,3,0\n4,5,6,1\n7,8,9,1\n")
    (tmp_path / "test.csv").write_text("a,b,c,y\n0,0,1,0\n")
    cfg = DataConfig(
        name="table",
        path=str(tmp_path / "train.csv"),
        test_path=str(tmp_path / "test.csv"),
        label_column="y",
        feature_columns=["c", "a"],
        num_clients=1,
    )
    train, test, info = load_dataset(cfg, seed=0)
    np.testing.assert_array_equal(train.x, np.array([[3, 1], [6, 4], [9, 7]], dtype=np.float32))
    np.testing.assert_array_equal(test.x, [[1, 0]])
    assert train.x.dtype == np.float32 and info.num_classes == 2


def test_parquet_image_column_is_decoded_and_cached(tmp_path: Path) -> None:
    images = [png_bytes(colour_image(label, i, size=5)) for i, label in enumerate([0, 1, 1, 0, 2, 2])]
    pq.write_table(pa.table({"image": images, "label": [0, 1, 1, 0, 2, 2]}), tmp_path / "img.parquet")
    cfg = DataConfig(
        name="table", path=str(tmp_path / "img.parquet"), image_column="image", root=str(tmp_path / "data"), num_clients=2, partition="iid"
    )
    train, test, info = load_dataset(cfg, seed=0)
    assert train.x.shape == (5, 3, 5, 5) and len(test) == 1 and info.num_classes == 3
    all_x = np.concatenate([train.x, test.x])
    assert sorted(all_x[:, 1, 0, 0].tolist()) == [0, 10, 20, 30, 40, 50]  # every row's index colour once
    assert len(list((tmp_path / "data" / "cache").glob("table-images-*.npz"))) == 1


def test_parquet_pixel_arrays_load_as_they_are(tmp_path: Path) -> None:
    """Images stored as pixel values: flat rows with data.image_size, [H, W] and [C, H, W] nested lists,
    and fixed-size binary rows of raw bytes."""
    x = (np.arange(6 * 3 * 4 * 4) % 251).astype(np.uint8).reshape(6, 3, 4, 4)
    labels = [0, 1, 2, 0, 1, 2]
    layouts = {
        "flat": ([row.reshape(-1).tolist() for row in x], {"image_size": 4}, x),
        "hw": ([row[0].tolist() for row in x], {}, x[:, :1]),
        "chw": ([row.tolist() for row in x], {}, x),
        "bytes": (pa.FixedSizeBinaryArray.from_buffers(pa.binary(48), 6, [None, pa.py_buffer(x.tobytes())]), {"image_size": 4}, x),
    }
    for name, (column, keys, expected) in layouts.items():
        pq.write_table(pa.table({"pixels": column, "label": labels}), tmp_path / f"{name}.parquet")
        cfg = DataConfig(
            name="table",
            path=str(tmp_path / f"{name}.parquet"),
            image_column="pixels",
            test_fraction=0.5,
            num_clients=1,
            partition="iid",
            root=str(tmp_path / "data"),
            **keys,
        )
        train, test, info = load_dataset(cfg, seed=0)
        loaded = np.concatenate([train.x, test.x])
        order = np.argsort(loaded[:, 0, 0, 0])
        assert np.array_equal(loaded[order], expected[np.argsort(expected[:, 0, 0, 0])]), name
        assert info.modality == "image" and info.channels == expected.shape[1]
    assert not (tmp_path / "data" / "cache").exists()  # nothing to decode, nothing cached
    with pytest.raises(ConfigError, match="set data.image_size to their square side"):
        load_dataset(
            DataConfig(name="table", path=str(tmp_path / "flat.parquet"), image_column="pixels", num_clients=1, partition="iid"), seed=0
        )
    pq.write_table(pa.table({"pixels": [[0, 300, 2, 3]] * 4, "label": [0, 1, 0, 1]}), tmp_path / "bad.parquet")
    with pytest.raises(ConfigError, match="pixel values from 0 to 300; they must be 0..255"):
        load_dataset(
            DataConfig(
                name="table", path=str(tmp_path / "bad.parquet"), image_column="pixels", image_size=2, num_clients=1, partition="iid"
            ),
            seed=0,
        )


def test_a_hugging_face_dataset_saved_to_disk_reads_as_a_table(tmp_path: Path) -> None:
    """A ``DatasetDict`` saved with ``save_to_disk``: its Image feature decoded, its ClassLabel as labels,
    a client column for the natural partition; shuffled first, so its indices mapping must apply."""
    datasets = pytest.importorskip("datasets")
    labels = [0, 1, 1, 0, 2, 2, 1, 0]
    features = datasets.Features(
        {"image": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b", "c"]), "site": datasets.Value("string")}
    )
    train = datasets.Dataset.from_dict(
        {
            "image": [colour_image(label, i, size=5) for i, label in enumerate(labels)],
            "label": labels,
            "site": [f"site-{i % 2}" for i in range(len(labels))],
        },
        features=features,
    ).shuffle(seed=1)
    test = datasets.Dataset.from_dict({"image": [colour_image(2, 9, size=5)], "label": [2], "site": ["site-0"]}, features=features)
    datasets.DatasetDict({"train": train, "test": test}).save_to_disk(str(tmp_path / "saved"))
    cfg = DataConfig(
        name="table",
        path=str(tmp_path / "saved"),
        image_column="image",
        client_column="site",
        partition="natural",
        num_clients=2,
        root=str(tmp_path / "data"),
    )
    data = build_federated_dataset(cfg, seed=0)
    assert data.train.x.shape == (8, 3, 5, 5) and data.test.x.shape == (1, 3, 5, 5)
    # each row's image still carries its own label and index after the shuffle
    assert sorted(zip(data.train.x[:, 1, 0, 0].tolist(), data.train.y.tolist())) == sorted(
        (10 * i, label) for i, label in enumerate(labels)
    )
    assert data.test.y.tolist() == [2] and data.client_names == ("site-0", "site-1")
    assert sorted(data.clients.sizes.tolist()) == [4, 4]
    single = tmp_path / "single"
    datasets.Dataset.from_dict({"x1": [0.5, 1.5, 2.5, 3.5], "x2": [1.0, 0.0, 1.0, 0.0], "label": [0, 1, 0, 1]}).save_to_disk(str(single))
    train_x, _, info = load_dataset(DataConfig(name="table", path=str(single), test_fraction=0.25, num_clients=1, partition="iid"), seed=0)
    assert info.modality == "features" and train_x.x.shape == (3, 2)


def test_parquet_token_lists_and_text_sequences(tmp_path: Path) -> None:
    pq.write_table(pa.table({"seq": [[5, 6, 7], [8], [9, 9]], "label": [0, 1, 0]}), tmp_path / "ids.parquet")
    cfg = DataConfig(name="table", path=str(tmp_path / "ids.parquet"), sequence_column="seq", num_clients=1, test_fraction=0.34)
    train, test, info = load_dataset(cfg, seed=0)
    rows = {tuple(row) for row in np.concatenate([train.x, test.x]).tolist()}
    assert rows == {(5, 6, 7), (0, 0, 8), (0, 9, 9)}  # left-padded with 0 to the longest
    assert (info.modality, info.seq_len, info.vocab_size) == ("tokens", 3, 10)

    pq.write_table(pa.table({"text": ["ab", "ba!", "a"], "label": [1, 0, 1]}), tmp_path / "text.parquet")
    (tmp_path / "text_test.csv").write_text("text,label\nbz,0\n")
    cfg = DataConfig(
        name="table",
        path=str(tmp_path / "text.parquet"),
        test_path=str(tmp_path / "text_test.csv"),
        sequence_column="text",
        seq_len=4,
        num_clients=1,
    )
    train, test, info = load_dataset(cfg, seed=0)
    # Vocabulary: 0 padding, 1 unknown, then "!", "a", "b" → 2, 3, 4.
    np.testing.assert_array_equal(train.x, [[0, 0, 3, 4], [0, 4, 3, 2], [0, 0, 0, 3]])
    np.testing.assert_array_equal(test.x, [[0, 0, 4, 1]])  # "z" is not in the training vocabulary
    assert info.vocab_size == 5 and info.input_shape == (4,)


# ---------------------------------------------------------------------------- data from code
USER_MODULE = textwrap.dedent("""
    import numpy as np
    import torch
    from torch.utils.data import TensorDataset

    from fedray.data import UserData


    def arrays():
        rng = np.random.default_rng(0)
        x = rng.normal(size=(30, 4))
        y = np.arange(30) % 3
        return UserData(x, y, client_ids_train=np.arange(30) % 5)


    def torch_datasets():
        x = torch.arange(40, dtype=torch.float32).view(10, 4)
        return TensorDataset(x, torch.arange(10) % 2), None
""")


def test_user_data_module_arrays_and_torch_datasets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_fl_data.py").write_text(USER_MODULE)
    monkeypatch.chdir(tmp_path)  # a user's module next to their config imports without PYTHONPATH
    cfg = DataConfig(name="my_fl_data:arrays", partition="natural", num_clients=5, test_fraction=0.2)
    data = build_federated_dataset(cfg, seed=0)
    assert data.info.modality == "features" and data.train.x.dtype == np.float32
    assert data.client_names == ("0", "1", "2", "3", "4") and len(data.test) == 5
    train, test, info = load_dataset(DataConfig(name="my_fl_data:torch_datasets", test_fraction=0.2, num_clients=2), seed=0)
    assert (len(train), len(test), info.num_classes, info.input_shape) == (8, 2, 2, (4,))

    from fedray.plugins import build_config, user_module_paths

    config = build_config({"data": {"name": "my_fl_data:arrays", "num_clients": 5}, "train": {"clients_per_round": 2}})
    assert str(tmp_path / "my_fl_data.py") in user_module_paths(config)  # shipped to the Ray workers


# ------------------------------------------------------------------------------------ bad inputs
def _png_folder_with_a_broken_file(root: Path) -> None:
    write_image_folder(root, {"a": 2, "b": 2})
    (root / "b" / "1.png").write_bytes(b"\x89PNG\r\n\x1a\n not really a PNG")


def _parquet(table: dict) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table(table), sink)
    return sink.getvalue().to_pybytes()


BAD_USER_MODULE = textwrap.dedent("""
    import numpy as np
    from fedray.data import UserData

    def labels_out_of_range():
        return UserData(np.zeros((6, 2)), np.array([0, 1, 2, 3, 0, 1]), num_classes=3)

    def different_lengths():
        return UserData(np.zeros((6, 2)), np.array([0, 1, 0]))
""")
TABLE = ["--set", "data.name=table", "--set", "resources.num_workers=1"]
BAD_DATA = [
    ("missing-path", [*TABLE, "--set", "data.path=nowhere.parquet"], {}, "data.path: nowhere.parquet does not exist"),
    ("module-does-not-import", ["--set", "data.name=no_such_module:load"], {}, "data.name: cannot import module 'no_such_module'"),
    (
        "labels-out-of-range",
        ["--set", "data.name=bad_data:labels_out_of_range"],
        {"bad_data.py": BAD_USER_MODULE},
        "label 3 is out of range for 3 classes",
    ),
    (
        "labels-not-integers",
        [*TABLE, "--set", "data.path=t.csv"],
        {"t.csv": "a,label\n1,0.5\n2,1\n"},
        "data.label_column: column 'label' of t.csv: labels must be integers, got float64 "
        "(float targets are a regression: set data.task=regression)",
    ),
    (
        "nan-features",
        [*TABLE, "--set", "data.path=t.csv"],
        {"t.csv": "a,b,label\n1,,0\n2,3,1\n"},
        "data.feature_columns: column 'b' of t.csv has 1 missing value(s) (null or NaN), the first in row 0; "
        "drop such rows with data.missing=drop",
    ),
    (
        "infinite-features",
        [*TABLE, "--set", "data.path=t.parquet"],
        {"t.parquet": _parquet({"a": [1.0, float("inf")], "label": [0, 1]})},
        "NaN or infinite feature",
    ),
    (
        "stray-huge-label",
        [*TABLE, "--set", "data.path=t.csv"],
        {"t.csv": "a,label\n1,0\n2,1\n3,1000000000000\n" + "".join(f"{i},{i % 2}\n" for i in range(20))},
        "label 1000000000000 in row 2 would make 1,000,000,000,001 classes",
    ),
    (
        "missing-value-in-a-regression-target",
        [*TABLE, "--set", "data.path=t.csv", "--set", "data.task=regression", "--set", "data.target_columns=[y]"],
        {"t.csv": "a,y\n1,0.5\n2,\n3,1.5\n"},
        "data.target_columns: column 'y' of t.csv has 1 missing value(s) (null or NaN), the first in row 1",
    ),
    (
        "language-model-on-a-label-skew-partition",
        [
            *TABLE,
            "--set",
            "data.path=t.csv",
            "--set",
            "data.task=language_modeling",
            "--set",
            "data.sequence_column=text",
            "--set",
            "data.seq_len=4",
        ],
        {"t.csv": "text\n" + "".join(f"some line {i}\n" for i in range(40))},
        "data.partition: dirichlet skews labels, and language_modeling targets have none; use data.partition=natural, iid or quantity",
    ),
    (
        "csv-rows-of-different-lengths",
        [*TABLE, "--set", "data.path=t.csv"],
        {"t.csv": "a,b,label\n1,2,0\n3,1\n"},
        "data.path: cannot read t.csv: CSV parse error: Expected 3 columns, got 2",
    ),
    (
        "arrays-of-different-lengths",
        ["--set", "data.name=bad_data:different_lengths"],
        {"bad_data.py": BAD_USER_MODULE},
        "x_train has 6 rows but y_train has shape (3,)",
    ),
    (
        "missing-label-column",
        [*TABLE, "--set", "data.path=t.csv"],
        {"t.csv": "a,b\n1,2\n"},
        "data.label_column: no column 'label' in t.csv (columns: a, b)",
    ),
    (
        "missing-client-column",
        [*TABLE, "--set", "data.path=t.csv", "--set", "data.client_column=writer"],
        {"t.csv": "a,label\n1,0\n"},
        "data.client_column: no column 'writer' in t.csv",
    ),
    (
        "unreadable-image",
        ["--set", "data.name=imagefolder", "--set", "data.path=pics", "--set", "resources.num_workers=1"],
        {"pics": _png_folder_with_a_broken_file},
        "cannot read the image pics/b/1.png",
    ),
    (
        "natural-fewer-clients-than-cohort",
        [
            *TABLE,
            "--set",
            "data.path=t.csv",
            "--set",
            "data.client_column=w",
            "--set",
            "data.partition=natural",
            "--set",
            "data.num_clients=10",
            "--set",
            "train.clients_per_round=5",
        ],
        {"t.csv": "a,label,w\n" + "".join(f"{i},{i % 2},{i % 3}\n" for i in range(30))},
        "has 3 in its training set; set data.num_clients=3 (and train.clients_per_round to at most that)",
    ),
    (
        "sequence-longer-than-context",
        [*TABLE, "--set", "data.path=t.csv", "--set", "data.sequence_column=text", "--set", "data.seq_len=3"],
        {"t.csv": "text,label\nab,0\nabcd,1\nb,0\n"},
        "data.seq_len: row 1 of t.csv has 4 tokens, more than data.seq_len=3",
    ),
    (
        "model-for-another-modality",
        ["--set", "data.name=wine", "--set", "resources.num_workers=1"],
        {},
        "model.name: cnn_small takes image input, not features (data.name=wine has 13 features)",
    ),
    (
        "natural-without-client-ids",
        ["--set", "data.partition=natural", "--set", "resources.num_workers=1"],
        {},
        "data.partition: natural needs the data's client ids",
    ),
]


@pytest.mark.parametrize(("case_id", "args", "files", "expected"), BAD_DATA, ids=[case[0] for case in BAD_DATA])
def test_bad_data_exits_2_with_one_line_and_writes_nothing(tmp_path: Path, case_id: str, args: list, files: dict, expected: str) -> None:
    create_files(tmp_path, files)
    before = tree(tmp_path)
    result = run_fedray_preloaded(["run", *args], tmp_path)
    assert_rejected(result, expected)
    assert tree(tmp_path) - before <= {"__pycache__", *(f"__pycache__/{p.name}" for p in (tmp_path / "__pycache__").glob("*"))}
