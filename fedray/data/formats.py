"""Your own data from files, without code: an image folder and a Parquet or CSV table.

``data.name: imagefolder`` reads torchvision's ``ImageFolder`` layout under ``data.path``: one
folder per class (class index = position of its name in sorted order), either in ``train/`` and
``test/`` subfolders or as one tree that a seeded ``data.test_fraction`` split divides
(``data.test_path`` names a separate test folder). Files without an image extension are skipped, and
so are links to folders inside a class folder (:func:`image_files`).

``data.name: table`` reads the ``.parquet`` or ``.csv`` file ``data.path`` (and ``data.test_path``,
with the same columns) with pyarrow, or a Hugging Face ``datasets`` dataset saved with
``save_to_disk`` (``data.path`` its directory; its ``train`` and ``test`` splits; the ``hf`` extra).
The targets follow ``data.task`` (:mod:`fedray.tasks`):

- classification: ``data.label_column`` (default ``label``) holds integer labels (a float label
  column is refused with a pointer to ``data.task: regression``);
- regression and multilabel: ``data.target_columns``, one number (regression) or 0/1 label
  (multilabel) a column, or a single list-valued column holding a vector a row; without it,
  ``data.label_column`` (a regression of one output);
- language modelling: the next tokens of ``data.sequence_column`` (below).

The inputs are, in this order of precedence:

- ``data.image_column``: encoded PNG/JPEG bytes (or a struct with a ``bytes`` field, as Hugging Face
  datasets store images), raw pixel bytes (fixed-size binary, C·H·W a row) or pixel lists (flat,
  ``[H, W]`` or ``[C, H, W]``) → images;
- ``data.sequence_column``: lists of integers → tokens as given (0 pads shorter sequences), or text
  → characters, id 0 padding, 1 a character not seen in the training file, 2… the training file's
  characters in code-point order; with ``data.tokenizer`` (a Hugging Face tokenizer directory), the
  tokenizer's ids;
- otherwise ``data.feature_columns`` (default: every other numeric column than the label, target
  and client columns) → features.

``data.client_column`` gives every row's client, for ``data.partition: natural``.

For ``data.task: language_modeling`` every client's rows (all rows without a client column) are
joined, in the file's order, into one token stream (text rows each end with a newline, or with the
tokenizer's end-of-text token) and cut into windows of ``data.seq_len`` + 1 tokens every
``data.stride`` (default ``data.seq_len``) tokens: a window's first ``data.seq_len`` tokens are the
inputs, its last ``data.seq_len`` the targets (:func:`token_windows`). A window keeps its client's id.
The test windows are cut alike from ``data.test_path``'s rows or from a seeded ``data.test_fraction``
share of the rows (of every client's rows with ``data.partition: natural``), so that no test text is
trained on.

A missing value (null or NaN, also inside a list) in a column the run reads is an error naming the
column and its first row; with ``data.missing: drop`` such rows are dropped and counted in the log.
The columns read are returned by role in :attr:`UserData.columns <fedray.data.UserData>`.

Images are decoded to uint8 ``[N, C, H, W]`` (PNG with torchvision's libpng decoder, which is lossless
like Pillow's and 2–3× faster; other formats with Pillow), on every core: 1 channel when the first
image is grey-scale, else RGB; every image is resized (bilinear) to ``data.image_size`` square, by default the
first image's size. Decoded images are cached in ``<data.root>/cache/`` under a hash of the source
files' paths, sizes and modification times and the decoding keys, so the next run loads one
``.npz`` instead of decoding again; changing a source file makes a new cache entry.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import zipfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

from fedray.config import ConfigError, DataConfig
from fedray.data.partition import test_split
from fedray.data.user import UserData, checked_user_data
from fedray.tasks import IGNORE_INDEX, LanguageModeling, Task, task_class

logger = logging.getLogger(__name__)

PAD_ID = 0  # left-pads sequences shorter than the longest
UNKNOWN_ID = 1  # text: a character outside the vocabulary
_FIRST_CHARACTER_ID = 2
CACHE_VERSION = 1  # part of every cache key: bump it when the decoded form changes
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_GREY_MODES = ("1", "L", "LA", "I", "I;16", "F")
_TABLE_SUFFIXES = (".parquet", ".pq", ".csv")


def encode_characters(text: str, alphabet: np.ndarray) -> np.ndarray:
    """int64 ids of ``text``'s characters: ``2 + i`` for the character at ``alphabet[i]`` (sorted
    uint32 code points), :data:`UNKNOWN_ID` for any other character."""
    points = np.frombuffer(text.encode("utf-32-le"), dtype="<u4")
    position = np.searchsorted(alphabet, points)
    known = alphabet[np.minimum(position, alphabet.shape[0] - 1)] == points
    return np.where(known, position + _FIRST_CHARACTER_ID, UNKNOWN_ID).astype(np.int64)


def alphabet_of(characters: str) -> np.ndarray:
    """The sorted distinct code points of ``characters``, for :func:`encode_characters`."""
    return np.unique(np.frombuffer(characters.encode("utf-32-le"), dtype="<u4"))


def vocab_size_of(alphabet: np.ndarray) -> int:
    """Number of token ids :func:`encode_characters` produces with ``alphabet``."""
    return _FIRST_CHARACTER_ID + int(alphabet.shape[0])


# --------------------------------------------------------------------------------------- cache
def cached_arrays(cache_dir: Path, kind: str, key: dict[str, Any], build: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The arrays ``build`` returns, stored as ``<cache_dir>/<kind>-<hash of key>.npz`` the first time
    and read from there afterwards. A damaged cache file is rebuilt; an unwritable ``cache_dir`` only
    costs the cache (a warning)."""
    digest = hashlib.sha256(json.dumps({"version": CACHE_VERSION, **key}, sort_keys=True).encode()).hexdigest()
    path = cache_dir / f"{kind}-{digest[:24]}.npz"
    if path.is_file():
        try:
            with np.load(path, allow_pickle=False) as stored:
                return {name: stored[name] for name in stored.files}
        except (OSError, ValueError, zipfile.BadZipFile) as error:
            logger.warning("rebuilding the damaged data cache %s (%s)", path, error)
    arrays = build()
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        with open(partial, "wb") as handle:
            np.savez(handle, **arrays)
        os.replace(partial, path)  # readers never see a half-written file
    except OSError as error:
        partial.unlink(missing_ok=True)
        logger.warning("cannot cache the decoded data in %s (%s); the next run decodes again", cache_dir, error)
    return arrays


