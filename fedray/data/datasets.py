"""Load a dataset named by ``data.name`` into arrays: uint8 images ``[N, C, H, W]`` for the built-in
image datasets, or any modality (:mod:`fedray.data.base`) for your own data.

``digits`` ships inside scikit-learn and ``synthetic`` is generated, so neither needs files. MNIST
and Fashion-MNIST are read from their original (gzipped) IDX files where they lie (:mod:`fedray.data.idx`):
directly in ``data.root``, in torchvision's ``<root>/<Class>/raw/`` layout or, for Fashion-MNIST,
where Debian's ``dataset-fashion-mnist`` package installs them. CIFAR and SVHN are read through
torchvision's own dataset classes (their array attributes, never per-sample PIL images) from
``data.root``; Tiny-ImageNet is read from its image-folder layout. A missing data directory or a
malformed file is a :class:`~fedray.config.ConfigError` that says where the files should be and how
to get them.

``data.max_train_samples`` keeps a seeded random subset of the training set and
``data.validation_fraction`` replaces the test set by a seeded held-out share of the training set
(for tuning without touching the test set). torchvision and scikit-learn are imported inside the loaders so that importing
:mod:`fedray.data` stays light.

Default augmentation (``data.augmentation=auto``): ``crop_flip`` for CIFAR-10/100, SVHN and
Tiny-ImageNet, ``none`` for digits, MNIST, Fashion-MNIST and synthetic. SVHN gets ``crop_flip`` too,
as in the common FL benchmark pipelines, rather than a crop-only variant: the config offers exactly
``none`` and ``crop_flip``, and ``data.augmentation=none`` turns flipping off.

Your own data (docs/guide/your_data.md): ``imagefolder`` and ``table`` read files
(:mod:`fedray.data.formats`), ``package.module:Name`` calls your code (:mod:`fedray.data.user`), and
``pystdlib_chars``, ``breast_cancer`` and ``wine`` are built-in benchmarks of tokens and features
(:mod:`fedray.data.benchmarks`). Without a test set of their own, the test set is a seeded
``data.test_fraction`` share of the samples, taken from every client's samples alike when
``data.partition=natural``; ``data.max_samples_per_client`` first keeps a seeded subset of every
client's samples. Features are standardised with the training set's per-feature mean and std.

The targets are those of ``data.task`` (:mod:`fedray.tasks`): the built-in image datasets and
``breast_cancer``/``wine`` have class labels (a task with class labels only), ``diabetes`` regression
targets, ``pystdlib_chars`` text (classification or language modelling); a table or your own code can
have any. ``DatasetInfo.num_classes`` is the model's output size for the task, and a regression's
``target_mean``/``target_std`` are the training set's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedray.config import ConfigError, DataConfig, is_reference
from fedray.data.base import ArrayDataset, DatasetInfo
from fedray.data.benchmarks import load_diabetes, load_pystdlib_chars, load_sklearn_table
from fedray.data.formats import load_image_folder, load_table
from fedray.data.idx import IdxFormatError, has_idx_files, read_idx_split
from fedray.data.partition import hold_out, natural_clients, test_split
from fedray.data.user import UserData, load_user_reference
from fedray.tasks import LanguageModeling, Regression, Task, task_class

TINY_IMAGENET_URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"


@dataclass(frozen=True)
class _TorchvisionSource:
    """How one torchvision dataset is found on disk and what it contains."""

    class_name: str
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    augmentation: str
    expected_files: str  # what to place under data.root, for the missing-files message


_TORCHVISION_SOURCES = {
    "mnist": _TorchvisionSource(
        "MNIST",
        10,
        (0.1307,),
        (0.3081,),
        "none",
        "{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] (the four IDX files, gzipped or not) directly or in MNIST/raw/",
    ),
    "fmnist": _TorchvisionSource(
        "FashionMNIST",
        10,
        (0.2860,),
        (0.3530,),
        "none",
        "{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] (the four IDX files, gzipped or not) directly or in FashionMNIST/raw/",
    ),
    "cifar10": _TorchvisionSource(
        "CIFAR10",
        10,
        (0.4914, 0.4822, 0.4465),
        (0.2470, 0.2435, 0.2616),
        "crop_flip",
        "cifar-10-batches-py/ with data_batch_1..5, test_batch and batches.meta (cifar-10-python.tar.gz extracted)",
    ),
    "cifar100": _TorchvisionSource(
        "CIFAR100",
        100,
        (0.5071, 0.4865, 0.4409),
        (0.2673, 0.2564, 0.2762),
        "crop_flip",
        "cifar-100-python/ with train, test and meta (cifar-100-python.tar.gz extracted)",
    ),
    "svhn": _TorchvisionSource(
        "SVHN",
        10,
        (0.4377, 0.4438, 0.4728),
        (0.1980, 0.2010, 0.1970),
        "crop_flip",
        "train_32x32.mat and test_32x32.mat (the cropped-digits .mat files) directly",
    ),
}
# Where a system package installs a dataset's files, looked at when data.root has no copy, and the
# command that installs it (named in the missing-files error).
SYSTEM_DATA_DIRS = {"fmnist": Path("/usr/share/datasets/fashion-mnist")}
_SYSTEM_PACKAGES = {"fmnist": "apt-get install -y dataset-fashion-mnist"}
_HOLD_OUT_STREAMS = {"subset": 0x5355, "validation": 0x5641, "per_client": 0x5043}  # independent of other draws (and of TEST_STREAM)
# Your own data and the built-in benchmarks beyond images: data.name → the loader of its arrays (a
# table's takes the seed too; data.name: package.module:Name is loaded by fedray.data.user.load_user_reference).
_USER_DATA_LOADERS = {
    "imagefolder": load_image_folder,
    "table": load_table,
    "pystdlib_chars": load_pystdlib_chars,
    "breast_cancer": load_sklearn_table,
    "wine": load_sklearn_table,
    "diabetes": load_diabetes,
}
_TINY_IMAGENET_STATS = ((0.4802, 0.4481, 0.3975), (0.2770, 0.2691, 0.2821))
_TINY_IMAGENET_FILES = (
    "tiny-imagenet-200/ with wnids.txt, train/<wnid>/images/*.JPEG, val/images/*.JPEG and "
    f"val/val_annotations.txt (tiny-imagenet-200.zip from {TINY_IMAGENET_URL} extracted)"
)


_SYNTHETIC_CHUNK_PIXELS = 1 << 22  # float32 pixels generated at a time (16 MB)
_STATS_CHUNK = 1 << 20  # float64 deviations held at a time by _mean_std (8 MB)


def load_dataset(cfg: DataConfig, seed: int) -> tuple[ArrayDataset, ArrayDataset, DatasetInfo]:
    """Load ``cfg.name`` as (train, test, info), with the targets of the run's task (``cfg.task``).

    ``digits`` and ``synthetic`` are split (seeded by ``seed``) with ``cfg.test_fraction``; the
    others use their official train/test splits (Tiny-ImageNet: its labelled val set is the test
    set). ``info.augmentation`` is the dataset's default unless ``cfg.augmentation`` names one.
    Then ``cfg.max_train_samples`` subsamples the training set and ``cfg.validation_fraction > 0``
    makes a held-out share of it the returned test set (both seeded by ``seed``). A regression's
    ``info.target_mean``/``target_std`` are those of the training set so returned.
    """
    task = task_class(cfg.task)
    _check_task_keys(cfg, task)
    vocab_size, columns = None, {}
    if cfg.name in _USER_DATA_LOADERS or is_reference(cfg.name):
        train, test, user_data = _load_user_data(cfg, seed, task)
        num_classes, vocab_size, default_augmentation, stats = user_data.num_classes, user_data.vocab_size, "none", None
        columns = {role: tuple(names) for role, names in user_data.columns.items()}
    elif cfg.max_samples_per_client is not None:
        raise ConfigError("data.max_samples_per_client", f"data.name={cfg.name} has no client ids", within=None)
    else:
        train, test, num_classes, default_augmentation, stats = _load_built_in(cfg, seed)
        train, test = (_with_task_targets(split, task, f"data.name={cfg.name}") for split in (train, test))
    if cfg.max_train_samples is not None and cfg.max_train_samples < len(train):
        kept, _ = hold_out(len(train), cfg.max_train_samples, seed, _HOLD_OUT_STREAMS["subset"])
        train = train.subset(kept)
    if cfg.validation_fraction > 0:
        size = max(1, round(cfg.validation_fraction * len(train)))
        held, rest = hold_out(len(train), size, seed, _HOLD_OUT_STREAMS["validation"])
        train, test = train.subset(rest), train.subset(held)
    modality = train.modality
    if modality != "image" and cfg.augmentation == "crop_flip":
        raise ConfigError("data.augmentation", f"crop_flip applies to images; data.name={cfg.name} has {modality}", within=None)
    if modality == "image":
        mean, std = stats if stats is not None else _channel_stats(train.x)
    elif modality == "features":
        mean, std = _feature_stats(train.x)
    else:
        mean, std = (), ()
    target_mean, target_std = _feature_stats(train.y) if issubclass(task, Regression) else ((), ())
    info = DatasetInfo(
        name=cfg.name,
        num_classes=num_classes,
        channels=int(train.x.shape[1]) if modality == "image" else 0,
        image_size=int(train.x.shape[2]) if modality == "image" else 0,
        mean=tuple(mean),
        std=tuple(std),
        augmentation=default_augmentation if cfg.augmentation == "auto" else cfg.augmentation,
        modality=modality,
        input_shape=tuple(int(size) for size in train.x.shape[1:]),
        vocab_size=vocab_size,
        target_mean=target_mean,
        target_std=target_std,
        columns=columns,
    )
    return train, test, info


def _load_built_in(cfg: DataConfig, seed: int) -> tuple[ArrayDataset, ArrayDataset, int, str, tuple | None]:
    """A built-in image dataset: (train, test, classes, default augmentation, per-channel (mean, std)
    or None to compute them from the training images)."""
    if cfg.name == "digits":
        train, test = _load_digits(cfg.test_fraction, seed)
        return train, test, 10, "none", None
    if cfg.name == "synthetic":
        train, test = _make_synthetic(cfg, seed)
        return train, test, cfg.synthetic.num_classes, "none", None
    if cfg.name == "tinyimagenet":
        train, test, num_classes = _load_tiny_imagenet(Path(cfg.root), cfg.download)
        return train, test, num_classes, "crop_flip", _TINY_IMAGENET_STATS
    source = _TORCHVISION_SOURCES[cfg.name]
    if cfg.name in ("mnist", "fmnist"):
        train, test = _load_idx(cfg.name, source, Path(cfg.root), cfg.download)
    else:
        train, test = _load_torchvision(cfg.name, source, Path(cfg.root), cfg.download)
    return train, test, source.num_classes, source.augmentation, (source.mean, source.std)


def _check_task_keys(cfg: DataConfig, task: type[Task]) -> None:
    """Refuse a task that ``cfg.name``'s targets cannot serve and the keys that its data would ignore,
    each with one line naming the key."""
    if cfg.name == "table" or is_reference(cfg.name):
        fits, has = True, ""
    elif cfg.name == "diabetes":
        fits, has = issubclass(task, Regression), "regression targets"
    elif cfg.name == "pystdlib_chars":
        fits, has = task.class_labels or issubclass(task, LanguageModeling), "text (for classification or language_modeling)"
    else:
        fits, has = task.class_labels, "class labels"
    if not fits:
        raise ConfigError(
            "data.task",
            f"data.name={cfg.name} has {has}, not the targets of {cfg.task}; a table (data.name=table with data.target_columns "
            f"or data.sequence_column) or your own data (package.module:Name) can have them",
            within=None,
        )
    if cfg.stride is not None and not issubclass(task, LanguageModeling):
        raise ConfigError("data.stride", f"is the step between a language model's windows; data.task={cfg.task} has none", within=None)
    if cfg.tokenizer is not None and cfg.name not in ("table", "pystdlib_chars"):
        raise ConfigError(
            "data.tokenizer",
            f"turns text into tokens; data.name={cfg.name} has no text (a table's data.sequence_column or pystdlib_chars)",
            within=None,
        )
    if cfg.name != "table":
        for key, value, default in (("data.target_columns", cfg.target_columns, None), ("data.missing", cfg.missing, "error")):
            if value != default:
                raise ConfigError(key, f"applies to the columns of a table (data.name=table), not to data.name={cfg.name}", within=None)


def _with_task_targets(split: ArrayDataset, task: type[Task], where: str) -> ArrayDataset:
    """``split`` with its labels in ``task``'s form (a task with class labels may check or convert them)."""
    try:
        return ArrayDataset(split.x, task.check_targets(split.y, where), split.client_ids)
    except ValueError as error:
        raise ConfigError("data.task", str(error).splitlines()[0], within=None) from None


