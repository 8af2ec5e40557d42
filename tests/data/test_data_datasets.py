"""load_dataset: embedded digits, synthetic data and every torchvision dataset read by torchvision's
own loading code from tiny files written in the real on-disk formats (nothing is downloaded)."""

from __future__ import annotations

import gzip
import hashlib
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest

from fedray.config import ConfigError, DataConfig, SyntheticConfig
from fedray.data import load_dataset
from fedray.data.datasets import SYSTEM_DATA_DIRS

# ---------------------------------------------------------------------------------------------
# digits and synthetic


def test_digits_shapes_split_and_pixel_scale() -> None:
    from sklearn.datasets import load_digits

    train, test, info = load_dataset(DataConfig(), seed=0)
    assert train.x.shape == (1437, 1, 8, 8) and test.x.shape == (360, 1, 8, 8)
    assert train.x.dtype == np.uint8 and train.y.dtype == np.int64
    # Every image is a digits image with 0..16 mapped to round(v · 255 / 16), and none is lost.
    digits = load_digits()
    expected = np.rint(digits.images * 255 / 16).astype(np.uint8).reshape(len(digits.target), -1)
    got = np.concatenate([train.x, test.x]).reshape(len(digits.target), -1)
    expected_rows = sorted(row.tobytes() + bytes([t]) for row, t in zip(expected, digits.target))
    got_rows = sorted(row.tobytes() + bytes([t]) for row, t in zip(got, np.concatenate([train.y, test.y])))
    assert got_rows == expected_rows
    assert train.x.max() == 255
    # Stratified: every class has ~20 % of its samples in the test split.
    test_share = np.bincount(test.y, minlength=10) / np.bincount(digits.target, minlength=10)
    assert np.all(np.abs(test_share - 0.2) < 0.02)
    assert info.num_classes == 10 and info.channels == 1 and info.image_size == 8
    assert info.mean[0] == pytest.approx(train.x.mean() / 255)
    assert info.std[0] == pytest.approx(train.x.std() / 255)
    assert info.augmentation == "none"
    other_train, _, _ = load_dataset(DataConfig(), seed=1)
    assert not np.array_equal(train.y, other_train.y)


def test_augmentation_key_overrides_the_default() -> None:
    _, _, info = load_dataset(DataConfig(augmentation="crop_flip"), seed=0)
    assert info.augmentation == "crop_flip"


def test_synthetic_is_seeded_shaped_and_class_dependent() -> None:
    spec = SyntheticConfig(num_train=600, num_test=200, channels=3, image_size=6, num_classes=5, noise=0.3)
    cfg = DataConfig(name="synthetic", synthetic=spec)
    train, test, info = load_dataset(cfg, seed=0)
    assert train.x.shape == (600, 3, 6, 6) and test.x.shape == (200, 3, 6, 6)
    assert train.x.dtype == np.uint8 and train.y.dtype == np.int64
    assert set(np.unique(train.y)) == set(range(5)) and test.y.max() < 5
    assert (info.num_classes, info.channels, info.image_size) == (5, 3, 6)
    again_train, again_test, _ = load_dataset(cfg, seed=0)
    np.testing.assert_array_equal(train.x, again_train.x)
    np.testing.assert_array_equal(test.y, again_test.y)
    assert not np.array_equal(train.x, load_dataset(cfg, seed=1)[0].x)
    # Class-dependent patterns: the nearest class mean of the train set classifies the test set.
    means = np.stack([train.x[train.y == c].reshape(-1, 108).mean(0) for c in range(5)])
    distances = ((test.x.reshape(-1, 1, 108).astype(float) - means[None]) ** 2).sum(-1)
    assert np.mean(distances.argmin(1) == test.y) > 0.9


# ---------------------------------------------------------------------------------------------
# torchvision datasets from tiny files in their real formats


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def write_idx(path: Path, array: np.ndarray) -> None:
    """An idx-ubyte file: magic (0, 0, 0x08 = uint8, ndim), big-endian int32 dims, raw bytes;
    gzip-compressed when the name ends in ``.gz`` (as the files are distributed)."""
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(struct.pack(">i", d) for d in array.shape)
    payload = header + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(payload) if path.suffix == ".gz" else payload)


