"""Your own data from files, without code: an image folder and a Parquet or CSV table.

``data.name: imagefolder`` reads torchvision's ``ImageFolder`` layout under ``data.path``: one
folder per class (class index = position of its name in sorted order), either in ``train/`` and
``test/`` subfolders or as one tree that a seeded ``data.test_fraction`` split divides
(``data.test_path`` names a separate test folder). Files without an image extension are skipped, and
so are links to folders inside a class folder (:func:`image_files`).

``data.name: table`` reads the ``.parquet`` or ``.csv`` file ``data.path`` (and ``data.test_path``,
with the same columns) with pyarrow, or a Hugging Face ``datasets`` dataset saved with
``save_to_disk`` (``data.path`` its directory; its ``train`` and ``test`` splits; the ``hf`` extra). ``data.label_column`` (default ``label``) holds integer labels;
the inputs are, in this order of precedence:

- ``data.image_column``: encoded PNG/JPEG bytes (or a struct with a ``bytes`` field, as Hugging Face
  datasets store images), raw pixel bytes (fixed-size binary, C·H·W a row) or pixel lists (flat,
  ``[H, W]`` or ``[C, H, W]``) → images;
- ``data.sequence_column``: lists of integers → tokens as given (0 pads shorter sequences), or text
  → characters, id 0 padding, 1 a character not seen in the training file, 2… the training file's
  characters in code-point order;
- otherwise ``data.feature_columns`` (default: every other numeric column) → features.

``data.client_column`` gives every row's client, for ``data.partition: natural``.

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
from fedray.data.user import UserData, checked_user_data

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
    return checked_user_data(data, f"data.path={cfg.path}")


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
def load_table(cfg: DataConfig) -> UserData:
    """``data.name: table`` (see the module docstring)."""
    if cfg.path is not None and is_saved_hf_dataset(Path(cfg.path)):
        tables, paths = _read_saved_hf_dataset(Path(cfg.path))
        train_path = paths["train"][0]
    else:
        train_path = existing_path(cfg.path, "data.path", cfg.name)
        test_path = existing_path(cfg.test_path, "data.test_path", cfg.name) if cfg.test_path is not None else None
        paths = {"train": (train_path, "data.path"), **({"test": (test_path, "data.test_path")} if test_path else {})}
        tables = {split: _read_table(path, key) for split, (path, key) in paths.items()}
    train = tables["train"]
    client_ids = None
    if cfg.client_column is not None:
        client_ids = _column(train, cfg.client_column, "data.client_column", train_path)
        if client_ids.null_count:
            raise ConfigError(
                "data.client_column",
                f"column {cfg.client_column!r} of {train_path} has {client_ids.null_count} missing values",
                within=None,
            )
        client_ids = client_ids.to_numpy(zero_copy_only=False)
        client_ids = client_ids.astype(str) if client_ids.dtype == object else client_ids
    labels = {split: _labels(table, cfg.label_column, paths[split][0]) for split, table in tables.items()}
    vocab_size = None
    if cfg.image_column is not None:
        inputs = _table_images(cfg, tables, paths)
    elif cfg.sequence_column is not None:
        inputs, vocab_size = _table_sequences(cfg, tables, paths)
    else:
        inputs = _table_features(cfg, tables, paths)
    data = UserData(
        inputs["train"],
        labels["train"],
        inputs.get("test"),
        labels.get("test"),
        client_ids_train=client_ids,
        vocab_size=vocab_size,
    )
    return checked_user_data(data, f"data.path={cfg.path}")


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


def _labels(table: Any, name: str, path: Path) -> np.ndarray:
    import pyarrow as pa

    column = _column(table, name, "data.label_column", path)
    if not pa.types.is_integer(column.type):
        raise ConfigError("data.label_column", f"labels must be integers; column {name!r} of {path} holds {column.type}", within=None)
    if column.null_count:
        raise ConfigError("data.label_column", f"column {name!r} of {path} has {column.null_count} missing labels", within=None)
    return column.to_numpy()


def _table_images(cfg: DataConfig, tables: dict[str, Any], paths: dict[str, tuple[Path, str]]) -> dict[str, np.ndarray]:
    """The image column of every split: pixel arrays as they are, or encoded images decoded (and cached)."""
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
                "data.image_column", f"column {cfg.image_column!r} of {path} has {column.null_count} missing images", within=None
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
    if column.null_count:
        raise ConfigError(None, f"{where} has {column.null_count} missing images", within=None)
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
    if column.null_count:
        raise ConfigError(None, f"{where} has {column.null_count} missing images", within=None)
    width, size = column.type.byte_width, cfg.image_size
    if size is None or width % (size * size):
        raise ConfigError(
            None, f"{where} holds rows of {width} raw bytes: set data.image_size to their square side (C·side² bytes a row)", within=None
        )
    pixels = np.frombuffer(column.buffers()[1], dtype=np.uint8, count=len(column) * width, offset=column.offset * width)
    return pixels.reshape(len(column), width // (size * size), size, size).copy()


def _table_sequences(
    cfg: DataConfig, tables: dict[str, Any], paths: dict[str, tuple[Path, str]]
) -> tuple[dict[str, np.ndarray], int | None]:
    """The sequence column of every split as left-padded int64 ``[N, T]`` token ids, and the
    vocabulary size (text: its characters; integer lists: None, the largest id decides)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    columns = {split: _column(table, cfg.sequence_column, "data.sequence_column", paths[split][0]) for split, table in tables.items()}
    sequences: dict[str, list[np.ndarray]] = {}
    vocab_size = None
    train_type = columns["train"].type
    if pa.types.is_string(train_type) or pa.types.is_large_string(train_type):
        alphabet = alphabet_of("".join(columns["train"].drop_null().to_pylist()))
        vocab_size = vocab_size_of(alphabet)
    for split, column in columns.items():
        path = paths[split][0]
        if column.null_count:
            raise ConfigError(
                "data.sequence_column", f"column {cfg.sequence_column!r} of {path} has {column.null_count} missing values", within=None
            )
        if vocab_size is not None and (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
            sequences[split] = [encode_characters(text, alphabet) for text in column.to_pylist()]
        elif (
            vocab_size is None
            and (pa.types.is_list(column.type) or pa.types.is_large_list(column.type))
            and pa.types.is_integer(column.type.value_type)
        ):
            lengths = pc.list_value_length(column).to_numpy()
            values = column.flatten().to_numpy().astype(np.int64)
            sequences[split] = np.split(values, np.cumsum(lengths)[:-1])
        else:
            raise ConfigError(
                "data.sequence_column",
                f"column {cfg.sequence_column!r} of {path} holds {column.type}; expected lists of integers or text (like the training file's)",
                within=None,
            )
    longest = max(len(sequence) for split_sequences in sequences.values() for sequence in split_sequences)
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


def _table_features(cfg: DataConfig, tables: dict[str, Any], paths: dict[str, tuple[Path, str]]) -> dict[str, np.ndarray]:
    """The feature columns of every split as float32 ``[N, D]`` (missing values become NaN, which
    :func:`~fedray.data.user.checked_user_data` refuses)."""
    import pyarrow as pa

    train = tables["train"]
    if cfg.feature_columns is not None:
        names = list(cfg.feature_columns)
    else:
        excluded = {cfg.label_column, cfg.client_column}
        names = [
            field.name
            for field in train.schema
            if field.name not in excluded and (pa.types.is_integer(field.type) or pa.types.is_floating(field.type))
        ]
        if not names:
            raise ConfigError(
                "data.feature_columns", f"{paths['train'][0]} has no numeric column besides the label (and client) column", within=None
            )
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
