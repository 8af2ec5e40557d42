"""Benchmarks beyond images that need no download: next-character prediction and language modelling on
the Python standard library's source (``pystdlib_chars``) and scikit-learn's bundled tables
(``breast_cancer``, ``wine``: classification; ``diabetes``: regression).

``pystdlib_chars`` is naturally partitioned, one client per top-level module of the standard library
(every ``*.py`` file directly under ``sysconfig.get_paths()["stdlib"]``, sorted by name, that has
more than ``data.seq_len`` characters), in the spirit of LEAF's Shakespeare (one client per role).
The vocabulary is fixed: id 0 (padding), 1 (any character outside ``string.printable``), then the
100 printable ASCII characters in code-point order, so 102 token ids (with ``data.tokenizer``, the
tokenizer's ids and vocabulary instead). The client ids are the module names. Which modules exist
depends on the Python version (168 on CPython 3.11).

- ``data.task: classification``: a module's text is cut into consecutive non-overlapping windows of
  ``data.seq_len`` (default 80) characters; a window's label is the character that follows it (102
  classes).
- ``data.task: language_modeling``: the first ``1 − data.test_fraction`` of every module's text is its
  training text and the rest its test text (a held-out tail, so no test character is trained on,
  whatever the stride), each cut into windows of ``data.seq_len`` + 1 characters every
  ``data.stride`` (default ``data.seq_len``) characters (:func:`fedray.data.formats.token_windows`):
  the inputs are a window's first ``data.seq_len`` characters and the targets the next ones.

``breast_cancer`` (569 samples, 30 features, 2 classes) and ``wine`` (178 samples, 13 features, 3
classes) are scikit-learn's copies of the UCI tables, and ``diabetes`` (442 patients, 10
standardised features, one target: disease progression a year later) that of Efron et al.'s
diabetes study, as float32 features.
"""

from __future__ import annotations

import string
import sysconfig
from pathlib import Path

import numpy as np

from fedray.config import DataConfig
from fedray.data.formats import alphabet_of, encode_characters, load_tokenizer, token_windows, tokenized, vocab_size_of
from fedray.data.user import UserData, checked_user_data
from fedray.tasks import LanguageModeling, task_class

STDLIB_SEQ_LEN = 80  # data.seq_len's default for pystdlib_chars
STDLIB_ALPHABET = alphabet_of(string.printable)


def stdlib_module_files() -> list[Path]:
    """The top-level module files of this Python's standard library, sorted by name."""
    return sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))


def load_pystdlib_chars(cfg: DataConfig) -> UserData:
    """The windows of every top-level stdlib module (see the module docstring), with the module name
    as client id."""
    task = task_class(cfg.task)
    seq_len = cfg.seq_len if cfg.seq_len is not None else STDLIB_SEQ_LEN
    paths = stdlib_module_files()
    texts = [path.read_text(encoding="utf-8", errors="replace") for path in paths]
    if cfg.tokenizer is not None:
        tokenizer = load_tokenizer(cfg.tokenizer)
        streams, vocab_size = tokenized(tokenizer, texts, end_of_row=True), len(tokenizer)
    else:
        streams, vocab_size = [encode_characters(text, STDLIB_ALPHABET) for text in texts], vocab_size_of(STDLIB_ALPHABET)
    names = np.array([path.stem for path in paths])
    source = f"data.name={cfg.name}"
    if issubclass(task, LanguageModeling):
        kept = [i for i, ids in enumerate(streams) if len(ids) > seq_len]  # the modules of the classification windows
        cuts = {i: len(streams[i]) - round(cfg.test_fraction * len(streams[i])) for i in kept}
        stride = cfg.stride or seq_len
        x_train, y_train, counts = _windows([streams[i][: cuts[i]] for i in kept], seq_len, stride)
        x_test, y_test, _ = _windows([streams[i][cuts[i] :] for i in kept], seq_len, stride)
        data = UserData(
            x_train, y_train, x_test, y_test, client_ids_train=np.repeat(names[kept], counts), modality="tokens", vocab_size=vocab_size
        )
        return checked_user_data(data, source, task)
    inputs, labels, client_ids = [], [], []
    for name, ids in zip(names, streams):
        windows = (ids.shape[0] - 1) // seq_len
        if windows == 0:
            continue
        inputs.append(ids[: windows * seq_len].reshape(windows, seq_len))
        labels.append(ids[seq_len : (windows + 1) * seq_len : seq_len])
        client_ids.append(np.full(windows, name))
    data = UserData(
        np.concatenate(inputs),
        np.concatenate(labels),
        client_ids_train=np.concatenate(client_ids),
        modality="tokens",
        num_classes=vocab_size,
        vocab_size=vocab_size,
    )
    return checked_user_data(data, source, task)


def _windows(streams: list[np.ndarray], seq_len: int, stride: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`~fedray.data.formats.token_windows` of one stream per module."""
    return token_windows(np.concatenate(streams), np.concatenate([[0], np.cumsum([len(ids) for ids in streams])]), seq_len, stride)


def load_sklearn_table(cfg: DataConfig) -> UserData:
    """``breast_cancer`` or ``wine`` from scikit-learn's bundled copy, as float32 features."""
    from sklearn import datasets

    bunch = {"breast_cancer": datasets.load_breast_cancer, "wine": datasets.load_wine}[cfg.name]()
    data = UserData(bunch.data.astype(np.float32), bunch.target.astype(np.int64), modality="features")
    return checked_user_data(data, f"data.name={cfg.name}", task_class(cfg.task))


def load_diabetes(cfg: DataConfig) -> UserData:
    """``diabetes`` from scikit-learn's bundled copy: float32 features and one regression target."""
    from sklearn.datasets import load_diabetes as load

    bunch = load()
    data = UserData(bunch.data.astype(np.float32), bunch.target.astype(np.float32), modality="features")
    return checked_user_data(data, f"data.name={cfg.name}", task_class(cfg.task))