def write_mnist_files(directory: Path, suffix: str = "") -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The four MNIST-format files (5 train, 3 test images) in ``directory``; returns them."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    splits = {
        "train": (rng.integers(0, 256, (5, 28, 28)), np.array([3, 1, 4, 1, 5])),
        "t10k": (rng.integers(0, 256, (3, 28, 28)), np.array([9, 2, 6])),
    }
    for split, (images, labels) in splits.items():
        write_idx(directory / f"{split}-images-idx3-ubyte{suffix}", images)
        write_idx(directory / f"{split}-labels-idx1-ubyte{suffix}", labels)
    return splits


@pytest.fixture
def no_system_copy(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Hide the Debian package's copy (if installed) so that only data.root is looked at."""
    monkeypatch.setitem(SYSTEM_DATA_DIRS, "fmnist", tmp_path / "no-system-copy")


def assert_mnist_arrays(train, test, info, splits) -> None:  # noqa: ANN001
    assert train.x.shape == (5, 1, 28, 28) and test.x.shape == (3, 1, 28, 28)
    assert train.x.dtype == np.uint8 and train.y.dtype == np.int64
    np.testing.assert_array_equal(train.x[:, 0], splits["train"][0])
    np.testing.assert_array_equal(test.x[:, 0], splits["t10k"][0])
    np.testing.assert_array_equal(train.y, splits["train"][1])
    np.testing.assert_array_equal(test.y, splits["t10k"][1])
    assert (info.num_classes, info.channels, info.image_size) == (10, 1, 28)
    assert info.augmentation == "none"
    assert len(info.mean) == len(info.std) == 1


@pytest.mark.parametrize("name,folder", [("mnist", "MNIST"), ("fmnist", "FashionMNIST")])
@pytest.mark.parametrize(
    "layout,suffix",
    [("torchvision", ""), ("torchvision", ".gz"), ("flat", ".gz"), ("flat", "")],
)
def test_mnist_family_from_idx_files(name: str, folder: str, layout: str, suffix: str, tmp_path: Path, no_system_copy: None) -> None:
    # torchvision's <root>/<Class>/raw/ layout (unzipped), or the files directly in data.root as
    # distributed (gzipped, as Debian's dataset-fashion-mnist installs them).
    directory = tmp_path / folder / "raw" if layout == "torchvision" else tmp_path
    splits = write_mnist_files(directory, suffix)
    train, test, info = load_dataset(DataConfig(name=name, root=str(tmp_path)), seed=0)
    assert_mnist_arrays(train, test, info, splits)


def test_fmnist_found_in_system_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    system = tmp_path / "usr-share-datasets-fashion-mnist"
    splits = write_mnist_files(system, ".gz")
    monkeypatch.setitem(SYSTEM_DATA_DIRS, "fmnist", system)
    cfg = DataConfig(name="fmnist", root=str(tmp_path / "empty-root"))
    train, test, info = load_dataset(cfg, seed=0)
    assert_mnist_arrays(train, test, info, splits)
    # MNIST has no system copy: the same empty root is an error.
    with pytest.raises(ConfigError, match="data.name=mnist"):
        load_dataset(DataConfig(name="mnist", root=str(tmp_path / "empty-root")), seed=0)


@pytest.mark.parametrize(
    "damage,expected",
    [
        (lambda raw: b"\x00\x00\x0c\x03" + raw[4:], "magic number 00000c03"),  # int32 type
        (lambda raw: b"PK\x03\x04" + raw[4:], "magic number 504b0304"),  # a zip file
        (lambda raw: raw[:-100], "truncated or corrupt"),
        (lambda raw: raw[:6], "truncated header"),
    ],
)
def test_malformed_idx_file_is_one_line_config_error(
    damage,
    expected: str,
    tmp_path: Path,
    no_system_copy: None,  # noqa: ANN001
) -> None:
    write_mnist_files(tmp_path, ".gz")
    bad = tmp_path / "train-images-idx3-ubyte.gz"
    bad.write_bytes(gzip.compress(damage(gzip.decompress(bad.read_bytes()))))
    with pytest.raises(ConfigError) as error:
        load_dataset(DataConfig(name="fmnist", root=str(tmp_path)), seed=0)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("data.name=fmnist: ") and str(bad) in message
    assert expected in message


def test_not_gzip_despite_suffix_is_config_error(tmp_path: Path, no_system_copy: None) -> None:
    write_mnist_files(tmp_path, ".gz")
    bad = tmp_path / "t10k-labels-idx1-ubyte.gz"
    bad.write_bytes(b"this is not gzip data")
    with pytest.raises(ConfigError, match=f"data.name=mnist: {bad}: cannot be read"):
        load_dataset(DataConfig(name="mnist", root=str(tmp_path)), seed=0)


def test_a_label_out_of_range_in_an_idx_file_is_one_line_exit_2_before_ray(tmp_path: Path) -> None:
    """Issue 42: a label file with 205 among MNIST's 10 classes failed in the first round with
    ``IndexError: Target 205 is out of bounds``; it is refused when the file is read, naming it."""
    from test_bad_inputs import assert_rejected, run_fedray

    write_mnist_files(tmp_path / "mnist")
    bad = tmp_path / "mnist" / "t10k-labels-idx1-ubyte"
    write_idx(bad, np.array([9, 205, 6]))
    with pytest.raises(ConfigError) as error:
        load_dataset(DataConfig(name="mnist", root=str(tmp_path / "mnist")), seed=0)
    assert str(error.value) == f"data.name=mnist: {bad}: label 205 is out of range for 10 classes (labels must be 0..9)"
    result = run_fedray(
        [
            "run",
            "--quiet",
            "--set",
            "data.name=mnist",
            "--set",
            f"data.root={tmp_path / 'mnist'}",
            "--set",
            "data.num_clients=2",
            "--set",
            "train.clients_per_round=2",
            "--set",
            f"output.dir={tmp_path / 'runs'}",
        ],
        tmp_path,
    )
    assert_rejected(result, f"{bad}: label 205 is out of range for 10 classes")
    assert "Started a local Ray instance" not in result.stderr and not (tmp_path / "runs").exists()


def test_images_and_labels_of_different_length_is_config_error(tmp_path: Path, no_system_copy: None) -> None:
    write_mnist_files(tmp_path)
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.array([1, 2]))
    with pytest.raises(ConfigError, match="are not N images and N labels"):
        load_dataset(DataConfig(name="fmnist", root=str(tmp_path)), seed=0)


