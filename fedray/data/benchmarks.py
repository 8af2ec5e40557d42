"""Two benchmarks beyond images that need no download: next-character prediction on the Python
standard library's source (``pystdlib_chars``) and scikit-learn's bundled tables (``breast_cancer``,
``wine``).

``pystdlib_chars`` is naturally partitioned, one client per top-level module of the standard library
(every ``*.py`` file directly under ``sysconfig.get_paths()["stdlib"]``, sorted by name, that has
more than ``data.seq_len`` characters), in the spirit of LEAF's Shakespeare (one client per role).
A module's text is cut into consecutive non-overlapping windows of ``data.seq_len`` (default 80)
characters; a window's label is the character that follows it. The vocabulary is fixed: id 0
(padding, unused), 1 (any character outside ``string.printable``), then the 100 printable ASCII
characters in code-point order, so 102 token ids and 102 classes. The client ids are the module
names. Which modules exist depends on the Python version (168 on CPython 3.11).

``breast_cancer`` (569 samples, 30 features, 2 classes) and ``wine`` (178 samples, 13 features, 3
classes) are scikit-learn's copies of the UCI tables, as float32 features.
"""

from __future__ import annotations

import string
import sysconfig
from pathlib import Path

import numpy as np

from fedray.config import DataConfig
from fedray.data.formats import alphabet_of, encode_characters, vocab_size_of
from fedray.data.user import UserData, checked_user_data

STDLIB_SEQ_LEN = 80  # data.seq_len's default for pystdlib_chars
STDLIB_ALPHABET = alphabet_of(string.printable)


def stdlib_module_files() -> list[Path]:
    """The top-level module files of this Python's standard library, sorted by name."""
    return sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))


def load_pystdlib_chars(cfg: DataConfig) -> UserData:
    """Windows of ``data.seq_len`` characters of every top-level stdlib module, labelled with the
    next character, with the module name as client id."""
    seq_len = cfg.seq_len if cfg.seq_len is not None else STDLIB_SEQ_LEN
    inputs, labels, client_ids = [], [], []
    for path in stdlib_module_files():
        ids = encode_characters(path.read_text(encoding="utf-8", errors="replace"), STDLIB_ALPHABET)
        windows = (ids.shape[0] - 1) // seq_len
        if windows == 0:
            continue
        inputs.append(ids[: windows * seq_len].reshape(windows, seq_len))
        labels.append(ids[seq_len : (windows + 1) * seq_len : seq_len])
        client_ids.append(np.full(windows, path.stem))
    vocab_size = vocab_size_of(STDLIB_ALPHABET)
    data = UserData(
        np.concatenate(inputs),
        np.concatenate(labels),
        client_ids_train=np.concatenate(client_ids),
        modality="tokens",
        num_classes=vocab_size,
        vocab_size=vocab_size,
    )
    return checked_user_data(data, f"data.name={cfg.name}")


def load_sklearn_table(cfg: DataConfig) -> UserData:
    """``breast_cancer`` or ``wine`` from scikit-learn's bundled copy, as float32 features."""
    from sklearn import datasets

    bunch = {"breast_cancer": datasets.load_breast_cancer, "wine": datasets.load_wine}[cfg.name]()
    data = UserData(bunch.data.astype(np.float32), bunch.target.astype(np.int64), modality="features")
    return checked_user_data(data, f"data.name={cfg.name}")