def _load_user_data(cfg: DataConfig, seed: int, task: type[Task]) -> tuple[ArrayDataset, ArrayDataset, UserData]:
    """Train and test sets of your own data (see the module docstring) and the checked
    :class:`UserData` they come from."""
    if is_reference(cfg.name):
        data = load_user_reference(cfg.name, task)
    elif cfg.name == "table":
        data = load_table(cfg, seed)
    else:
        data = _USER_DATA_LOADERS[cfg.name](cfg)
    train = ArrayDataset(data.x_train, data.y_train, data.client_ids_train)
    if cfg.max_samples_per_client is not None:
        train = train.subset(_per_client_subset(train, cfg, seed))
    if data.x_test is not None:
        return train, ArrayDataset(data.x_test, data.y_test), data
    train_index, test_index = test_split(len(train), train.client_ids, cfg, seed)
    test = train.subset(test_index)
    return train.subset(train_index), ArrayDataset(test.x, test.y), data


def _per_client_subset(train: ArrayDataset, cfg: DataConfig, seed: int) -> np.ndarray:
    """Ascending indices of a seeded subset of at most ``data.max_samples_per_client`` samples of
    every client."""
    if train.client_ids is None:
        raise ConfigError("data.max_samples_per_client", f"data.name={cfg.name} has no client ids (set data.client_column)", within=None)
    clients, _ = natural_clients(train.client_ids)
    rng = np.random.default_rng([seed, _HOLD_OUT_STREAMS["per_client"]])
    owner = np.repeat(np.arange(clients.num_clients), clients.sizes)
    order = np.lexsort((rng.random(owner.shape[0]), owner))  # shuffled inside each client
    position = np.arange(owner.shape[0]) - clients.offsets[owner]
    return np.sort(clients.indices[order][position < cfg.max_samples_per_client])