REAL_FMNIST = Path("/usr/share/datasets/fashion-mnist")


@pytest.mark.skipif(
    not REAL_FMNIST.is_dir(),
    reason="Debian's dataset-fashion-mnist is not installed (apt-get install -y dataset-fashion-mnist)",
)
def test_real_fashion_mnist_from_the_debian_package(tmp_path: Path) -> None:
    cfg = DataConfig(name="fmnist", root=str(tmp_path))  # no copy in data.root
    train, test, info = load_dataset(cfg, seed=0)
    assert train.x.shape == (60_000, 1, 28, 28) and test.x.shape == (10_000, 1, 28, 28)
    np.testing.assert_array_equal(np.bincount(train.y), [6000] * 10)
    np.testing.assert_array_equal(np.bincount(test.y), [1000] * 10)
    # The published normalisation constants are those of these files.
    assert train.x.mean() / 255 == pytest.approx(info.mean[0], abs=1e-3)
    assert train.x.std() / 255 == pytest.approx(info.std[0], abs=1e-3)


# ---------------------------------------------------------------------------------------------
# training-set subset and validation split


def test_max_train_samples_keeps_a_seeded_subset() -> None:
    full, test, _ = load_dataset(DataConfig(), seed=0)
    small, small_test, _ = load_dataset(DataConfig(max_train_samples=500), seed=0)
    assert len(small) == 500
    np.testing.assert_array_equal(small_test.y, test.y)  # the test set is untouched
    rows = {row.tobytes() for row in full.x.reshape(len(full), -1)}
    assert all(row.tobytes() in rows for row in small.x.reshape(500, -1))
    again, _, _ = load_dataset(DataConfig(max_train_samples=500), seed=0)
    np.testing.assert_array_equal(again.x, small.x)
    other, _, _ = load_dataset(DataConfig(max_train_samples=500), seed=1)
    assert not np.array_equal(other.y, small.y)
    larger, _, _ = load_dataset(DataConfig(max_train_samples=10**6), seed=0)
    assert len(larger) == len(full)


