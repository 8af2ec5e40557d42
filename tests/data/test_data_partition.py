"""Partitioners, the per-client test split and build_federated_dataset."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from fedray.config import ConfigError, DataConfig
from fedray.data import (
    ClientPartition,
    build_federated_dataset,
    load_dataset,
    partition_labels,
    split_client_test,
)

PARTITIONS = ["iid", "dirichlet", "dirichlet_equal_size", "shards", "quantity"]


@pytest.fixture(scope="module")
def digit_labels() -> np.ndarray:
    train, _, _ = load_dataset(DataConfig(), seed=0)
    return train.y


def balanced_labels(per_class: int, num_classes: int = 10) -> np.ndarray:
    return np.random.default_rng(123).permutation(np.repeat(np.arange(num_classes), per_class))


def assert_disjoint_cover(partition: ClientPartition, expected: np.ndarray) -> None:
    """Clients are disjoint and their union is exactly `expected`."""
    assert partition.indices.dtype == np.int64
    assert len(np.unique(partition.indices)) == len(partition.indices), "a sample is in two clients"
    np.testing.assert_array_equal(np.sort(partition.indices), np.sort(expected))


def label_entropy(partition: ClientPartition, labels: np.ndarray) -> float:
    """Mean over clients of the entropy (nats) of the client's label distribution."""
    entropies = []
    for k in range(partition.num_clients):
        counts = np.bincount(labels[partition.client(k)], minlength=10)
        p = counts[counts > 0] / counts.sum()
        entropies.append(-(p * np.log(p)).sum())
    return float(np.mean(entropies))


@pytest.mark.parametrize("name", PARTITIONS)
def test_partition_is_disjoint_covering_and_seeded(name: str, digit_labels: np.ndarray) -> None:
    cfg = DataConfig(partition=name, num_clients=20)
    partition = partition_labels(digit_labels, cfg, seed=0)
    assert partition.num_clients == 20
    assert partition.sizes.min() >= 1
    assert_disjoint_cover(partition, np.arange(len(digit_labels)))
    again = partition_labels(digit_labels, cfg, seed=0)
    np.testing.assert_array_equal(partition.indices, again.indices)
    np.testing.assert_array_equal(partition.offsets, again.offsets)
    other = partition_labels(digit_labels, cfg, seed=1)
    assert not np.array_equal(partition.indices, other.indices)


def test_iid_sizes_differ_by_at_most_one(digit_labels: np.ndarray) -> None:
    partition = partition_labels(digit_labels, DataConfig(partition="iid", num_clients=20), seed=0)
    assert partition.sizes.max() - partition.sizes.min() <= 1


@pytest.mark.parametrize("name", ["dirichlet", "dirichlet_equal_size"])
def test_lower_alpha_gives_more_label_skew(name: str, digit_labels: np.ndarray) -> None:
    def mean_entropy(alpha: float) -> float:
        cfg = DataConfig(partition=name, num_clients=20, alpha=alpha)
        partitions = [partition_labels(digit_labels, cfg, seed) for seed in range(3)]
        return float(np.mean([label_entropy(p, digit_labels) for p in partitions]))

    skewed, mild, near_iid = mean_entropy(0.1), mean_entropy(1.0), mean_entropy(100.0)
    assert skewed < mild < near_iid
    assert near_iid > 0.9 * np.log(10)