def _file_stamp(path: Path) -> list[Any]:
    """What identifies a file's content for the cache: its absolute path, size and mtime (for a
    directory, a saved Hugging Face dataset: those of every file in it)."""
    if path.is_dir():
        return [_file_stamp(file) for file in sorted(path.rglob("*")) if file.is_file()]
    stat = path.stat()
    return [str(path.resolve()), stat.st_size, stat.st_mtime_ns]


# -------------------------------------------------------------------------------------- images
def _decoded_image(source: str | bytes, mode: str, size: int | None, what: str) -> np.ndarray:
    """One image file (a path) or encoded image (bytes) as uint8 ``[C, size, size]`` in ``mode``
    (``size`` None: the image's own size, which must then be square)."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(source) if isinstance(source, bytes) else source) as image:
            image = image.convert(mode)
            if size is None:
                if image.width != image.height:
                    raise ConfigError(None, f"{what} is {image.width}×{image.height}, not square; set data.image_size", within=None)
                size = image.width
            if image.size != (size, size):
                image = image.resize((size, size), Image.Resampling.BILINEAR)
            array = np.asarray(image)
    except ConfigError:
        raise
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as error:  # unidentified, truncated, broken
        raise ConfigError(None, f"cannot read the image {what}: {error}", within=None) from None
    return array[None] if array.ndim == 2 else array.transpose(2, 0, 1)


def _decoded_png(source: bytes, mode: str, size: int) -> np.ndarray | None:
    """An 8-bit PNG already in ``mode`` (grey for ``L``, RGB for ``RGB``: no colour conversion, so the
    pixels are Pillow's exactly) and of the expected size, decoded by torchvision (``[C, size, size]``);
    None for anything else (another format, colour type, size or a damaged file:
    :func:`_decoded_image` handles and names those)."""
    import torch
    from torchvision.io import ImageReadMode, decode_png

    # the IHDR chunk follows the signature: bit depth at byte 24, colour type at 25 (0 grey, 2 RGB)
    if not source.startswith(_PNG_SIGNATURE) or len(source) < 26 or source[24] != 8 or source[25] != (0 if mode == "L" else 2):
        return None
    try:
        image = decode_png(torch.frombuffer(bytearray(source), dtype=torch.uint8), ImageReadMode.GRAY if mode == "L" else ImageReadMode.RGB)
    except RuntimeError:
        return None
    return image.numpy() if image.shape[-2:] == (size, size) else None


def decode_images(sources: list[str | bytes], image_size: int | None, describe: Callable[[int], str]) -> np.ndarray:
    """Images (paths or encoded bytes) → uint8 ``[N, C, H, W]``; the first image decides the number
    of channels (1 if grey-scale, else 3) and, unless ``image_size`` is set, the size.
    ``describe(i)`` names image ``i`` in errors. Decoded in threads, one per core (both decoders
    release the GIL)."""
    from concurrent.futures import ThreadPoolExecutor

    from PIL import Image

    try:
        with Image.open(io.BytesIO(sources[0]) if isinstance(sources[0], bytes) else sources[0]) as first:
            mode = "L" if first.mode in _GREY_MODES else "RGB"
    except (OSError, ValueError, SyntaxError) as error:
        raise ConfigError(None, f"cannot read the image {describe(0)}: {error}", within=None) from None
    first_image = _decoded_image(sources[0], mode, image_size, describe(0))
    size = first_image.shape[-1]
    images = np.empty((len(sources), *first_image.shape), dtype=np.uint8)
    images[0] = first_image

    def decode_range(start: int, stop: int) -> None:
        for i in range(start, stop):
            source = sources[i]
            if isinstance(source, str):
                try:
                    source = Path(source).read_bytes()
                except OSError:
                    pass  # _decoded_image names the file and the error
            png = _decoded_png(source, mode, size) if isinstance(source, bytes) else None
            images[i] = png if png is not None else _decoded_image(source, mode, size, describe(i))

    threads = max(1, min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1, 8))
    bounds = np.linspace(1, len(sources), threads + 1).astype(int)
    with ThreadPoolExecutor(threads) as pool:
        for future in [pool.submit(decode_range, int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]:
            future.result()  # a ConfigError of any range is raised here
    return images


def load_image_folder(cfg: DataConfig) -> UserData:
    """``data.name: imagefolder`` (see the module docstring)."""
    from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes

    if cfg.client_column is not None:
        raise ConfigError(
            "data.client_column",
            "an image folder has no columns; for a natural partition of images use "
            "data.name=table with data.image_column and data.client_column",
            within=None,
        )
    root = existing_path(cfg.path, "data.path", cfg.name, directory=True)
    train_dir, test_dir = root, None
    if cfg.test_path is not None:
        test_dir = existing_path(cfg.test_path, "data.test_path", cfg.name, directory=True)
    elif (root / "train").is_dir() and (root / "test").is_dir():
        train_dir, test_dir = root / "train", root / "test"
    try:
        classes, class_to_idx = find_classes(str(train_dir))
    except FileNotFoundError as error:
        raise ConfigError("data.path", f"{train_dir} has no class folders ({error})", within=None) from None
    splits = {"train": image_files(train_dir, class_to_idx, IMG_EXTENSIONS)}
    if test_dir is not None:
        unknown = sorted({entry.name for entry in test_dir.iterdir() if entry.is_dir()} - set(classes))
        if unknown:
            raise ConfigError(
                "data.test_path", f"the class folder(s) {', '.join(unknown)} of {test_dir} are not in {train_dir}", within=None
            )
        splits["test"] = image_files(test_dir, class_to_idx, IMG_EXTENSIONS)
    for split, samples in splits.items():
        if not samples:
            raise ConfigError(
                "data.path",
                f"no image files ({', '.join(IMG_EXTENSIONS)}) in the class folders of {train_dir if split == 'train' else test_dir}",
                within=None,
            )
    stamps = {split: [_file_stamp(Path(path)) for path, _ in samples] for split, samples in splits.items()}

    def decode() -> dict[str, np.ndarray]:
        arrays = {}
        size = cfg.image_size
        for split, samples in splits.items():
            paths = [path for path, _ in samples]
            arrays[f"x_{split}"] = decode_images(paths, size, lambda i: paths[i])
            arrays[f"y_{split}"] = np.asarray([label for _, label in samples], dtype=np.int64)
            size = arrays[f"x_{split}"].shape[-1]  # the test images take the training images' size
        return arrays

    arrays = cached_arrays(Path(cfg.root) / "cache", "imagefolder", {"files": stamps, "image_size": cfg.image_size}, decode)
    data = UserData(arrays["x_train"], arrays["y_train"], arrays.get("x_test"), arrays.get("y_test"), num_classes=len(classes))
    return checked_user_data(data, f"data.path={cfg.path}", task_class(cfg.task))


def image_files(directory: Path, class_to_idx: dict[str, int], extensions: tuple[str, ...]) -> list[tuple[str, int]]:
    """(path, class index) of every image file under the class folders of ``directory``, in the order
    of torchvision's ``make_dataset``, but without entering a link to a folder inside a class folder:
    torchvision follows them, so a link to an ancestor (``cats/loop -> ..``) is walked dozens of levels
    deep and every image under it read again at each level (as ``fedray submit`` leaves such links out
    of an upload). A class folder that is itself a link is read, unless it leads to ``directory`` or
    above it. The folders left out are logged."""
    root = directory.resolve()
    samples, skipped = [], []
    for name, index in sorted(class_to_idx.items()):
        class_dir = directory / name
        if class_dir.is_symlink() and root.is_relative_to(class_dir.resolve()):
            skipped.append(f"{class_dir} -> {os.readlink(class_dir)}")
            continue
        for folder, subfolders, files in sorted(os.walk(class_dir)):  # os.walk enters no link to a folder
            skipped.extend(
                f"{Path(folder, sub)} -> {os.readlink(Path(folder, sub))}" for sub in subfolders if Path(folder, sub).is_symlink()
            )
            samples.extend((str(Path(folder, file)), index) for file in sorted(files) if file.lower().endswith(extensions))
    if skipped:
        logger.warning("left out %d link(s) to folders under %s: %s", len(skipped), directory, "; ".join(skipped[:5]))
    return samples


def existing_path(value: str | None, key: str, name: str, directory: bool = False) -> Path:
    """``value`` as a path that exists (a directory if ``directory``); a ConfigError naming ``key``."""
    if value is None:
        raise ConfigError(None, f"{key} is required for data.name={name}", within=None)
    path = Path(value)
    if not path.exists():
        raise ConfigError(key, f"{value} does not exist", within=None)
    if directory and not path.is_dir():
        raise ConfigError(key, f"{value} is not a directory", within=None)
    if not directory and path.is_dir():
        raise ConfigError(key, f"{value} is a directory, not a file", within=None)
    return path


# -------------------------------------------------------------------------------------- tables
def load_table(cfg: DataConfig, seed: int) -> UserData:
    """``data.name: table`` (see the module docstring); ``seed`` draws a language model's test rows."""
    task = task_class(cfg.task)
    _check_table_keys(cfg, task)
    if cfg.path is not None and is_saved_hf_dataset(Path(cfg.path)):
        tables, paths = _read_saved_hf_dataset(Path(cfg.path))
    else:
        train_path = existing_path(cfg.path, "data.path", cfg.name)
        test_path = existing_path(cfg.test_path, "data.test_path", cfg.name) if cfg.test_path is not None else None
        paths = {"train": (train_path, "data.path"), **({"test": (test_path, "data.test_path")} if test_path else {})}
        tables = {split: _read_table(path, key) for split, (path, key) in paths.items()}
    roles = _column_roles(cfg, task, tables["train"], paths["train"][0])
    # A test file's client ids are read only to keep a language model's windows within one client's text.
    read_test_clients = issubclass(task, LanguageModeling)
    split_roles = {split: {r: c for r, c in roles.items() if r != "client" or split == "train" or read_test_clients} for split in tables}
    tables, kept_rows = _without_missing(cfg, tables, paths, split_roles)
    client_ids = {
        split: _client_ids(tables[split], cfg.client_column, paths[split][0]) for split in tables if "client" in split_roles[split]
    }
    columns = {role: names for role, (_, names) in roles.items()}
    if issubclass(task, LanguageModeling):
        return checked_user_data(_language_model_windows(cfg, tables, paths, client_ids, seed, columns), f"data.path={cfg.path}", task)
    targets_key, target_names = roles["targets"]
    targets = {split: _table_targets(table, task, targets_key, target_names, cfg, paths[split][0]) for split, table in tables.items()}
    vocab_size = None
    if cfg.image_column is not None:
        inputs = _table_images(cfg, tables, paths, kept_rows)
    elif cfg.sequence_column is not None:
        inputs, vocab_size = _table_sequences(cfg, tables, paths)
    else:
        inputs = _table_features(roles["inputs"][1], tables, paths)
    data = UserData(
        inputs["train"],
        targets["train"],
        inputs.get("test"),
        targets.get("test"),
        client_ids_train=client_ids.get("train"),
        vocab_size=vocab_size,
        columns=columns,
    )
    return checked_user_data(data, f"data.path={cfg.path}", task)


def _check_table_keys(cfg: DataConfig, task: type[Task]) -> None:
    """Refuse the keys that ``task`` cannot use on a table (each would be silently ignored)."""
    if issubclass(task, LanguageModeling):
        if cfg.sequence_column is None:
            raise ConfigError(
                "data.sequence_column", "data.task=language_modeling learns the text or token column that it names; set it", within=None
            )
        for key, value in (
            ("data.target_columns", cfg.target_columns),
            ("data.feature_columns", cfg.feature_columns),
            ("data.image_column", cfg.image_column),
        ):
            if value is not None:
                raise ConfigError(
                    key, f"data.task=language_modeling predicts the next token of data.sequence_column; it reads no {key[5:]}", within=None
                )
        if cfg.seq_len is None:
            raise ConfigError(
                "data.seq_len",
                "data.task=language_modeling cuts every client's token stream into windows of data.seq_len tokens; set it (e.g. 128)",
                within=None,
            )
    elif task.class_labels and cfg.target_columns is not None:
        raise ConfigError(
            "data.target_columns",
            f"data.task={cfg.task} reads one label per row from data.label_column; "
            "data.target_columns holds the targets of a regression or multilabel task",
            within=None,
        )
    if cfg.tokenizer is not None and cfg.sequence_column is None:
        raise ConfigError(
            "data.tokenizer", "a tokenizer turns the text of data.sequence_column into tokens; set data.sequence_column", within=None
        )


def _column_roles(cfg: DataConfig, task: type[Task], train: Any, path: Path) -> dict[str, tuple[str, list[str]]]:
    """The columns the run reads, by role (``client``, ``targets``, ``inputs``), each with the config
    key that names them (for messages). Default features: every numeric column but the label, target
    and client columns."""
    import pyarrow as pa

    roles: dict[str, tuple[str, list[str]]] = {}
    if cfg.client_column is not None:
        roles["client"] = ("data.client_column", [cfg.client_column])
    if issubclass(task, LanguageModeling):
        roles["targets"] = ("data.sequence_column", [cfg.sequence_column])  # the next tokens of the same text
    elif cfg.target_columns is not None:
        roles["targets"] = ("data.target_columns", list(cfg.target_columns))
    else:
        roles["targets"] = ("data.label_column", [cfg.label_column])
    if cfg.image_column is not None:
        roles["inputs"] = ("data.image_column", [cfg.image_column])
    elif cfg.sequence_column is not None:
        roles["inputs"] = ("data.sequence_column", [cfg.sequence_column])
    elif cfg.feature_columns is not None:
        roles["inputs"] = ("data.feature_columns", list(cfg.feature_columns))
    else:
        excluded = {cfg.label_column, cfg.client_column, *(cfg.target_columns or ())}
        names = [
            field.name
            for field in train.schema
            if field.name not in excluded and (pa.types.is_integer(field.type) or pa.types.is_floating(field.type))
        ]
        if not names:
            raise ConfigError("data.feature_columns", f"{path} has no numeric column besides the label (and client) column", within=None)
        roles["inputs"] = ("data.feature_columns", names)
    return roles


def _missing_rows(column: Any) -> np.ndarray | None:
    """Which rows of a pyarrow column hold a missing value: null, NaN, or a list holding one (at any
    depth); None where none does (checked first with counts, so a column of millions of pixel values
    costs no per-value mask)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    inner = _missing_rows(column.flatten()) if _is_list(column.type) else None
    has_nan = pa.types.is_floating(column.type) and pc.any(pc.is_nan(column)).as_py()
    if not column.null_count and not has_nan and inner is None:
        return None
    missing = column.is_null().to_numpy(zero_copy_only=False).copy()
    if has_nan:
        missing |= pc.is_nan(column).fill_null(False).to_numpy(zero_copy_only=False)
    if inner is not None:
        missing[pc.list_parent_indices(column).to_numpy()[inner]] = True
    return missing


def _without_missing(
    cfg: DataConfig, tables: dict[str, Any], paths: dict[str, tuple[Path, str]], split_roles: dict[str, dict[str, tuple[str, list[str]]]]
) -> tuple[dict[str, Any], dict[str, str]]:
    """The tables without the rows that miss a value in a column the run reads (``data.missing=drop``,
    the drops counted in the log), or a ConfigError naming the first such column and row
    (``data.missing=error``). Also returns a digest of each split's kept rows where rows were dropped,
    for the cache key of decoded images."""
    import pyarrow as pa

    kept_tables, kept_rows = {}, {}
    for split, table in tables.items():
        path = paths[split][0]
        missing = np.zeros(table.num_rows, dtype=bool)
        counts = []
        for key, names in split_roles[split].values():
            for name in names:
                column_missing = _missing_rows(_column(table, name, key, path))
                if column_missing is not None:
                    if cfg.missing == "error":
                        raise ConfigError(
                            key,
                            f"column {name!r} of {path} has {int(column_missing.sum())} missing value(s) (null or NaN), the first in row "
                            f"{int(np.argmax(column_missing))}; drop such rows with data.missing=drop",
                            within=None,
                        )
                    counts.append(f"{int(column_missing.sum())} in {name!r}")
                    missing |= column_missing
        if missing.any():
            if missing.all():
                raise ConfigError(
                    "data.missing", f"every row of {path} misses a value in a column the run reads ({', '.join(counts)})", within=None
                )
            logger.warning(
                "data.missing=drop: dropped %d of %d rows of %s with missing values (%s)",
                int(missing.sum()),
                table.num_rows,
                path,
                ", ".join(counts),
            )
            table = table.filter(pa.array(~missing))
            kept_rows[split] = hashlib.sha256(np.packbits(~missing).tobytes()).hexdigest()[:24]
        kept_tables[split] = table
    return kept_tables, kept_rows


def _client_ids(table: Any, name: str, path: Path) -> np.ndarray:
    """The client column as a numpy array (strings for text ids)."""
    client_ids = _column(table, name, "data.client_column", path).to_numpy(zero_copy_only=False)
    return client_ids.astype(str) if client_ids.dtype == object else client_ids


def is_saved_hf_dataset(path: Path) -> bool:
    """Whether ``path`` is a directory that Hugging Face ``datasets``' ``save_to_disk`` wrote (a
    ``DatasetDict``'s ``dataset_dict.json``, or a single ``Dataset``'s ``state.json``)."""
    return path.is_dir() and any((path / marker).is_file() for marker in ("dataset_dict.json", "state.json"))


def _read_saved_hf_dataset(path: Path) -> tuple[dict[str, Any], dict[str, tuple[Path, str]]]:
    """A ``save_to_disk`` directory as the Arrow tables of its ``train`` split (and ``test``, where it
    has one; a single ``Dataset`` is the train split), with the path of each split for messages and the
    cache key. Needs the ``datasets`` package (``pip install 'fedray[hf]'``)."""
    try:
        import datasets
    except ImportError:
        raise ConfigError(
            "data.path",
            f"{path} is a Hugging Face dataset saved with save_to_disk; reading it needs the datasets package: pip install 'fedray[hf]'",
            within=None,
        ) from None
    try:
        saved = datasets.load_from_disk(str(path))
    except (OSError, ValueError) as error:  # FileNotFoundError included: a damaged or partial save
        raise ConfigError(
            "data.path",
            f"cannot read the saved dataset {path}: {(str(error).splitlines() or [type(error).__name__])[0][:300]}",
            within=None,
        ) from None
    if isinstance(saved, datasets.DatasetDict):
        if "train" not in saved:
            raise ConfigError("data.path", f"the saved dataset {path} has the splits {', '.join(saved)}, none named 'train'", within=None)
        splits = {split: (saved[split], path / split) for split in ("train", "test") if split in saved}
    else:
        splits = {"train": (saved, path)}
    tables = {split: dataset.with_format("arrow")[:] for split, (dataset, _) in splits.items()}  # indices (a shuffle, a filter) applied
    return tables, {split: (split_path, "data.path") for split, (_, split_path) in splits.items()}


def _read_table(path: Path, key: str) -> Any:
    """``path`` as a pyarrow Table, by its extension."""
    import pyarrow as pa
    import pyarrow.csv as pa_csv
    import pyarrow.parquet as pq

    suffix = path.suffix.lower()
    if suffix not in _TABLE_SUFFIXES:
        raise ConfigError(key, f"{path} is not a table file ({', '.join(_TABLE_SUFFIXES)})", within=None)
    try:
        return pa_csv.read_csv(path) if suffix == ".csv" else pq.read_table(path)
    except (pa.ArrowException, OSError) as error:  # ArrowInvalid: e.g. rows with different numbers of columns
        message = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
        raise ConfigError(key, f"cannot read {path}: {message}", within=None) from None


def _column(table: Any, name: str, key: str, path: Path) -> Any:
    """Column ``name`` of ``table`` as one pyarrow Array; a ConfigError naming ``key`` if absent."""
    if name not in table.column_names:
        raise ConfigError(key, f"no column {name!r} in {path} (columns: {', '.join(table.column_names)})", within=None)
    return table.column(name).combine_chunks()


def _table_targets(table: Any, task: type[Task], key: str, names: list[str], cfg: DataConfig, path: Path) -> np.ndarray:
    """The targets of one split in ``task``'s form: the label column as ``[N]``, or the target columns
    as ``[N, K]`` (one column each, or the vectors of a single list-valued column)."""
    columns = [_column(table, name, key, path) for name in names]
    where = f"column {names[0]!r} of {path}" if len(names) == 1 else f"columns {', '.join(map(repr, names))} of {path}"
    if len(columns) == 1 and _is_list(columns[0].type):
        targets = _list_rows(columns[0], key, where)
    else:
        for name, column in zip(names, columns):
            _require_numbers(column.type, key, f"column {name!r} of {path}")
        arrays = [column.to_numpy(zero_copy_only=False) for column in columns]
        targets = arrays[0] if cfg.target_columns is None else np.stack(arrays, axis=1)
    try:
        return task.check_targets(targets, where)
    except ValueError as error:
        raise ConfigError(key, str(error).splitlines()[0], within=None) from None


def _require_numbers(arrow_type: Any, key: str, what: str) -> None:
    import pyarrow as pa

    if not (pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type) or pa.types.is_boolean(arrow_type)):
        raise ConfigError(key, f"{what} holds {arrow_type}, not numbers", within=None)


def _list_rows(column: Any, key: str, where: str) -> np.ndarray:
    """A list-valued column of numbers, one vector of the same length a row, as ``[N, K]``."""
    import pyarrow.compute as pc

    lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False)
    if len(lengths) and (lengths != lengths[0]).any():
        row = int(np.argmax(lengths != lengths[0]))
        raise ConfigError(
            key, f"{where}: row {row} holds {lengths[row]} values, row 0 {lengths[0]}; every row needs one vector length", within=None
        )
    values = column.flatten()
    _require_numbers(values.type, key, f"{where} (a list column)")
    return values.to_numpy(zero_copy_only=False).reshape(len(column), int(lengths[0]) if len(lengths) else 0)


def _table_images(
    cfg: DataConfig, tables: dict[str, Any], paths: dict[str, tuple[Path, str]], kept_rows: dict[str, str]
) -> dict[str, np.ndarray]:
    """The image column of every split: pixel arrays as they are, or encoded images decoded (and cached;
    ``kept_rows``: the digest of each split's rows left after ``data.missing=drop``, part of the cache key)."""
    import pyarrow as pa

    columns = {split: _column(table, cfg.image_column, "data.image_column", paths[split][0]) for split, table in tables.items()}
    if all(_is_list(column.type) for column in columns.values()):
        return {split: _pixel_arrays(column, cfg, paths[split][0]) for split, column in columns.items()}
    if all(_is_raw_pixels(column) for column in columns.values()):
        return {split: _pixel_bytes(column, cfg, paths[split][0]) for split, column in columns.items()}

    def encoded(split: str) -> list[bytes]:
        path = paths[split][0]
        column = _column(tables[split], cfg.image_column, "data.image_column", path)
        if pa.types.is_struct(column.type) and column.type.get_field_index("bytes") >= 0:
            column = column.field("bytes")  # Hugging Face datasets' Image feature
        if not (pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type)):
            raise ConfigError(
                "data.image_column", f"column {cfg.image_column!r} of {path} holds {column.type}, not encoded image bytes", within=None
            )
        if column.null_count:
            raise ConfigError(
                "data.image_column", f"column {cfg.image_column!r} of {path} has {column.null_count} images without bytes", within=None
            )
        return column.to_pylist()

    def decode() -> dict[str, np.ndarray]:
        images = {}
        size = cfg.image_size
        for split in tables:
            path = paths[split][0]
            images[split] = decode_images(encoded(split), size, lambda i: f"in row {i} of {path}")
            size = images[split].shape[-1]
        return images

    key = {
        "files": [_file_stamp(path) for path, _ in paths.values()],
        "image_column": cfg.image_column,
        "image_size": cfg.image_size,
        **({"kept_rows": kept_rows} if kept_rows else {}),  # keys of tables without drops are those of earlier versions
    }
    return cached_arrays(Path(cfg.root) / "cache", "table-images", key, decode)