def test_validation_fraction_evaluates_on_held_out_training_data() -> None:
    full, test, _ = load_dataset(DataConfig(), seed=0)
    train, validation, _ = load_dataset(DataConfig(validation_fraction=0.25), seed=0)
    assert len(validation) == round(0.25 * len(full)) and len(train) + len(validation) == len(full)
    full_rows = sorted(r.tobytes() for r in full.x.reshape(len(full), -1))
    split_rows = sorted(r.tobytes() for r in np.concatenate([train.x, validation.x]).reshape(len(full), -1))
    assert split_rows == full_rows  # a partition of the training set
    test_rows = {r.tobytes() for r in test.x.reshape(len(test), -1)}
    assert not any(r.tobytes() in test_rows for r in validation.x.reshape(len(validation), -1))


def cifar_rows(num_images: int, rng: np.random.Generator) -> np.ndarray:
    """CIFAR's row layout: 1024 red, then 1024 green, then 1024 blue values, each 32×32 row-major."""
    return rng.integers(0, 256, (num_images, 3072)).astype(np.uint8)


def write_pickle(path: Path, payload: dict) -> None:
    with open(path, "wb") as file:
        pickle.dump(payload, file)


def assert_cifar_layout(x: np.ndarray, rows: np.ndarray) -> None:
    """x[i, c, h, w] must be rows[i, c·1024 + h·32 + w] (channels first, RGB order)."""
    assert x.shape == (len(rows), 3, 32, 32) and x.dtype == np.uint8
    assert x.flags["C_CONTIGUOUS"]
    np.testing.assert_array_equal(x.reshape(len(rows), -1), rows)
    assert x[1, 2, 3, 4] == rows[1, 2 * 1024 + 3 * 32 + 4]


def test_cifar10_from_python_batches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from torchvision.datasets import CIFAR10

    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(0)
    train_rows, train_labels = [], []
    for b in range(1, 6):
        rows, labels = cifar_rows(2, rng), [b, (b + 3) % 10]
        batch = {"batch_label": f"batch {b}", "data": rows, "labels": labels}
        write_pickle(folder / f"data_batch_{b}", batch)
        train_rows.append(rows)
        train_labels += labels
    test_rows = cifar_rows(3, rng)
    write_pickle(folder / "test_batch", {"data": test_rows, "labels": [7, 0, 9]})
    write_pickle(folder / "batches.meta", {"label_names": [f"class{i}" for i in range(10)]})
    # torchvision checks hard-coded md5 sums of the real CIFAR files; point them at the tiny files
    # written above so that torchvision's own loading code runs unchanged.
    train_list = [[f"data_batch_{b}", md5(folder / f"data_batch_{b}")] for b in range(1, 6)]
    meta = {"filename": "batches.meta", "key": "label_names", "md5": md5(folder / "batches.meta")}
    monkeypatch.setattr(CIFAR10, "train_list", train_list)
    monkeypatch.setattr(CIFAR10, "test_list", [["test_batch", md5(folder / "test_batch")]])
    monkeypatch.setattr(CIFAR10, "meta", meta)

    train, test, info = load_dataset(DataConfig(name="cifar10", root=str(tmp_path)), seed=0)
    assert_cifar_layout(train.x, np.concatenate(train_rows))
    assert_cifar_layout(test.x, test_rows)
    np.testing.assert_array_equal(train.y, train_labels)
    np.testing.assert_array_equal(test.y, [7, 0, 9])
    assert train.y.dtype == np.int64
    assert (info.num_classes, info.channels, info.image_size) == (10, 3, 32)
    assert info.augmentation == "crop_flip"
    assert info.mean == pytest.approx((0.4914, 0.4822, 0.4465))


