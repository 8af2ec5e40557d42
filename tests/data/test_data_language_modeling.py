"""Language modelling data (``data.task: language_modeling``): a text corpus table (Parquet and CSV written
with pandas) and token-id lists cut into next-token windows per client (x and y one token apart,
``data.stride``, padding past a stream's end), the test rows held out per client, a Hugging Face
tokenizer saved to a local directory, the standard library corpus (``pystdlib_chars``) as a language
modelling benchmark, and the bad inputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fedray.config import ConfigError, DataConfig
from fedray.data import build_federated_dataset, load_dataset
from fedray.data.benchmarks import STDLIB_ALPHABET, stdlib_module_files
from fedray.data.formats import alphabet_of, encode_characters, token_windows
from fedray.tasks import IGNORE_INDEX

# Three writers with a few lines each: the natural clients of a small corpus.
CORPUS = pd.DataFrame(
    {
        "writer": ["ann"] * 4 + ["bob"] * 3 + ["cyd"] * 5,
        "text": [
            "the quick brown fox",
            "jumps over the lazy dog",
            "and runs away",
            "into the woods",
            "a stitch in time",
            "saves nine",
            "or so they say",
            "to be or not to be",
            "that is the question",
            "whether tis nobler",
            "in the mind to suffer",
            "the slings and arrows",
        ],
    }
)


def corpus_config(path: Path, **overrides) -> DataConfig:
    settings = dict(
        name="table",
        path=str(path),
        task="language_modeling",
        sequence_column="text",
        client_column="writer",
        partition="natural",
        num_clients=3,
        seq_len=8,
        test_fraction=0.25,
    )
    return DataConfig(**{**settings, **overrides})


def decoded(ids: np.ndarray, alphabet: np.ndarray) -> str:
    """Characters of ids made by encode_characters (padding and unknown ids left out)."""
    return "".join(chr(alphabet[i - 2]) for i in ids if i >= 2)


def test_token_windows_cut_every_stream_apart() -> None:
    tokens = np.arange(100, 111)  # a stream of 5 tokens and one of 6
    x, y, counts = token_windows(tokens, np.array([0, 5, 11]), seq_len=3, stride=3)
    np.testing.assert_array_equal(counts, [2, 2])
    np.testing.assert_array_equal(x, [[100, 101, 102], [103, 104, 0], [105, 106, 107], [108, 109, 110]])
    np.testing.assert_array_equal(y, [[101, 102, 103], [104, -100, -100], [106, 107, 108], [109, 110, -100]])
    x, y, counts = token_windows(tokens, np.array([0, 5, 11]), seq_len=3, stride=1)  # overlapping windows, none past the end
    np.testing.assert_array_equal(counts, [2, 3])
    np.testing.assert_array_equal(x[:, 0], [100, 101, 105, 106, 107])
    assert (y != IGNORE_INDEX).all() and (y[:, :-1] == x[:, 1:]).all()
    x, y, counts = token_windows(np.array([7, 8, 9]), np.array([0, 1, 3]), seq_len=4, stride=4)  # a stream of one token has no target
    np.testing.assert_array_equal(counts, [0, 1])
    np.testing.assert_array_equal(x, [[8, 9, 0, 0]])
    np.testing.assert_array_equal(y, [[9, -100, -100, -100]])


def test_a_text_corpus_table_becomes_next_character_windows_per_writer(tmp_path: Path) -> None:
    CORPUS.to_parquet(tmp_path / "corpus.parquet")
    data = build_federated_dataset(corpus_config(tmp_path / "corpus.parquet"), seed=0)
    alphabet = alphabet_of("".join(CORPUS["text"]) + "\n")
    info = data.info
    assert (info.modality, info.seq_len, info.vocab_size, info.num_classes) == ("tokens", 8, len(alphabet) + 2, len(alphabet) + 2)
    assert data.train.x.dtype == data.train.y.dtype == np.int64 and data.train.y.shape == data.train.x.shape
    assert data.client_names == ("ann", "bob", "cyd") and data.label_distribution() is None
    # x and y are one character apart, and y ends with the character after the window.
    counted = data.train.y != IGNORE_INDEX
    assert (data.train.y[:, :-1][counted[:, :-1]] == data.train.x[:, 1:][counted[:, :-1]]).all()
    # A writer's training windows, joined, are its training rows (each ending with a newline), and
    # the windows never mix writers.
    held_out = []
    for k, writer in enumerate(data.client_names):
        windows = data.clients.client(k)
        assert set(data.train.client_ids[windows]) == {writer}
        stream = decoded(np.concatenate([data.train.x[windows[0], :1], data.train.y[windows][counted[windows]]]), alphabet)
        lines = list(CORPUS.loc[CORPUS["writer"] == writer, "text"])
        rows = stream.split("\n")[:-1]
        assert rows == [line for line in lines if line in rows] and stream.endswith("\n")
        held_out += [line for line in lines if line not in rows]
    # The test windows are made of the held-out rows only: one row of every writer (a quarter of 4,
    # 3 and 5); every character but the first of each writer's test text is predicted once.
    assert len(held_out) == 3
    test_counted = data.test.y != IGNORE_INDEX
    assert int(test_counted.sum()) == sum(len(row) + 1 for row in held_out) - 3
    for x_row, y_row, mask in zip(data.test.x, data.test.y, test_counted):
        assert any(decoded(np.concatenate([x_row[:1], y_row[mask]]), alphabet) in row + "\n" for row in held_out)
    # The same seed, the same windows; another seed holds out other rows.
    again = build_federated_dataset(corpus_config(tmp_path / "corpus.parquet"), seed=0)
    np.testing.assert_array_equal(again.train.x, data.train.x)
    other = build_federated_dataset(corpus_config(tmp_path / "corpus.parquet"), seed=3)
    assert other.train.x.shape != data.train.x.shape or not np.array_equal(other.train.x, data.train.x)


def test_stride_makes_overlapping_windows_and_a_test_file_is_cut_alike(tmp_path: Path) -> None:
    CORPUS.to_csv(tmp_path / "train.csv", index=False)
    CORPUS.iloc[:3].to_csv(tmp_path / "test.csv", index=False)
    cfg = corpus_config(tmp_path / "train.csv", test_path=str(tmp_path / "test.csv"), partition="iid", seq_len=6)
    plain = build_federated_dataset(cfg, seed=0)
    overlapping = build_federated_dataset(cfg.model_copy(update={"stride": 2}), seed=0)
    # Windows every `stride` characters of each writer's stream, up to the first that reaches its end.
    lengths = [sum(len(line) + 1 for line in CORPUS.loc[CORPUS["writer"] == writer, "text"]) for writer in ("ann", "bob", "cyd")]
    assert len(plain.train) == sum(-(-(length - 7) // 6) + 1 for length in lengths)
    assert len(overlapping.train) == sum(-(-(length - 7) // 2) + 1 for length in lengths)
    assert len(overlapping.test) > len(plain.test)
    # With stride 2, window i + 1 starts two characters after window i (within one writer).
    x = overlapping.train.x
    same_writer = overlapping.train.client_ids[1:] == overlapping.train.client_ids[:-1]
    full = (overlapping.train.y[1:] != IGNORE_INDEX).all(axis=1) & same_writer
    assert (x[1:][full][:, :-2] == x[:-1][full][:, 2:]).all()
    # The test windows are the test file's three rows, all of ann's.
    alphabet = alphabet_of("".join(CORPUS["text"]) + "\n")
    assert decoded(np.concatenate([plain.test.x[:1, :1].ravel(), plain.test.y[plain.test.y != IGNORE_INDEX]]), alphabet) == (
        "\n".join(CORPUS["text"][:3]) + "\n"
    )


def test_token_id_lists_and_their_vocabulary(tmp_path: Path) -> None:
    rows = [[5, 6, 7, 8, 9], [10, 11], [3, 4, 5, 6, 7, 8, 9, 12], [1, 2]]
    pq.write_table(pa.table({"ids": rows, "who": ["a", "a", "b", "b"]}), tmp_path / "ids.parquet")
    cfg = DataConfig(
        name="table",
        path=str(tmp_path / "ids.parquet"),
        test_path=str(tmp_path / "ids.parquet"),
        task="language_modeling",
        sequence_column="ids",
        client_column="who",
        partition="natural",
        num_clients=2,
        seq_len=4,
    )
    data = build_federated_dataset(cfg, seed=0)
    assert data.info.vocab_size == data.info.num_classes == 13  # the largest id + 1
    # a's stream is 5 6 7 8 9 10 11 (no separator between id lists), b's 3 4 5 6 7 8 9 12 1 2.
    np.testing.assert_array_equal(data.train.x[data.clients.client(0)], [[5, 6, 7, 8], [9, 10, 11, 0]])
    np.testing.assert_array_equal(data.train.y[data.clients.client(0)], [[6, 7, 8, 9], [10, 11, -100, -100]])
    np.testing.assert_array_equal(data.train.y[data.clients.client(1)], [[4, 5, 6, 7], [8, 9, 12, 1], [2, -100, -100, -100]])
    pq.write_table(pa.table({"ids": [[1, 2, -3]], "who": ["a"]}), tmp_path / "negative.parquet")
    with pytest.raises(ConfigError, match=r"data.sequence_column: row 0 of .*negative.parquet holds the token id -3; ids must be >= 0"):
        load_dataset(cfg.model_copy(update={"test_path": str(tmp_path / "negative.parquet")}), seed=0)


def test_a_saved_hugging_face_tokenizer_tokenises_the_text(tmp_path: Path) -> None:
    pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = sorted({word for line in CORPUS["text"] for word in line.split()})
    vocab = {word: i for i, word in enumerate(["<unk>", "<eos>", *(word for word in words if word != "question")])}  # "question" unknown
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="<eos>").save_pretrained(tmp_path / "tokenizer")
    CORPUS.to_parquet(tmp_path / "corpus.parquet")
    cfg = corpus_config(
        tmp_path / "corpus.parquet", tokenizer=str(tmp_path / "tokenizer"), seq_len=4, test_path=str(tmp_path / "corpus.parquet")
    )
    data = build_federated_dataset(cfg, seed=0)
    assert data.info.vocab_size == data.info.num_classes == len(vocab)
    # ann's stream: the words of her four lines, each line ended by <eos> (id 1).
    ann = [id_ for line in CORPUS["text"][:4] for id_ in [vocab[word] for word in line.split()] + [1]]
    windows = data.clients.client(0)
    np.testing.assert_array_equal(data.train.x[windows].ravel()[: len(ann)], ann[: len(windows) * 4])
    counted = data.train.y[windows] != IGNORE_INDEX
    np.testing.assert_array_equal(data.train.y[windows][counted], ann[1:])
    assert 0 in data.train.x[data.clients.client(2)]  # cyd's "question" is <unk>
    # Token ids beyond the tokenizer's vocabulary are refused with their row.
    pq.write_table(pa.table({"text": [[2, 3], [4, len(vocab)]], "writer": ["ann", "bob"]}), tmp_path / "ids.parquet")
    with pytest.raises(ConfigError, match=rf"row 1 of .*ids.parquet holds the token id {len(vocab)}; ids must be 0..{len(vocab) - 1}"):
        load_dataset(cfg.model_copy(update={"path": str(tmp_path / "ids.parquet"), "test_path": None}), seed=0)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"data.tokenizer: cannot load a tokenizer from .*empty"):
        load_dataset(cfg.model_copy(update={"tokenizer": str(tmp_path / "empty")}), seed=0)


def test_the_standard_library_is_a_language_modelling_corpus() -> None:
    modules = stdlib_module_files()
    cfg = DataConfig(name="pystdlib_chars", task="language_modeling", partition="natural", num_clients=len(modules), seq_len=40)
    data = build_federated_dataset(cfg, seed=0)
    assert data.info.num_classes == data.info.vocab_size == 102 and data.train.x.shape[1] == data.train.y.shape[1] == 40
    classification = build_federated_dataset(cfg.model_copy(update={"task": "classification"}), seed=0)
    assert data.client_names == classification.client_names  # the same modules, one client each
    # argparse's training windows are the first 80% of its text, every 40 characters; its test
    # windows the rest.
    text = next(path for path in modules if path.stem == "argparse").read_text(encoding="utf-8")
    ids = encode_characters(text, STDLIB_ALPHABET)
    cut = len(ids) - round(0.2 * len(ids))
    windows = data.clients.client(data.client_names.index("argparse"))
    assert len(windows) == -(-(cut - 1) // 40)
    np.testing.assert_array_equal(data.train.x[windows[:3]], ids[:120].reshape(3, 40))
    np.testing.assert_array_equal(data.train.y[windows[:3]], ids[1:121].reshape(3, 40))
    tail = ids[cut:]
    test_windows = np.flatnonzero((data.test.x[:, :40] == tail[:40]).all(axis=1))
    assert len(test_windows) == 1 and (data.test.y[test_windows[0]] == tail[1:41]).all()
    # Stride 20: twice the windows.
    overlapping = build_federated_dataset(cfg.model_copy(update={"stride": 20}), seed=0)
    assert 2 * len(data.train) - 2 * len(modules) <= len(overlapping.train) < 2 * len(data.train)
    with pytest.raises(ConfigError, match="data.partition: dirichlet skews labels, and language_modeling targets have none"):
        build_federated_dataset(cfg.model_copy(update={"partition": "dirichlet", "num_clients": 10}), seed=0)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"seq_len": None}, "data.seq_len: data.task=language_modeling cuts every client's token stream into windows"),
        ({"target_columns": ["text"]}, "data.target_columns: data.task=language_modeling predicts the next token of data.sequence_column"),
        ({"feature_columns": ["writer"]}, "data.feature_columns: data.task=language_modeling predicts the next token"),
        ({"sequence_column": "writer", "client_column": None, "path": "numbers.csv"}, "holds int64; expected lists of integers or text"),
        ({"partition": "shards"}, "data.partition: shards skews labels, and language_modeling targets have none"),
        ({"test_fraction": 0.1, "path": "one_row_each.csv"}, "data.test_fraction: the held-out rows of"),
        ({"tokenizer": "no_such_dir"}, "/no_such_dir does not exist"),  # pinned absolute: trials and actors run elsewhere
    ],
    ids=lambda value: value if isinstance(value, str) else "-".join(f"{k}={v}" for k, v in value.items()),
)
def test_bad_language_modelling_inputs_are_one_line_naming_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, overrides: dict, expected: str
) -> None:
    monkeypatch.chdir(tmp_path)
    CORPUS.to_csv("corpus.csv", index=False)
    pd.DataFrame({"writer": [1, 2], "text": ["abc", "de"]}).to_csv("numbers.csv", index=False)
    pd.DataFrame({"writer": ["a", "b"], "text": ["some text", "more text"]}).to_csv("one_row_each.csv", index=False)
    cfg = corpus_config(Path("corpus.csv")).model_copy(update={"num_clients": 2 if "one_row_each" in str(overrides) else 3})
    cfg = DataConfig(**{**cfg.model_dump(), **overrides})
    with pytest.raises(ConfigError) as error:
        build_federated_dataset(cfg, seed=0)
    assert expected in str(error.value) and "\n" not in str(error.value)
