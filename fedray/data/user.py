"""Your own data as arrays: :class:`UserData`, its checks, and ``data.name: package.module:Name``.

Every loader of data that fedray did not curate (an image folder, a Parquet/CSV table, the function a
config names, the built-in text and tabular benchmarks) produces a :class:`UserData`, and
:func:`checked_user_data` checks it once against the run's task (``data.task``, :mod:`fedray.tasks`):
equal lengths, targets in the task's form (the task's own ``check_targets``), class labels in range,
finite features, token ids in the vocabulary. A failure is a :class:`~fedray.config.ConfigError` of
one line that names where the data came from (``source``: the config key and file), so it stops
``fedray run`` before Ray starts.

``data.name: package.module:Name`` names a function or class that is called without arguments and
returns a :class:`UserData`, or a pair ``(train, test)`` of torch ``Dataset`` objects (``test`` may be
``None``) whose items are ``(x, target)``; fedray then reads every item once
(:func:`materialize_torch_datasets`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from fedray.config import ConfigError, import_reference
from fedray.data.base import MODALITIES
from fedray.tasks import IGNORE_INDEX, LanguageModeling, Task

#: The most classes (or token ids) that the largest label (or id) may imply without an explicit
#: ``num_classes`` (``vocab_size``): a stray value such as 10**12 in a label column would otherwise size
#: the partitioners' per-class arrays and the model's output layer.
MAX_IMPLIED_CLASSES = 100_000
MAX_IMPLIED_VOCABULARY = 1_000_000


@dataclass(frozen=True)
class UserData:
    """Train (and optionally test) arrays of one modality, as a ``data.name: package.module:Name``
    function returns them.

    - ``x_train``/``x_test``: images uint8 ``[N, C, H, W]``, token ids (integers) ``[N, T]`` or
      features (floats) ``[N, D]``;
    - ``y_train``/``y_test``: the targets of the run's task (``data.task``, :mod:`fedray.tasks`):
      integer labels ``[N]`` in ``0..num_classes-1`` (classification), numbers ``[N]`` or ``[N, K]``
      (regression), 0/1 ``[N, L]`` (multilabel), or the next token ids ``[N, T]`` of ``x``'s windows
      (language modelling; :data:`~fedray.tasks.IGNORE_INDEX` where there is none);
    - ``client_ids_train``: each training sample's client (ints or strings), for
      ``data.partition: natural``;
    - ``modality``: ``"image"``, ``"tokens"`` or ``"features"`` (None: uint8 4-d arrays are images,
      integer 2-d arrays tokens, float 2-d arrays features);
    - ``num_classes``: the model's output size (None: the largest label + 1 of a classification, at
      most :data:`MAX_IMPLIED_CLASSES`; the K outputs of a regression; the L labels of a multilabel
      task; the vocabulary of a language model) and, for tokens, ``vocab_size`` (None: the largest id
      + 1, at most :data:`MAX_IMPLIED_VOCABULARY`);
    - ``columns``: for data read from a table, the columns it was made of, by role: ``inputs`` (the
      feature, image or sequence columns), ``targets`` (the label or target columns) and, with
      ``data.client_column``, ``client``; empty for other sources. It is what the run records of the
      table (``DatasetInfo.columns``), so that a result can be traced to the columns it learnt from.

    Without ``x_test`` the test set is a seeded ``data.test_fraction`` share of the training set
    (with a natural partition: of every client's samples).
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray | None = None
    y_test: np.ndarray | None = None
    client_ids_train: np.ndarray | None = None
    modality: str | None = None
    num_classes: int | None = None
    vocab_size: int | None = None
    columns: dict[str, list[str]] = field(default_factory=dict)


def load_user_reference(reference: str, task: type[Task]) -> UserData:
    """Call the function or class ``data.name`` names and check what it returns for ``task``."""
    source = f"data.name={reference}"
    factory = import_reference(reference, "data.name")
    if not callable(factory):
        raise ConfigError(
            source, f"{type(factory).__name__} is not callable; name a function or class returning fedray.data.UserData", within=None
        )
    try:
        returned = factory()
    except ConfigError:
        raise
    except Exception as error:  # the user's code failing is a bad input, not a fedray crash
        raise ConfigError(source, f"raised {type(error).__name__}: {_first_line(error)}", within=None) from None
    if isinstance(returned, tuple) and len(returned) == 2 and not isinstance(returned[0], np.ndarray):
        returned = materialize_torch_datasets(returned[0], returned[1], source)
    if not isinstance(returned, UserData):
        raise ConfigError(
            source,
            f"returned {type(returned).__name__}; expected fedray.data.UserData or a (train, test) pair of torch datasets",
            within=None,
        )
    return checked_user_data(returned, source, task)


def materialize_torch_datasets(train: Any, test: Any, source: str) -> UserData:
    """Read every ``(x, target)`` item of two torch datasets (``test`` may be None) once into arrays.

    ``x`` may be a tensor, a numpy array or a PIL image: a PIL image or a 3-d uint8 ``[H, W, C]``
    array is an image (made ``[C, H, W]``); a 3-d float tensor is an image on the 0..1 scale (as
    torchvision's ``ToTensor`` makes it) and is quantised to uint8; a 1-d array is token ids
    (integers) or features (floats). ``target`` is a number (a label or a regression target) or a
    tensor or array (a target vector), stacked as they are for the task to check.
    """

    def read(dataset: Any, split: str) -> tuple[np.ndarray, np.ndarray]:
        try:
            items = [dataset[i] for i in range(len(dataset))]
        except Exception as error:
            raise ConfigError(
                source, f"reading the {split} dataset raised {type(error).__name__}: {_first_line(error)}", within=None
            ) from None
        if not items:
            raise ConfigError(source, f"the {split} dataset is empty", within=None)
        inputs = np.stack([_sample_array(x) for x, _ in items])
        targets = np.stack([np.asarray(y.numpy() if hasattr(y, "numpy") else y) for _, y in items])
        return inputs, targets

    x_train, y_train = read(train, "train")
    x_test, y_test = read(test, "test") if test is not None else (None, None)
    return UserData(x_train, y_train, x_test, y_test)


def _sample_array(x: Any) -> np.ndarray:
    """One dataset item's input as the array form of its modality (see materialize_torch_datasets)."""
    if hasattr(x, "getbands"):  # a PIL image
        array = np.asarray(x)
        return array[None] if array.ndim == 2 else array.transpose(2, 0, 1)
    array = x.numpy() if hasattr(x, "numpy") else np.asarray(x)
    if array.ndim == 3 and np.issubdtype(array.dtype, np.floating):
        return np.rint(np.clip(array, 0, 1) * 255).astype(np.uint8)
    if array.ndim == 3 and array.dtype == np.uint8 and array.shape[-1] in (1, 3) and array.shape[0] not in (1, 3):
        return array.transpose(2, 0, 1)
    return array


def checked_user_data(data: UserData, source: str, task: type[Task]) -> UserData:
    """``data`` with its arrays in their modality's form (uint8 images, int64 tokens, float32
    features) and its targets in ``task``'s (``task.check_targets``), ``modality``, ``num_classes``
    and ``vocab_size`` filled in; raises a one-line :class:`ConfigError` starting with ``source`` for
    any bad input."""
    modality = data.modality or _infer_modality(data.x_train, source)
    if modality not in MODALITIES:
        raise ConfigError(source, f"modality {modality!r} is not one of {', '.join(MODALITIES)}", within=None)
    if (data.x_test is None) != (data.y_test is None):
        raise ConfigError(source, "give both x_test and y_test, or neither", within=None)
    splits = {"train": (data.x_train, data.y_train)}
    if data.x_test is not None:
        splits["test"] = (data.x_test, data.y_test)
    converted: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for split, (x, y) in splits.items():
        x, y = np.asarray(x), np.asarray(y)
        if y.ndim == 0 or x.shape[:1] != y.shape[:1]:
            raise ConfigError(
                source, f"x_{split} has {len(x)} rows but y_{split} has shape {y.shape}; they must have the same length", within=None
            )
        if len(y) == 0:
            raise ConfigError(source, f"the {split} split is empty", within=None)
        converted[split] = (_inputs_of(x, modality, f"{source}: x_{split}"), _targets_of(y, task, f"{source}: y_{split}"))
    x_train, y_train = converted["train"]
    for split, (x, y) in converted.items():
        if x.shape[1:] != x_train.shape[1:]:
            raise ConfigError(source, f"x_{split} samples have shape {x.shape[1:]}, x_train samples {x_train.shape[1:]}", within=None)
        if y.shape[1:] != y_train.shape[1:]:
            raise ConfigError(source, f"y_{split} targets have shape {y.shape[1:]}, y_train targets {y_train.shape[1:]}", within=None)
    client_ids = data.client_ids_train
    if client_ids is not None:
        client_ids = np.asarray(client_ids)
        if client_ids.shape != y_train.shape[:1]:
            raise ConfigError(
                source,
                f"client_ids_train has shape {client_ids.shape}, y_train {y_train.shape}; they must have the same length",
                within=None,
            )
        if client_ids.dtype == object and any(value is None for value in client_ids):
            raise ConfigError(source, "client_ids_train has missing values", within=None)
    num_classes = data.num_classes
    if task.class_labels:
        if num_classes is None:
            num_classes = _implied_count({"y_train": y_train}, MAX_IMPLIED_CLASSES, "label", "classes", "UserData.num_classes", source)
        problem = label_range_problem(np.concatenate([y for _, y in converted.values()]), num_classes)
        if problem is not None:
            raise ConfigError(source, problem, within=None)
    vocab_size = None
    if modality == "tokens":
        vocab_size = data.vocab_size
        if vocab_size is None:
            inputs = {f"x_{split}": x for split, (x, _) in converted.items()}
            vocab_size = _implied_count(inputs, MAX_IMPLIED_VOCABULARY, "token id", "token ids", "UserData.vocab_size", source)
        largest_id = max(int(x.max()) for x, _ in converted.values())
        if largest_id >= vocab_size:
            raise ConfigError(source, f"token id {largest_id} is out of range for a vocabulary of {vocab_size}", within=None)
    if issubclass(task, LanguageModeling):
        num_classes = _checked_next_tokens(converted, modality, vocab_size, num_classes, source)
    elif num_classes is None:
        num_classes = int(np.prod(y_train.shape[1:]))  # a regression's outputs, a multilabel task's labels
    test = converted.get("test", (None, None))
    return replace(
        data,
        x_train=x_train,
        y_train=y_train,
        x_test=test[0],
        y_test=test[1],
        client_ids_train=client_ids,
        modality=modality,
        num_classes=num_classes,
        vocab_size=vocab_size,
    )


def _targets_of(y: np.ndarray, task: type[Task], what: str) -> np.ndarray:
    """``y`` in ``task``'s stored form; its refusal as a ConfigError (the task's line starts with ``what``)."""
    try:
        return task.check_targets(y, what)
    except ValueError as error:
        raise ConfigError(None, _first_line(error), within=None) from None


def _implied_count(arrays: dict[str, np.ndarray], limit: int, value_name: str, count_name: str, explicit: str, source: str) -> int:
    """The largest of the non-negative integers in ``arrays`` (by name, e.g. ``y_train``) + 1,
    refused (with the array and row of the value) from ``limit`` on: such a value is far more often a
    stray entry than a real class or token id, and it would size arrays and layers."""
    for name, values in arrays.items():
        largest = int(values.max())
        if largest >= limit:
            row = int(np.argmax(values.reshape(len(values), -1).max(axis=1)))
            raise ConfigError(
                f"{source}: {name}",
                f"{value_name} {largest} in row {row} would make {largest + 1:,} {count_name}; more than {limit:,} need an explicit "
                f"{explicit} (is it a stray value?)",
                within=None,
            )
    return max(int(values.max()) for values in arrays.values()) + 1


def _checked_next_tokens(
    converted: dict[str, tuple[np.ndarray, np.ndarray]], modality: str, vocab_size: int | None, num_classes: int | None, source: str
) -> int:
    """The output size of a language model (``num_classes``, by default the vocabulary), with every
    split's targets checked to be the next token ids of its windows: one per input position, each in
    the vocabulary or :data:`~fedray.tasks.IGNORE_INDEX`."""
    x_train, y_train = converted["train"]
    if modality != "tokens" or vocab_size is None:
        raise ConfigError(source, f"language modelling reads token ids [N, T]; x_train holds {modality}", within=None)
    if y_train.shape[1:] != x_train.shape[1:]:
        raise ConfigError(
            source,
            f"y_train has shape {y_train.shape}; language modelling needs one next token per input position, {x_train.shape}",
            within=None,
        )
    size = vocab_size if num_classes is None else num_classes
    for split, (_, y) in converted.items():
        bad = (y != IGNORE_INDEX) & ((y < 0) | (y >= size))
        if bad.any():
            row, position = (int(i) for i in np.argwhere(bad)[0])
            raise ConfigError(
                source,
                f"y_{split} row {row} position {position}: token id {int(y[row, position])} is out of range for {size} outputs "
                f"(0..{size - 1}, or {IGNORE_INDEX} where there is no next token)",
                within=None,
            )
    return size


def label_range_problem(labels: np.ndarray, num_classes: int) -> str | None:
    """Why non-negative integer ``labels`` are not all below ``num_classes`` (None: they are): the
    range check of every dataset's labels, the user's (:func:`checked_user_data`) and those read from
    the built-in datasets' files (:mod:`fedray.data.idx`)."""
    largest = int(labels.max())
    if largest >= num_classes:
        return f"label {largest} is out of range for {num_classes} classes (labels must be 0..{num_classes - 1})"
    return None


def _infer_modality(x: Any, source: str) -> str:
    x = np.asarray(x)
    if x.ndim == 4 and x.dtype == np.uint8:
        return "image"
    if x.ndim == 2 and np.issubdtype(x.dtype, np.integer):
        return "tokens"
    if x.ndim == 2 and np.issubdtype(x.dtype, np.floating):
        return "features"
    raise ConfigError(
        source,
        f"x_train is {x.dtype} {x.shape}; expected uint8 [N, C, H, W] images, integer [N, T] "
        f"tokens or float [N, D] features (or set modality)",
        within=None,
    )


def _inputs_of(x: np.ndarray, modality: str, what: str) -> np.ndarray:
    """``x`` in ``modality``'s array form, checked."""
    if modality == "image":
        if x.dtype != np.uint8 or x.ndim != 4:
            raise ConfigError(what, f"images must be uint8 [N, C, H, W], got {x.dtype} {x.shape}", within=None)
        return np.ascontiguousarray(x)
    if x.ndim != 2:
        raise ConfigError(
            what, f"{modality} must be a 2-d array [N, {'T' if modality == 'tokens' else 'D'}], got shape {x.shape}", within=None
        )
    if modality == "tokens":
        if not np.issubdtype(x.dtype, np.integer):
            raise ConfigError(what, f"token ids must be integers, got {x.dtype}", within=None)
        if x.size and int(x.min()) < 0:
            raise ConfigError(what, f"token ids must be >= 0, got {int(x.min())}", within=None)
        return np.ascontiguousarray(x, dtype=np.int64)
    if not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)):
        raise ConfigError(what, f"features must be numbers, got {x.dtype}", within=None)
    features = np.ascontiguousarray(x, dtype=np.float32)
    bad = ~np.isfinite(features)
    if bad.any():
        row, column = (int(i) for i in np.argwhere(bad)[0])
        raise ConfigError(what, f"{int(bad.sum())} NaN or infinite feature value(s), the first in row {row}, column {column}", within=None)
    return features


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [""])[0][:300]