def test_cifar100_from_python_batches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from torchvision.datasets import CIFAR100

    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    rng = np.random.default_rng(1)
    train_rows, test_rows = cifar_rows(4, rng), cifar_rows(2, rng)
    write_pickle(
        folder / "train",
        {"data": train_rows, "fine_labels": [99, 0, 42, 7], "coarse_labels": [19, 0, 5, 1]},
    )
    write_pickle(folder / "test", {"data": test_rows, "fine_labels": [3, 64], "coarse_labels": [2, 3]})
    write_pickle(folder / "meta", {"fine_label_names": [f"f{i}" for i in range(100)]})
    # torchvision checks hard-coded md5 sums of the real CIFAR files; point them at the tiny files.
    monkeypatch.setattr(CIFAR100, "train_list", [["train", md5(folder / "train")]])
    monkeypatch.setattr(CIFAR100, "test_list", [["test", md5(folder / "test")]])
    meta = {"filename": "meta", "key": "fine_label_names", "md5": md5(folder / "meta")}
    monkeypatch.setattr(CIFAR100, "meta", meta)

    train, test, info = load_dataset(DataConfig(name="cifar100", root=str(tmp_path)), seed=0)
    assert_cifar_layout(train.x, train_rows)
    assert_cifar_layout(test.x, test_rows)
    np.testing.assert_array_equal(train.y, [99, 0, 42, 7])  # fine labels, not coarse
    np.testing.assert_array_equal(test.y, [3, 64])
    assert (info.num_classes, info.channels, info.augmentation) == (100, 3, "crop_flip")


def test_svhn_from_mat_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from scipy.io import savemat
    from torchvision.datasets import SVHN

    rng = np.random.default_rng(2)
    # SVHN's layout: X is [32, 32, 3, N] (height, width, channel, sample), y is [N, 1], and the
    # digit 0 has label 10.
    arrays = {
        "train": (
            rng.integers(0, 256, (32, 32, 3, 4)).astype(np.uint8),
            np.array([[10], [1], [9], [10]], np.uint8),
        ),
        "test": (
            rng.integers(0, 256, (32, 32, 3, 2)).astype(np.uint8),
            np.array([[5], [10]], np.uint8),
        ),
    }
    split_list = {key: list(value) for key, value in SVHN.split_list.items()}
    for split, (x, y) in arrays.items():
        savemat(tmp_path / f"{split}_32x32.mat", {"X": x, "y": y})
        split_list[split][2] = md5(tmp_path / f"{split}_32x32.mat")
    # torchvision checks hard-coded md5 sums of the real SVHN files; point them at the tiny files.
    monkeypatch.setattr(SVHN, "split_list", split_list)

    train, test, info = load_dataset(DataConfig(name="svhn", root=str(tmp_path)), seed=0)
    assert train.x.shape == (4, 3, 32, 32) and test.x.shape == (2, 3, 32, 32)
    assert train.x.dtype == np.uint8 and train.y.dtype == np.int64
    np.testing.assert_array_equal(train.x, arrays["train"][0].transpose(3, 2, 0, 1))
    assert train.x[2, 1, 5, 7] == arrays["train"][0][5, 7, 1, 2]
    np.testing.assert_array_equal(test.x, arrays["test"][0].transpose(3, 2, 0, 1))
    np.testing.assert_array_equal(train.y, [0, 1, 9, 0])
    np.testing.assert_array_equal(test.y, [5, 0])
    assert (info.num_classes, info.channels, info.augmentation) == (10, 3, "crop_flip")


def test_tiny_imagenet_from_image_folder(tmp_path: Path) -> None:
    from PIL import Image

    base = tmp_path / "tiny-imagenet-200"
    wnids = ["n09999999", "n01443537"]  # wnids.txt order; class index = sorted order
    colours = {"n01443537": (200, 30, 90), "n09999999": (20, 160, 240)}
    (base / "val" / "images").mkdir(parents=True)
    (base / "wnids.txt").write_text("\n".join(wnids) + "\n")
    for wnid in wnids:
        (base / "train" / wnid / "images").mkdir(parents=True)
        (base / "train" / wnid / f"{wnid}_boxes.txt").write_text("")
        for i in range(2):
            image_path = base / "train" / wnid / "images" / f"{wnid}_{i}.JPEG"
            Image.new("RGB", (64, 64), colours[wnid]).save(image_path)
    annotations = []
    for i, wnid in enumerate(["n09999999", "n01443537", "n09999999"]):
        Image.new("RGB", (64, 64), colours[wnid]).save(base / "val" / "images" / f"val_{i}.JPEG")
        annotations.append(f"val_{i}.JPEG\t{wnid}\t0\t0\t63\t63")
    (base / "val" / "val_annotations.txt").write_text("\n".join(annotations) + "\n")

    train, test, info = load_dataset(DataConfig(name="tinyimagenet", root=str(tmp_path)), seed=0)
    assert train.x.shape == (4, 3, 64, 64) and test.x.shape == (3, 3, 64, 64)
    assert train.x.dtype == np.uint8 and train.y.dtype == np.int64
    np.testing.assert_array_equal(train.y, [0, 0, 1, 1])
    np.testing.assert_array_equal(test.y, [1, 0, 1])
    sorted_wnids = sorted(wnids)
    for x, y in [(train.x, train.y), (test.x, test.y)]:
        for image, label in zip(x, y):
            channel_means = image.reshape(3, -1).mean(1)  # RGB, channels first; JPEG is lossy
            np.testing.assert_allclose(channel_means, colours[sorted_wnids[label]], atol=3)
    assert (info.num_classes, info.channels, info.image_size) == (2, 3, 64)
    assert info.augmentation == "crop_flip"


