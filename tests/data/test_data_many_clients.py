"""Data for very many clients: synthetic images generated in chunks and channel statistics computed
in chunks give exactly what one whole-array computation gives; the partition plot counts only the
clients it shows."""

from __future__ import annotations

import numpy as np

from fedray.config import DataConfig, SyntheticConfig
from fedray.data import build_federated_dataset, load_dataset


def _synthetic_in_one_draw(spec: SyntheticConfig, n_train: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The training images as one float32 draw of all of them (what chunked generation must equal)."""
    rng = np.random.default_rng(seed)
    shape = (spec.channels, spec.image_size, spec.image_size)
    patterns = rng.random((spec.num_classes, *shape), dtype=np.float32)
    y = rng.permutation(np.arange(n_train, dtype=np.int64) % spec.num_classes)
    pixels = rng.standard_normal((n_train, *shape), dtype=np.float32) * np.float32(spec.noise) + patterns[y]
    pixels *= np.float32(255.0)
    return np.rint(np.clip(pixels, 0, 255)).astype(np.uint8), y


def test_synthetic_generated_in_chunks_equals_one_draw_and_its_stats_equal_numpys() -> None:
    # 7×7: 85,598 images a chunk, so four chunks; 14.7 million pixels, whose squared deviations are
    # summed over 16 chunks in numpy's pairwise order (an order split differently changes the std here)
    spec = SyntheticConfig(num_train=300_003, num_test=7, image_size=7, noise=2.0)
    train, test, info = load_dataset(DataConfig(name="synthetic", synthetic=spec), seed=3)
    x, y = _synthetic_in_one_draw(spec, spec.num_train, seed=3)
    assert np.array_equal(train.x, x) and np.array_equal(train.y, y)
    assert test.x.shape == (7, 1, 7, 7)
    assert info.mean == (float(x.mean(axis=(0, 2, 3), dtype=np.float64)[0] / 255.0),)
    assert info.std == (float(x.std(axis=(0, 2, 3), dtype=np.float64)[0] / 255.0),)


def test_multi_channel_stats_equal_numpys() -> None:
    spec = SyntheticConfig(num_train=500, num_test=5, channels=3, image_size=6)
    train, _, info = load_dataset(DataConfig(name="synthetic", synthetic=spec), seed=0)
    assert info.mean == tuple(float(m) for m in train.x.mean(axis=(0, 2, 3), dtype=np.float64) / 255.0)
    assert info.std == tuple(float(s) for s in train.x.std(axis=(0, 2, 3), dtype=np.float64) / 255.0)


def test_label_distribution_of_the_first_clients() -> None:
    data = build_federated_dataset(DataConfig(num_clients=50, partition="dirichlet"), seed=0)
    everyone = data.label_distribution()
    assert everyone.shape == (50, 10) and everyone.sum() == len(data.clients.indices)
    assert np.array_equal(data.label_distribution(7), everyone[:7])
    assert np.array_equal(data.label_distribution(100), everyone)