def test_dirichlet_redraws_until_min_samples(digit_labels: np.ndarray, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_repair(*args: object) -> None:
        raise AssertionError("this config must be met by redrawing, not by the repair")

    monkeypatch.setattr("fedray.data.partition._repair_short_clients", no_repair)
    cfg = DataConfig(partition="dirichlet", num_clients=30, alpha=0.5, min_samples_per_client=15)
    partition = partition_labels(digit_labels, cfg, seed=1)
    assert partition.sizes.min() >= 15
    assert_disjoint_cover(partition, np.arange(len(digit_labels)))
    # The first draw (the one min_samples_per_client=1 accepts) had a client below 15.
    accept_first = cfg.model_copy(update={"min_samples_per_client": 1})
    first_draw = partition_labels(digit_labels, accept_first, seed=1)
    assert first_draw.sizes.min() < 15


def test_dirichlet_repair_keeps_min_samples_and_skew(digit_labels: np.ndarray) -> None:
    # 200 clients with ≥ 5 of 1,437 samples at α = 0.1 is beyond redraws: the repair runs.
    cfg = DataConfig(partition="dirichlet", num_clients=200, alpha=0.1, min_samples_per_client=5)
    partition = partition_labels(digit_labels, cfg, seed=0)
    assert partition.sizes.min() >= 5
    assert_disjoint_cover(partition, np.arange(len(digit_labels)))
    skew = label_entropy(partition, digit_labels)
    iid = partition_labels(digit_labels, cfg.model_copy(update={"partition": "iid"}), seed=0)
    assert skew < 0.6 * label_entropy(iid, digit_labels)
    milder = partition_labels(digit_labels, cfg.model_copy(update={"alpha": 1.0}), seed=0)
    assert milder.sizes.min() >= 5
    assert skew < label_entropy(milder, digit_labels)


def test_dirichlet_thousand_clients_on_digits(digit_labels: np.ndarray) -> None:
    cfg = DataConfig(partition="dirichlet", num_clients=1000, min_samples_per_client=1)
    partition = partition_labels(digit_labels, cfg, seed=0)
    assert partition.num_clients == 1000
    assert partition.sizes.min() >= 1
    assert_disjoint_cover(partition, np.arange(len(digit_labels)))


def test_dirichlet_scales_to_100k_clients() -> None:
    labels = balanced_labels(per_class=20_000)
    cfg = DataConfig(partition="dirichlet", num_clients=100_000, min_samples_per_client=1)
    partition = partition_labels(labels, cfg, seed=0)  # vectorised: W1's 100k-client run times it
    assert partition.sizes.min() >= 1
    assert partition.indices.shape == (200_000,)


def test_dirichlet_impossible_minimum_is_config_error(digit_labels: np.ndarray) -> None:
    cfg = DataConfig(partition="dirichlet", num_clients=100, min_samples_per_client=15)
    with pytest.raises(ConfigError, match="min_samples_per_client"):
        partition_labels(digit_labels, cfg, seed=0)


@pytest.mark.parametrize("name", PARTITIONS)
def test_more_clients_than_samples_is_config_error(name: str) -> None:
    cfg = DataConfig(partition=name, num_clients=50)
    with pytest.raises(ConfigError, match=r"data.num_clients \(K=50\) exceeds .* \(N=40\)"):
        partition_labels(balanced_labels(per_class=4), cfg, seed=0)


@pytest.mark.parametrize("num_clients", [20, 1000])
def test_shards_give_at_most_classes_per_client(num_clients: int, digit_labels: np.ndarray) -> None:
    cfg = DataConfig(partition="shards", num_clients=num_clients, classes_per_client=2)
    partition = partition_labels(digit_labels, cfg, seed=0)
    assert_disjoint_cover(partition, np.arange(len(digit_labels)))
    assert partition.sizes.min() >= 1
    classes_held = [len(np.unique(digit_labels[partition.client(k)])) for k in range(num_clients)]
    assert max(classes_held) <= 2
    if num_clients == 20:  # 40 shards over 10 classes: most clients hold two distinct classes
        assert np.mean(np.array(classes_held) == 2) > 0.5


def test_shards_need_every_class_dealt(digit_labels: np.ndarray) -> None:
    cfg = DataConfig(partition="shards", num_clients=4, classes_per_client=2)
    with pytest.raises(ConfigError, match="classes_per_client"):
        partition_labels(digit_labels, cfg, seed=0)


def test_quantity_sizes_vary_and_labels_stay_iid(digit_labels: np.ndarray) -> None:
    cfg = DataConfig(partition="quantity", num_clients=20, quantity_sigma=1.0)
    partition = partition_labels(digit_labels, cfg, seed=0)
    sizes = partition.sizes
    assert sizes.min() >= 1 and sizes.sum() == len(digit_labels)
    assert sizes.std() / sizes.mean() > 0.4
    narrow = partition_labels(digit_labels, cfg.model_copy(update={"quantity_sigma": 0.1}), seed=0)
    assert narrow.sizes.std() < sizes.std()
    big = partition.client(int(np.argmax(sizes)))  # its labels cover every class
    assert len(np.unique(digit_labels[big])) == 10


# dirichlet_equal_size (the FedSC/FedSKC code's CReFF-style split), its four properties: 1. disjoint
# clients, 2. their union is the (long-tailed) training set, 3. sizes differ by at most 1, 4. the
# long-tail class counts follow the formula.


def long_tail_counts(num_samples: int, num_classes: int, rho: float) -> np.ndarray:
    n_max = num_samples / num_classes
    return np.array([int(n_max * rho ** (-c / (num_classes - 1))) for c in range(num_classes)])


@pytest.mark.parametrize("num_clients", [10, 25])
def test_dirichlet_equal_size_long_tail(num_clients: int) -> None:
    labels = balanced_labels(per_class=300)
    cfg = DataConfig(partition="dirichlet_equal_size", num_clients=num_clients, alpha=0.5, imbalance_ratio=10)
    partition = partition_labels(labels, cfg, seed=0)
    # 1. disjoint, 2. the union is the long-tailed training set
    assert len(np.unique(partition.indices)) == len(partition.indices)
    class_counts = np.bincount(labels[partition.indices], minlength=10)
    # 4. the long-tail class counts follow ⌊n_max · ρ^{-c/(C-1)}⌋ and max/min ≈ ρ
    np.testing.assert_array_equal(class_counts, long_tail_counts(3000, 10, 10.0))
    assert class_counts[0] / class_counts[-1] == pytest.approx(10.0, rel=0.05)
    # 3. sizes differ by at most one
    assert partition.sizes.max() - partition.sizes.min() <= 1
    assert partition.num_clients == num_clients


def test_dirichlet_equal_size_without_long_tail_uses_everything(digit_labels: np.ndarray) -> None:
    cfg = DataConfig(partition="dirichlet_equal_size", num_clients=10, imbalance_ratio=1.0)
    partition = partition_labels(digit_labels, cfg, seed=0)
    assert_disjoint_cover(partition, np.arange(len(digit_labels)))
    assert partition.sizes.max() - partition.sizes.min() <= 1


def test_dirichlet_equal_size_needs_ten_clients(digit_labels: np.ndarray) -> None:
    cfg = DataConfig(partition="dirichlet_equal_size", num_clients=6)
    with pytest.raises(ValueError, match="num_clients >= 10"):
        partition_labels(digit_labels, cfg, seed=0)


def test_dirichlet_equal_size_refuses_a_hopeless_alpha_naming_clients_without_numpy_warnings(digit_labels: np.ndarray) -> None:
    cfg = DataConfig(partition="dirichlet_equal_size", num_clients=10, alpha=1e-6, imbalance_ratio=1.0)  # every draw underflows to NaN
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a numpy RuntimeWarning would be printed before the refusal
        with pytest.raises(ConfigError) as raised:
            partition_labels(digit_labels, cfg, seed=0)
    assert raised.value.key == "data.alpha"
    assert raised.value.message == (
        "data.partition=dirichlet_equal_size found no draw in 1000 that gave each of the 10 clients sharing a chunk of "
        "1437 samples at least half of its 143.7; raise data.alpha (now 1e-06)"
    )


def test_split_client_test(digit_labels: np.ndarray) -> None:
    clients = ClientPartition.from_lists([np.array([5]), np.array([1, 2]), np.arange(10, 30), np.arange(30, 130)])
    train, test = split_client_test(clients, fraction=0.25, seed=0)
    np.testing.assert_array_equal(train.sizes, [1, 1, 15, 75])
    np.testing.assert_array_equal(test.sizes, [0, 1, 5, 25])
    for k in range(clients.num_clients):
        together = np.concatenate([train.client(k), test.client(k)])
        np.testing.assert_array_equal(np.sort(together), np.sort(clients.client(k)))
    again_train, _ = split_client_test(clients, fraction=0.25, seed=0)
    np.testing.assert_array_equal(train.indices, again_train.indices)
    other_train, _ = split_client_test(clients, fraction=0.25, seed=1)
    assert not np.array_equal(np.sort(train.client(3)), np.sort(other_train.client(3)))


def test_build_federated_dataset_with_client_test_split() -> None:
    cfg = DataConfig(num_clients=10, partition="dirichlet", client_test_fraction=0.2)
    federated = build_federated_dataset(cfg, seed=0)
    assert federated.num_clients == 10
    assert len(federated.train) == 1437 and len(federated.test) == 360
    assert federated.client_test is not None
    everything = np.concatenate([federated.clients.indices, federated.client_test.indices])
    as_one_client = ClientPartition(everything, np.array([0, len(everything)]))
    assert_disjoint_cover(as_one_client, np.arange(1437))
    assert 0.15 < len(federated.client_test.indices) / 1437 < 0.25
    distribution = federated.label_distribution()
    assert distribution.shape == (10, 10)
    assert distribution.sum() == len(federated.clients.indices)
    assert build_federated_dataset(DataConfig(num_clients=10), seed=0).client_test is None