@pytest.mark.parametrize(
    ("bad_line", "problem"),
    [
        ("val_1.JPEG n01 0 0 63 63", "expected IMAGE<TAB>WNID<TAB>x0<TAB>y0<TAB>x1<TAB>y1, got 'val_1.JPEG n01 0 0 63 63'"),
        ("val_1.JPEG\tn77\t0\t0\t63\t63", "wnid 'n77' is not one of the 2 in"),
    ],
    ids=["spaces-for-tabs", "unknown-wnid"],
)
def test_a_malformed_tiny_imagenet_annotation_names_the_file_and_line(tmp_path: Path, bad_line: str, problem: str) -> None:
    from PIL import Image

    base = tmp_path / "tiny-imagenet-200"
    (base / "val" / "images").mkdir(parents=True)
    (base / "wnids.txt").write_text("n01\nn02\n")
    for wnid in ("n01", "n02"):
        (base / "train" / wnid / "images").mkdir(parents=True)
        Image.new("RGB", (64, 64)).save(base / "train" / wnid / "images" / f"{wnid}_0.JPEG")
    for i in range(2):
        Image.new("RGB", (64, 64)).save(base / "val" / "images" / f"val_{i}.JPEG")
    annotations = base / "val" / "val_annotations.txt"
    annotations.write_text(f"val_0.JPEG\tn02\t0\t0\t63\t63\n\n{bad_line}\n")  # the blank line 2 is skipped but counted
    with pytest.raises(ConfigError) as raised:
        load_dataset(DataConfig(name="tinyimagenet", root=str(tmp_path)), seed=0)
    assert raised.value.key == "data.name=tinyimagenet"
    assert raised.value.message.startswith(f"{annotations} line 3: {problem}")


MISSING_FILE_HINTS = {
    "mnist": "MNIST/raw/",
    "fmnist": "apt-get install -y dataset-fashion-mnist",
    "cifar10": "cifar-10-batches-py/",
    "cifar100": "cifar-100-python/",
    "svhn": "train_32x32.mat",
    "tinyimagenet": "tiny-imagenet-200/",
}


@pytest.mark.parametrize("name", sorted(MISSING_FILE_HINTS))
def test_missing_data_directory_is_config_error(name: str, tmp_path: Path, no_system_copy: None) -> None:
    root = tmp_path / "nothing-here"
    with pytest.raises(ConfigError) as error:
        load_dataset(DataConfig(name=name, root=str(root)), seed=0)
    message = str(error.value)
    assert f"data.name={name}" in message
    assert str(root) in message
    assert "--set data.download=true" in message
    assert MISSING_FILE_HINTS[name] in message


def test_incomplete_cifar_directory_is_config_error(tmp_path: Path) -> None:
    (tmp_path / "cifar-10-batches-py").mkdir()
    (tmp_path / "cifar-10-batches-py" / "data_batch_1").write_bytes(b"truncated")
    with pytest.raises(ConfigError, match="data.download"):
        load_dataset(DataConfig(name="cifar10", root=str(tmp_path)), seed=0)


FMNIST_SWEEPS = sorted((Path(__file__).resolve().parents[2] / "tune_configs" / "fmnist").glob("*.yaml"))


@pytest.mark.parametrize("path", FMNIST_SWEEPS, ids=lambda p: p.stem)
def test_fmnist_sweeps_tune_on_a_validation_split(path: Path) -> None:
    from fedray.tune.spec import load_sweep

    spec = load_sweep(path)
    assert "train.lr" in spec.space
    for values in spec.trial_shapes():
        config = spec.trial_config(values)
        assert config.data.name == "fmnist" and config.data.validation_fraction > 0
