"""Token sequences and feature vectors next to images: the array forms, DatasetInfo's normalisation and
dummy inputs, the mlp and char_lstm models, the two offline benchmarks (stdlib text, scikit-learn
tables), every partitioner on every modality, and short end-to-end runs of the two examples."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from fedray.config import ConfigError, DataConfig, ModelConfig
from fedray.data import ArrayDataset, DatasetInfo, build_federated_dataset, load_dataset
from fedray.data.benchmarks import STDLIB_ALPHABET, load_pystdlib_chars, stdlib_module_files
from fedray.data.formats import encode_characters
from fedray.models import build_model, forward_flops

REPO = Path(__file__).resolve().parents[2]
TEXT = DataConfig(name="pystdlib_chars", partition="natural", num_clients=len(stdlib_module_files()), seq_len=20)


def test_array_forms_of_the_three_modalities() -> None:
    y = np.zeros(3, dtype=np.int64)
    assert ArrayDataset(np.zeros((3, 1, 2, 2), np.uint8), y).modality == "image"
    assert ArrayDataset(np.zeros((3, 5), np.int64), y).modality == "tokens"
    assert ArrayDataset(np.zeros((3, 4), np.float32), y).modality == "features"
    with pytest.raises(ValueError, match="float32 \\[N, D\\]"):
        ArrayDataset(np.zeros((3, 4), np.float64), y)
    subset = ArrayDataset(np.zeros((3, 4), np.float32), np.arange(3), np.array(["a", "b", "c"])).subset(np.array([2, 0]))
    np.testing.assert_array_equal(subset.client_ids, ["c", "a"])
    np.testing.assert_array_equal(subset.y, [2, 0])


def test_normalisation_and_dummy_input_per_modality() -> None:
    image = DatasetInfo("digits", 10, 1, 8, (0.5,), (0.25,), "none")
    assert image.input_shape == (1, 8, 8) and image.describe() == "1×8×8 images"
    pixels = torch.full((2, 1, 8, 8), 255, dtype=torch.uint8)
    assert torch.equal(image.normalize(pixels), torch.full((2, 1, 8, 8), 2.0))
    assert image.dummy_input(3).shape == (3, 1, 8, 8) and image.dummy_input().dtype == torch.float32

    features = DatasetInfo("wine", 3, 0, 0, (1.0, -2.0), (2.0, 4.0), "none", modality="features", input_shape=(2,))
    assert torch.equal(features.normalize(torch.tensor([[3.0, 2.0]])), torch.tensor([[1.0, 1.0]]))
    assert features.dummy_input(2).shape == (2, 2) and features.describe() == "2 features"

    tokens = DatasetInfo("text", 5, 0, 0, (), (), "none", modality="tokens", input_shape=(4,), vocab_size=9)
    ids = torch.tensor([[0, 3, 8, 1]])
    assert tokens.normalize(ids) is ids
    assert tokens.dummy_input().dtype == torch.long and tokens.dummy_input().shape == (1, 4)
    assert tokens.describe() == "sequences of 4 tokens (vocabulary 9)"


def test_features_are_standardised_with_training_statistics() -> None:
    train, test, info = load_dataset(DataConfig(name="breast_cancer"), seed=0)
    assert (train.x.shape[1], info.num_classes, info.modality) == (30, 2, "features")
    assert len(train) + len(test) == 569
    standardised = info.normalize(torch.as_tensor(train.x))
    np.testing.assert_allclose(standardised.mean(0).numpy(), 0, atol=1e-4)
    np.testing.assert_allclose(standardised.std(0, unbiased=False).numpy(), 1, atol=1e-4)
    assert load_dataset(DataConfig(name="wine"), seed=0)[2].input_shape == (13,)


def test_crop_flip_is_refused_for_features() -> None:
    with pytest.raises(ConfigError, match="data.augmentation: crop_flip applies to images; data.name=wine has features"):
        load_dataset(DataConfig(name="wine", augmentation="crop_flip"), seed=0)


def test_stdlib_text_windows_are_labelled_with_the_next_character() -> None:
    data = build_federated_dataset(TEXT, seed=0)
    info = data.info
    assert (info.modality, info.seq_len, info.vocab_size, info.num_classes) == ("tokens", 20, 102, 102)
    assert data.client_names == tuple(sorted(data.client_names)) and "argparse" in data.client_names
    # Rebuild argparse's first training window from the source file.
    source = next(path for path in stdlib_module_files() if path.stem == "argparse").read_text(encoding="utf-8")
    ids = encode_characters(source, STDLIB_ALPHABET)
    windows = data.clients.client(data.client_names.index("argparse"))
    start = np.flatnonzero((ids[: (len(ids) - 1) // 20 * 20].reshape(-1, 20) == data.train.x[windows[0]]).all(axis=1))[0]
    assert data.train.y[windows[0]] == ids[(start + 1) * 20]
    # Deterministic, and the same windows whatever the seed (only the test split moves).
    again = build_federated_dataset(TEXT, seed=0)
    np.testing.assert_array_equal(again.train.x, data.train.x)
    np.testing.assert_array_equal(again.clients.offsets, data.clients.offsets)


def test_max_samples_per_client_keeps_a_seeded_subset_of_every_client() -> None:
    _, windows_per_module = np.unique(load_pystdlib_chars(TEXT).client_ids_train, return_counts=True)
    capped = build_federated_dataset(TEXT.model_copy(update={"max_samples_per_client": 10}), seed=0)
    assert capped.num_clients == len(windows_per_module)
    assert len(capped.train) + len(capped.test) == np.minimum(windows_per_module, 10).sum()
    assert capped.clients.sizes.max() == 10 - 2  # of 10 samples, round(0.2 · 10) = 2 went to the test set
    again = build_federated_dataset(TEXT.model_copy(update={"max_samples_per_client": 10}), seed=0)
    np.testing.assert_array_equal(again.train.x, capped.train.x)
    with pytest.raises(ConfigError, match="data.max_samples_per_client: data.name=wine has no client ids"):
        load_dataset(DataConfig(name="wine", max_samples_per_client=5), seed=0)


@pytest.mark.parametrize("partition", ["iid", "dirichlet", "shards", "quantity"])
@pytest.mark.parametrize("name", ["wine", "pystdlib_chars"])
def test_label_partitioners_work_on_tokens_and_features(name: str, partition: str) -> None:
    cfg = DataConfig(name=name, partition=partition, num_clients=8, classes_per_client=10, max_train_samples=2000)
    data = build_federated_dataset(cfg, seed=0)
    assert data.num_clients == 8 and data.client_names is None
    owned = np.sort(data.clients.indices)
    np.testing.assert_array_equal(owned, np.unique(owned))  # disjoint
    assert len(owned) == len(data.train)


def test_mlp_and_char_lstm_fit_their_modalities() -> None:
    features = DatasetInfo("wine", 3, 0, 0, (0.0,) * 13, (1.0,) * 13, "none", modality="features", input_shape=(13,))
    tokens = DatasetInfo("text", 102, 0, 0, (), (), "none", modality="tokens", input_shape=(20,), vocab_size=102)
    mlp = build_model(ModelConfig(name="mlp", width=32), features).eval()
    logits, feats, taps = mlp.forward_with_taps(features.dummy_input(4))
    assert logits.shape == (4, 3) and feats.shape == (4, 32) == taps[-1].shape and mlp.feature_dim == 32
    lstm = build_model(ModelConfig(name="char_lstm", width=16), tokens).eval()
    x = torch.randint(0, 102, (2, 20))
    assert lstm(x).shape == (2, 102) and lstm.feature_dim == 16
    changed_last = x.clone()
    changed_last[:, -1] = (x[:, -1] + 1) % 102
    assert not torch.allclose(lstm(x), lstm(changed_last))  # the prediction reads the last position
    assert forward_flops(mlp, features) > 0 and forward_flops(lstm, tokens) > 0
    image = DatasetInfo("digits", 10, 1, 8, (0.5,), (0.25,), "none")
    assert build_model(ModelConfig(name="mlp"), image)(image.dummy_input(2)).shape == (2, 10)  # flattened images
    with pytest.raises(ValueError, match="char_lstm takes tokens input, not features"):
        build_model(ModelConfig(name="char_lstm"), features)
    with pytest.raises(ValueError, match="cnn_small takes image input, not tokens"):
        build_model(ModelConfig(name="cnn_small"), tokens)


# ------------------------------------------------------------------------------------ end to end
@pytest.mark.slow
@pytest.mark.parametrize("example", ["fedavg_text_stdlib.yaml", "fedavg_tabular.yaml"])
def test_example_runs_two_rounds(tmp_path: Path, example: str) -> None:
    overrides = [
        "train.rounds=2",
        "resources.num_workers=1",
        f"output.dir={tmp_path}",
        "output.name=run",
        "output.tensorboard=false",
        "output.plots=false",
        "checkpoint.every=2",
    ]
    command = [sys.executable, "-m", "fedray.cli.main", "run", str(REPO / "examples" / example)]
    for override in overrides:
        command += ["--set", override]
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_ADDRESS": ""}
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = pq.read_table(tmp_path / "run" / "metrics.parquet").to_pylist()
    rounds = [row for row in rows if row["scope"] == "round"]
    assert [row["round"] for row in rounds] == [1, 2]
    assert all(0 <= row["test_accuracy"] <= 1 for row in rounds)