def _is_list(arrow_type: Any) -> bool:
    import pyarrow as pa

    return pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type) or pa.types.is_fixed_size_list(arrow_type)


def _pixel_arrays(column: Any, cfg: DataConfig, path: Path) -> np.ndarray:
    """An image column of pixel values (0..255) as uint8 ``[N, C, H, W]``: each row a flat list of
    C·H·W values (with ``data.image_size`` = H = W), an ``[H, W]`` nested list (one channel) or a
    ``[C, H, W]`` one (channels first, as Hugging Face's ``Array3D`` of a CHW array stores it). No
    decoding and so no cache: such a table loads about as fast as it reads."""
    import pyarrow as pa
    import pyarrow.compute as pc

    where = f"data.image_column: column {cfg.image_column!r} of {path}"
    shape, values = [], column
    while _is_list(values.type):
        lengths = pc.list_value_length(values).to_numpy(zero_copy_only=False)
        if len(lengths) and (lengths != lengths[0]).any():
            raise ConfigError(
                where,
                f"rows hold {int(lengths.min())} to {int(lengths.max())} values at depth {len(shape) + 1}; every image must have one shape",
                within=None,
            )
        shape.append(int(lengths[0]) if len(lengths) else 0)
        values = values.flatten()
    if not pa.types.is_integer(values.type):
        raise ConfigError(
            None, f"{where} holds lists of {values.type}; pixel arrays must be integers 0..255 (or encoded image bytes)", within=None
        )
    pixels = values.to_numpy(zero_copy_only=False)
    if pixels.size and (pixels.min() < 0 or pixels.max() > 255):
        raise ConfigError(None, f"{where} holds pixel values from {pixels.min()} to {pixels.max()}; they must be 0..255", within=None)
    if len(shape) == 1:
        size = cfg.image_size
        if size is None or shape[0] % (size * size):
            raise ConfigError(
                None,
                f"{where} holds flat rows of {shape[0]} values: set data.image_size to their square side (C·side² values a row)",
                within=None,
            )
        shape = [shape[0] // (size * size), size, size]
    elif len(shape) == 2:
        shape = [1, *shape]
    elif len(shape) != 3:
        raise ConfigError(None, f"{where} nests lists {len(shape)} deep; an image row is flat, [H, W] or [C, H, W]", within=None)
    if shape[1] != shape[2]:
        raise ConfigError(None, f"{where} holds {shape[1]}×{shape[2]} images, not square", within=None)
    if cfg.image_size is not None and shape[1] != cfg.image_size:
        raise ConfigError(
            None,
            f"{where} holds {shape[1]}×{shape[2]} pixel arrays; data.image_size={cfg.image_size} resizes encoded images only",
            within=None,
        )
    return pixels.astype(np.uint8).reshape(len(column), *shape)


def _is_raw_pixels(column: Any) -> bool:
    """A fixed-size binary column that is not encoded images: each row's C·H·W bytes of pixels."""
    import pyarrow as pa

    if not pa.types.is_fixed_size_binary(column.type) or len(column) == 0:
        return False
    first = column[0].as_py() or b""
    return not (first.startswith(_PNG_SIGNATURE) or first.startswith(b"\xff\xd8"))  # PNG, JPEG


def _pixel_bytes(column: Any, cfg: DataConfig, path: Path) -> np.ndarray:
    """A fixed-size binary image column of raw pixels (each row C·H·W bytes, channels first, with
    ``data.image_size`` = H = W) as uint8 ``[N, C, H, W]``, straight from the column's buffer: the
    fastest layout to load (Parquet reads it without per-value decoding)."""
    where = f"data.image_column: column {cfg.image_column!r} of {path}"
    width, size = column.type.byte_width, cfg.image_size
    if size is None or width % (size * size):
        raise ConfigError(
            None, f"{where} holds rows of {width} raw bytes: set data.image_size to their square side (C·side² bytes a row)", within=None
        )
    pixels = np.frombuffer(column.buffers()[1], dtype=np.uint8, count=len(column) * width, offset=column.offset * width)
    return pixels.reshape(len(column), width // (size * size), size, size).copy()


def load_tokenizer(path: str) -> Any:
    """The Hugging Face tokenizer saved (``save_pretrained``) in the directory ``path`` (``data.tokenizer``),
    read from local files only. Needs transformers (``pip install 'fedray[hf]'``), imported here so that
    runs without a tokenizer never load it."""
    directory = existing_path(path, "data.tokenizer", "tokenizer", directory=True)
    try:
        import transformers
    except ImportError:
        raise ConfigError(
            "data.tokenizer", f"reading the tokenizer {path} needs the transformers package: pip install 'fedray[hf]'", within=None
        ) from None
    try:
        return transformers.AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as error:  # no tokenizer files, an unknown or damaged format
        raise ConfigError(
            "data.tokenizer",
            f"cannot load a tokenizer from {path}: {(str(error).strip().splitlines() or [type(error).__name__])[0][:300]}",
            within=None,
        ) from None


def tokenized(tokenizer: Any, texts: list[str], end_of_row: bool) -> list[np.ndarray]:
    """Every text's int64 token ids. ``end_of_row``: without the tokenizer's own special tokens, each
    text followed by its end-of-text token (where it has one), as texts are joined into one stream;
    otherwise with them, as a model trained with the tokenizer saw single texts."""
    if end_of_row:
        ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
        end = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
        return [np.asarray(row + end, dtype=np.int64) for row in ids]
    return [np.asarray(row, dtype=np.int64) for row in tokenizer(texts)["input_ids"]]


def _encoded_sequences(
    cfg: DataConfig, tables: dict[str, Any], paths: dict[str, tuple[Path, str]], end_of_row: bool
) -> tuple[dict[str, list[np.ndarray]], int | None]:
    """The sequence column of every split as one int64 id array a row, and the vocabulary size: text
    through ``data.tokenizer`` (its vocabulary) or as characters (the training text's, see the module
    docstring; ``end_of_row``: a newline ends every row), integer lists as given (the tokenizer's
    vocabulary where one is set, which every id must then be in; else None, the largest id decides)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    columns = {split: _column(table, cfg.sequence_column, "data.sequence_column", paths[split][0]) for split, table in tables.items()}
    tokenizer = load_tokenizer(cfg.tokenizer) if cfg.tokenizer is not None else None
    text = pa.types.is_string(columns["train"].type) or pa.types.is_large_string(columns["train"].type)
    vocab_size = None if tokenizer is None else len(tokenizer)
    if text and tokenizer is None:
        alphabet = alphabet_of("".join(columns["train"].to_pylist()) + ("\n" if end_of_row else ""))
        vocab_size = vocab_size_of(alphabet)
    sequences: dict[str, list[np.ndarray]] = {}
    for split, column in columns.items():
        path = paths[split][0]
        if text and (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
            texts = column.to_pylist()
            if tokenizer is not None:
                sequences[split] = tokenized(tokenizer, texts, end_of_row)
            else:
                sequences[split] = [encode_characters(text + "\n" if end_of_row else text, alphabet) for text in texts]
        elif (
            not text
            and (pa.types.is_list(column.type) or pa.types.is_large_list(column.type))
            and pa.types.is_integer(column.type.value_type)
        ):
            lengths = pc.list_value_length(column).to_numpy()
            values = column.flatten().to_numpy().astype(np.int64)
            sequences[split] = np.split(values, np.cumsum(lengths)[:-1])
            bad = (values < 0) | (values >= (vocab_size if vocab_size is not None else np.iinfo(np.int64).max))
            if bad.any():
                row = int(pc.list_parent_indices(column).to_numpy()[np.argmax(bad)])
                allowed = f"0..{vocab_size - 1} (the vocabulary of data.tokenizer)" if vocab_size is not None else ">= 0"
                raise ConfigError(
                    "data.sequence_column",
                    f"row {row} of {path} holds the token id {values[np.argmax(bad)]}; ids must be {allowed}",
                    within=None,
                )
        else:
            raise ConfigError(
                "data.sequence_column",
                f"column {cfg.sequence_column!r} of {path} holds {column.type}; "
                "expected lists of integers or text (like the training file's)",
                within=None,
            )
    return sequences, vocab_size


def _table_sequences(
    cfg: DataConfig, tables: dict[str, Any], paths: dict[str, tuple[Path, str]]
) -> tuple[dict[str, np.ndarray], int | None]:
    """The sequence column of every split as left-padded int64 ``[N, T]`` token ids, and the
    vocabulary size (text: its characters or the tokenizer's; integer lists: None, the largest id decides).

    Without ``data.seq_len`` every row is padded to the longest, which is refused past
    ``unset_bound`` tokens: one outlying row (a whole book in a column of sentences) would pad every
    row to its length, N × its length × 8 bytes. The error names the longest row and its length."""
    unset_bound = 4096  # tokens a row may have when data.seq_len is not set
    sequences, vocab_size = _encoded_sequences(cfg, tables, paths, end_of_row=False)
    longest = max(len(sequence) for split_sequences in sequences.values() for sequence in split_sequences)
    if cfg.seq_len is None and longest > unset_bound:
        split = next(split for split, rows in sequences.items() if any(len(row) == longest for row in rows))
        row = next(index for index, sequence in enumerate(sequences[split]) if len(sequence) == longest)
        raise ConfigError(
            "data.seq_len",
            f"not set, and row {row} of {paths[split][0]} has {longest} tokens: every row would be padded to that "
            f"(more than {unset_bound} tokens is refused without data.seq_len); set data.seq_len to the length rows are "
            "padded to (a longer row is an error), or shorten or drop that row",
            within=None,
        )
    seq_len = cfg.seq_len if cfg.seq_len is not None else longest
    padded = {}
    for split, split_sequences in sequences.items():
        lengths = np.array([len(sequence) for sequence in split_sequences])
        if (lengths > seq_len).any():
            row = int(np.argmax(lengths > seq_len))
            raise ConfigError(
                "data.seq_len", f"row {row} of {paths[split][0]} has {lengths[row]} tokens, more than data.seq_len={seq_len}", within=None
            )
        array = np.full((len(split_sequences), seq_len), PAD_ID, dtype=np.int64)
        filled = np.arange(seq_len) >= (seq_len - lengths)[:, None]  # left padding: the tokens end the row
        array[filled] = np.concatenate(split_sequences) if split_sequences else []
        padded[split] = array
    return padded, vocab_size


def token_windows(tokens: np.ndarray, bounds: np.ndarray, seq_len: int, stride: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Next-token windows of the streams ``tokens[bounds[i]:bounds[i+1]]``: inputs ``x`` and targets
    ``y`` (both int64 ``[W, seq_len]``, ``y`` the tokens one position on) and the number of windows of
    every stream.

    A stream of L tokens gets windows starting every ``stride`` tokens while a window has a target,
    up to the first that reaches the stream's end: those that fit are ``seq_len`` + 1 tokens of the
    stream, the last may run past its end, where ``x`` is :data:`PAD_ID` and ``y``
    :data:`~fedray.tasks.IGNORE_INDEX` (so a stream shorter than a window is still learnt from, and
    no window reads two streams)."""
    lengths = np.diff(bounds)
    reaching_end = -(-np.maximum(lengths - seq_len - 1, 0) // stride)  # the first window that reaches the end
    with_a_target = np.where(lengths >= 2, -(-(lengths - 1) // stride), 0)
    counts = np.minimum(reaching_end + 1, with_a_target)
    stream = np.repeat(np.arange(len(counts)), counts)
    first = np.repeat(np.cumsum(counts) - counts, counts)
    offsets = (np.arange(int(counts.sum())) - first) * stride  # each window's start within its stream
    positions = offsets[:, None] + np.arange(seq_len)
    ends = lengths[stream][:, None]
    flat = bounds[stream][:, None] + positions
    last = max(len(tokens) - 1, 0)
    x = np.where(positions < ends, tokens[np.minimum(flat, last)], PAD_ID)
    y = np.where(positions + 1 < ends, tokens[np.minimum(flat + 1, last)], IGNORE_INDEX)
    return x.astype(np.int64), y.astype(np.int64), counts


def _language_model_windows(
    cfg: DataConfig,
    tables: dict[str, Any],
    paths: dict[str, tuple[Path, str]],
    client_ids: dict[str, np.ndarray],
    seed: int,
    columns: dict[str, list[str]],
) -> UserData:
    """A language model's windows of a table (see the module docstring): every client's rows joined
    into one token stream, cut by :func:`token_windows` into ``data.seq_len`` tokens every
    ``data.stride``; the test rows are ``data.test_path``'s, or a seeded ``data.test_fraction`` share
    of the rows (of every client's rows with ``data.partition=natural``), so no test text is trained on."""
    sequences, vocab_size = _encoded_sequences(cfg, tables, paths, end_of_row=True)
    rows = {split: np.arange(len(split_sequences)) for split, split_sequences in sequences.items()}
    if "test" not in tables:
        rows["train"], rows["test"] = test_split(len(sequences["train"]), client_ids.get("train"), cfg, seed)
        sequences["test"] = sequences["train"]
        if "train" in client_ids:
            client_ids["test"] = client_ids["train"]
    windows = {}
    for split in ("train", "test"):
        if split in client_ids:
            names, owner = np.unique(client_ids[split], return_inverse=True)
            owner = owner.reshape(-1)
        else:  # one stream of all rows
            names, owner = None, np.zeros(len(sequences[split]), dtype=np.int64)
        order = rows[split][np.argsort(owner[rows[split]], kind="stable")]  # by client, then in the file's order
        pieces = [sequences[split][row] for row in order]
        tokens = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
        lengths = [len(piece) for piece in pieces]
        stream_lengths = np.bincount(owner[order], weights=lengths, minlength=1 if names is None else len(names)).astype(np.int64)
        x, y, counts = token_windows(tokens, np.concatenate([[0], np.cumsum(stream_lengths)]), cfg.seq_len, cfg.stride or cfg.seq_len)
        if len(x) == 0 and split == "test" and "test" not in tables:
            raise ConfigError(
                "data.test_fraction",
                f"the held-out rows of {paths['train'][0]} hold no text to predict (with data.partition=natural, a client's only row "
                f"stays in training); give the test text in data.test_path",
                within=None,
            )
        if len(x) == 0:
            raise ConfigError(paths[split][1], f"{paths[split][0]} holds no text to predict (no client's text has two tokens)", within=None)
        windows[split] = (x, y, None if names is None else np.repeat(names, counts))
    return UserData(
        windows["train"][0],
        windows["train"][1],
        windows["test"][0],
        windows["test"][1],
        client_ids_train=windows["train"][2],
        modality="tokens",
        vocab_size=vocab_size,
        columns=columns,
    )


def _table_features(names: list[str], tables: dict[str, Any], paths: dict[str, tuple[Path, str]]) -> dict[str, np.ndarray]:
    """The feature columns ``names`` of every split as float32 ``[N, D]`` (infinite values are left to
    :func:`~fedray.data.user.checked_user_data`, which refuses them)."""
    import pyarrow as pa

    features = {}
    for split, table in tables.items():
        path = paths[split][0]
        columns = []
        for name in names:
            column = _column(table, name, "data.feature_columns", path)
            if not (pa.types.is_integer(column.type) or pa.types.is_floating(column.type)):
                raise ConfigError("data.feature_columns", f"column {name!r} of {path} holds {column.type}, not numbers", within=None)
            columns.append(column.to_numpy(zero_copy_only=False).astype(np.float32))
        features[split] = np.stack(columns, axis=1)
    return features