def _feature_stats(x: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-column mean and std of float32 features (or of a regression's targets); a constant column
    gets std 1 (it is only centred)."""
    mean = x.mean(axis=0, dtype=np.float64)
    std = x.std(axis=0, dtype=np.float64)
    std[std == 0] = 1.0
    return tuple(float(m) for m in mean), tuple(float(s) for s in std)


def _channel_stats(x: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and std of uint8 images on the 0..1 scale."""
    if x.shape[1] == 1:
        mean, std = _mean_std(x.reshape(-1))
        return (float(mean / 255.0),), (float(std / 255.0),)
    mean = x.mean(axis=(0, 2, 3), dtype=np.float64) / 255.0
    std = x.std(axis=(0, 2, 3), dtype=np.float64) / 255.0
    return tuple(float(m) for m in mean), tuple(float(s) for s in std)


def _mean_std(values: np.ndarray) -> tuple[np.float64, np.float64]:
    """``values.mean()`` and ``values.std()`` (dtype float64) of a flat uint8 array, equal to the bit,
    without the float64 copy of ``values`` that ``std`` makes (1 GB for 2,000,000 8×8 images): the
    sum is exact in int64 (as numpy's float64 partial sums of integers are), and the squared
    deviations are summed a chunk at a time in the order of numpy's pairwise summation."""
    mean = np.float64(int(np.add.reduce(values, dtype=np.int64))) / values.size

    def squared_deviations(start: int, stop: int) -> np.float64:
        if stop - start <= _STATS_CHUNK:
            deviations = values[start:stop] - mean
            deviations *= deviations
            return np.add.reduce(deviations)
        half = (stop - start) // 2
        half -= half % 8  # numpy's split of a pairwise sum (numpy/_core/src/umath/loops_utils.h.src)
        return squared_deviations(start, start + half) + squared_deviations(start + half, stop)

    return mean, np.sqrt(squared_deviations(0, values.size) / values.size)


def _load_digits(test_fraction: float, seed: int) -> tuple[ArrayDataset, ArrayDataset]:
    """scikit-learn's 8×8 digits (0..16 → uint8 ``round(v·255/16)``), split stratified."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = np.rint(digits.images * (255.0 / 16.0)).astype(np.uint8)[:, None]
    y = digits.target.astype(np.int64)
    train_idx, test_idx = train_test_split(np.arange(y.shape[0]), test_size=test_fraction, stratify=y, random_state=seed)
    return ArrayDataset(x[train_idx], y[train_idx]), ArrayDataset(x[test_idx], y[test_idx])


def _make_synthetic(cfg: DataConfig, seed: int) -> tuple[ArrayDataset, ArrayDataset]:
    """Class-dependent fixed random patterns (uniform on 0..1) plus Gaussian noise of std
    ``cfg.synthetic.noise``, clipped and quantised to uint8. Labels are balanced and shuffled."""
    spec = cfg.synthetic
    rng = np.random.default_rng(seed)
    shape = (spec.channels, spec.image_size, spec.image_size)
    patterns = rng.random((spec.num_classes, *shape), dtype=np.float32)
    chunk = max(1, _SYNTHETIC_CHUNK_PIXELS // int(np.prod(shape)))

    def sample(n: int) -> ArrayDataset:
        y = rng.permutation(np.arange(n, dtype=np.int64) % spec.num_classes)
        x = np.empty((n, *shape), dtype=np.uint8)
        # In float32 chunks drawn one after another from the same stream (the same numbers as one
        # draw of all n), so that only the uint8 images grow with n: 2,000,000 × 1×8×8 take ~1.5 s.
        for start in range(0, n, chunk):
            stop = min(n, start + chunk)
            pixels = rng.standard_normal((stop - start, *shape), dtype=np.float32)
            pixels *= np.float32(spec.noise)
            pixels += patterns[y[start:stop]]
            pixels *= np.float32(255.0)
            np.clip(pixels, 0, 255, out=pixels)
            np.rint(pixels, out=pixels)
            x[start:stop] = pixels
        return ArrayDataset(x, y)

    return sample(spec.num_train), sample(spec.num_test)


def _missing_files_error(name: str, directory: Path, expected: str, reason: Exception) -> ConfigError:
    """The error for absent or incomplete files: where they were looked for and how to get them."""
    package = (
        f"install Debian's package ({_SYSTEM_PACKAGES[name]}; files in {SYSTEM_DATA_DIRS[name]}), " if name in _SYSTEM_PACKAGES else ""
    )
    return ConfigError(
        f"data.name={name}",
        f"dataset files not found or incomplete in {directory.resolve()} "
        f"({reason}). Either {package}download them with --set data.download=true (needs "
        f"internet), or place {expected} under data.root ({directory}).",
        within=None,
    )


def _load_idx(name: str, source: _TorchvisionSource, root: Path, download: bool) -> tuple[ArrayDataset, ArrayDataset]:
    """MNIST / Fashion-MNIST from the first directory holding the four IDX files: ``root``,
    torchvision's ``root/<Class>/raw`` or the system package's directory. With ``download`` and
    none found, torchvision downloads them into ``root/<Class>/raw``."""
    torchvision_raw = root / source.class_name / "raw"
    candidates = [root, torchvision_raw]
    if name in SYSTEM_DATA_DIRS:
        candidates.append(SYSTEM_DATA_DIRS[name])
    directory = next((d for d in candidates if has_idx_files(d)), None)
    if directory is None and download:
        import torchvision.datasets

        try:
            getattr(torchvision.datasets, source.class_name)(root, train=True, download=True)
        except (RuntimeError, OSError) as error:
            raise _missing_files_error(name, root, source.expected_files, error) from None
        directory = torchvision_raw
    if directory is None:
        looked = ", ".join(str(d) for d in candidates)
        reason = FileNotFoundError(f"looked in {looked}")
        raise _missing_files_error(name, root, source.expected_files, reason)
    try:
        return read_idx_split(directory, "train", source.num_classes), read_idx_split(directory, "test", source.num_classes)
    except IdxFormatError as error:
        raise ConfigError(f"data.name={name}", str(error), within=None) from None


def _load_torchvision(name: str, source: _TorchvisionSource, root: Path, download: bool) -> tuple[ArrayDataset, ArrayDataset]:
    """Official train/test splits through ``torchvision.datasets.<class_name>``."""
    import torchvision.datasets

    dataset_class = getattr(torchvision.datasets, source.class_name)
    try:
        if name == "svhn":
            splits = [dataset_class(root, split=s, download=download) for s in ("train", "test")]
        else:
            splits = [dataset_class(root, train=t, download=download) for t in (True, False)]
    except (RuntimeError, OSError) as error:
        raise _missing_files_error(name, root, source.expected_files, error) from None
    return tuple(_arrays_of(name, split) for split in splits)  # type: ignore[return-value]


def _arrays_of(name: str, split: object) -> ArrayDataset:
    """The uint8 ``[N, C, H, W]`` images and int64 labels held by a torchvision dataset object."""
    if name == "svhn":  # already [N, 3, 32, 32]; labels with digit 0 mapped from 10 to 0
        x, y = np.asarray(split.data), np.asarray(split.labels)  # type: ignore[attr-defined]
    else:  # CIFAR: numpy [N, 32, 32, 3], list of labels
        x = np.asarray(split.data).transpose(0, 3, 1, 2)  # type: ignore[attr-defined]
        y = np.asarray(split.targets)  # type: ignore[attr-defined]
    return ArrayDataset(np.ascontiguousarray(x, dtype=np.uint8), y.astype(np.int64))


def _load_tiny_imagenet(root: Path, download: bool) -> tuple[ArrayDataset, ArrayDataset, int]:
    """Tiny-ImageNet-200 from ``<root>/tiny-imagenet-200``: ``train/`` through torchvision's
    ``ImageFolder`` (class index = position of the wnid in sorted order), the labelled ``val/`` set
    (``val/val_annotations.txt``) as the test set. 64×64 RGB."""
    from torchvision.datasets import ImageFolder
    from torchvision.datasets.utils import download_and_extract_archive

    base = root / "tiny-imagenet-200"
    val = base / "val"
    required = [base / "wnids.txt", base / "train", val / "images", val / "val_annotations.txt"]
    if download and not all(path.exists() for path in required):
        try:
            download_and_extract_archive(TINY_IMAGENET_URL, str(root))
        except (RuntimeError, OSError) as error:
            raise _missing_files_error("tinyimagenet", root, _TINY_IMAGENET_FILES, error) from None
    missing = [str(path.relative_to(root)) for path in required if not path.exists()]
    if missing:
        reason = FileNotFoundError(f"missing {', '.join(missing)}")
        raise _missing_files_error("tinyimagenet", root, _TINY_IMAGENET_FILES, reason)
    try:
        train_folder = ImageFolder(str(base / "train"))
    except (FileNotFoundError, OSError) as error:
        raise _missing_files_error("tinyimagenet", root, _TINY_IMAGENET_FILES, error) from None
    wnids = (base / "wnids.txt").read_text().split()
    if sorted(wnids) != train_folder.classes:
        raise ConfigError(
            "data.name=tinyimagenet",
            f"the class folders of {base / 'train'} do not match "
            f"{base / 'wnids.txt'} ({len(train_folder.classes)} folders, {len(wnids)} wnids)",
            within=None,
        )
    annotations = val / "val_annotations.txt"
    val_paths, val_labels = [], []
    for number, line in enumerate(annotations.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) < 2 or fields[1] not in train_folder.class_to_idx:
            problem = (
                f"wnid {fields[1]!r} is not one of the {len(wnids)} in {base / 'wnids.txt'}"
                if len(fields) >= 2
                else "expected IMAGE<TAB>WNID<TAB>x0<TAB>y0<TAB>x1<TAB>y1"
            )
            raise ConfigError("data.name=tinyimagenet", f"{annotations} line {number}: {problem}, got {line[:100]!r}", within=None)
        val_paths.append(val / "images" / fields[0])
        val_labels.append(train_folder.class_to_idx[fields[1]])

    def read_image(path: Path) -> np.ndarray:
        try:
            image = np.asarray(train_folder.loader(str(path)))  # RGB [H, W, 3]
        except (OSError, ValueError, SyntaxError) as error:  # PIL: unidentified, truncated or broken file
            raise ConfigError("data.name=tinyimagenet", f"cannot read the image {path}: {error}", within=None) from None
        if image.shape != (64, 64, 3):
            raise ConfigError("data.name=tinyimagenet", f"{path} is {'×'.join(map(str, image.shape))}, expected 64×64×3", within=None)
        return image

    def read_images(paths: list) -> np.ndarray:
        return np.ascontiguousarray(np.stack([read_image(path) for path in paths]).transpose(0, 3, 1, 2))

    train = ArrayDataset(
        read_images([path for path, _ in train_folder.samples]),
        np.asarray(train_folder.targets, dtype=np.int64),
    )
    test = ArrayDataset(read_images(val_paths), np.asarray(val_labels, dtype=np.int64))
    return train, test, len(wnids)
