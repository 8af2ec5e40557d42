"""Split a training set's labels among ``data.num_clients`` clients, and hold out test samples.

Every partitioner returns a :class:`ClientPartition` (CSR index lists) whose clients are disjoint
and together cover the training set (for ``dirichlet_equal_size`` with a long tail: its long-tailed
subset). All are deterministic for a seed and vectorised so that 100,000 clients cost well under a
second: loops run over classes or chunks of clients, never over samples or over clients × classes.
"""

from __future__ import annotations

import math

import numpy as np

from fedray.config import ConfigError, DataConfig
from fedray.data.base import ClientPartition

# dirichlet: at most this many draws are tried before the shortfall is repaired (see _dirichlet).
_MAX_DIRICHLET_DRAWS = 10
# dirichlet: a draw that leaves more clients than this short makes a further draw unlikely to leave
# none short (about exp(-short) under a Poisson approximation), so the repair runs at once.
_HOPELESS_SHORT_CLIENTS = 5
# dirichlet_equal_size: bound on the procedure's "repeat until" loop, so a hopeless config fails loudly.
_MAX_CHUNK_DRAWS = 1000
# dirichlet_equal_size: workers per chunk in the official code (``n_auxi_workers``).
_WORKERS_PER_CHUNK = 10
#: The partitions that skew the clients' labels: they need the task's partition labels.
LABEL_SKEW_PARTITIONS = ("dirichlet", "dirichlet_equal_size", "shards")
#: hold_out's stream of the seeded test split (independent of the other draws of one seed).
TEST_STREAM = 0x5445


def partition_labels(labels: np.ndarray, cfg: DataConfig, seed: int) -> ClientPartition:
    """Partition sample indices ``0..N-1`` among ``cfg.num_clients`` clients by ``cfg.partition``.

    ``iid``: shuffled, near-equal sizes. ``dirichlet``: per-class Dirichlet(``cfg.alpha``) over
    clients. ``dirichlet_equal_size``: the CReFF procedure that FedSC/FedSKC's official code uses (optional
    long tail, equal client sizes). ``shards``: ``cfg.classes_per_client`` label shards per client.
    ``quantity``: iid labels with log-normal(``cfg.quantity_sigma``) client sizes. (``natural``
    follows the data's client ids instead: :func:`natural_partition`.)
    """
    labels = np.asarray(labels, dtype=np.int64)
    num_samples, num_clients = int(labels.shape[0]), cfg.num_clients
    if num_clients > num_samples:
        raise ConfigError(
            None,
            f"data.num_clients (K={num_clients}) exceeds the number of training samples "
            f"(N={num_samples}) of dataset {cfg.name!r}: every client needs at least one sample; "
            f"lower data.num_clients",
            within=None,
        )
    if cfg.partition == "iid":
        return _iid(num_samples, num_clients, np.random.default_rng(seed))
    if cfg.partition == "dirichlet":
        return _dirichlet(labels, num_clients, cfg.alpha, cfg.min_samples_per_client, np.random.default_rng(seed))
    if cfg.partition == "dirichlet_equal_size":
        return _dirichlet_equal_size(labels, num_clients, cfg.alpha, cfg.imbalance_ratio, seed)
    if cfg.partition == "shards":
        return _shards(labels, num_clients, cfg.classes_per_client, np.random.default_rng(seed))
    if cfg.partition == "quantity":
        return _quantity(num_samples, num_clients, cfg.quantity_sigma, np.random.default_rng(seed))
    raise ConfigError("data.partition", f"unknown partition {cfg.partition!r}", within=None)


def natural_clients(client_ids: np.ndarray) -> tuple[ClientPartition, np.ndarray]:
    """One client per distinct value of ``client_ids`` (``data.partition=natural``), in sorted order
    of the values: the partition (each client's sample indices ascending) and the values."""
    names, owner = np.unique(client_ids, return_inverse=True)
    return _from_owner(owner.reshape(-1).astype(np.int64), names.shape[0]), names


def natural_partition(client_ids: np.ndarray, cfg: DataConfig) -> tuple[ClientPartition, tuple[str, ...]]:
    """:func:`natural_clients` of the training samples' ids, with the ids as strings;
    ``data.num_clients`` must equal their number."""
    clients, names = natural_clients(client_ids)
    if clients.num_clients != cfg.num_clients:
        raise ConfigError(
            "data.num_clients",
            f"data.partition=natural gives one client per client id and data.name={cfg.name} "
            f"has {clients.num_clients} in its training set; set data.num_clients={clients.num_clients} "
            f"(and train.clients_per_round to at most that)",
            within=None,
        )
    return clients, tuple(str(name) for name in names)


def hold_out(num_samples: int, size: int, seed: int, stream: int) -> tuple[np.ndarray, np.ndarray]:
    """A seeded ``size``-sample subset of ``0..num_samples-1`` and the remaining indices, both
    ascending. ``stream`` keeps draws for different purposes independent under one seed."""
    held = np.sort(np.random.default_rng([seed, stream]).choice(num_samples, size, replace=False))
    return held, np.setdiff1d(np.arange(num_samples), held)


def test_split(num_samples: int, client_ids: np.ndarray | None, cfg: DataConfig, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Ascending (train, test) indices of data without a test set of its own: a seeded
    ``data.test_fraction`` share of every client's samples with ``data.partition=natural`` (so every
    client is tested as it trains; a client with one sample keeps it), else of all samples (at least one)."""
    if cfg.partition == "natural" and client_ids is not None:
        clients, _ = natural_clients(client_ids)
        train_part, test_part = split_client_test(clients, cfg.test_fraction, seed)
        return np.sort(train_part.indices), np.sort(test_part.indices)
    test_index, train_index = hold_out(num_samples, max(1, round(cfg.test_fraction * num_samples)), seed, TEST_STREAM)
    return train_index, test_index


def split_client_test(partition: ClientPartition, fraction: float, seed: int) -> tuple[ClientPartition, ClientPartition]:
    """Split every client's indices at random into (train, test) parts.

    A client with ``n`` samples puts ``round(fraction · n)`` of them, clipped to ``1..n-1``, in its
    test part, so it always keeps at least one training sample and its test part is empty only when
    ``n == 1``.
    """
    if not 0 < fraction < 1:
        raise ValueError(f"fraction must be in (0, 1), got {fraction}")
    sizes = partition.sizes
    test_sizes = np.clip(np.rint(fraction * sizes).astype(np.int64), 1, np.maximum(sizes - 1, 0))
    owner = np.repeat(np.arange(partition.num_clients), sizes)
    rng = np.random.default_rng(seed)
    order = np.lexsort((rng.random(owner.shape[0]), owner))  # shuffled inside each client
    position = np.arange(owner.shape[0]) - partition.offsets[owner]
    is_test = position < test_sizes[owner]
    shuffled = partition.indices[order]
    return (
        _from_sizes(shuffled[~is_test], sizes - test_sizes),
        _from_sizes(shuffled[is_test], test_sizes),
    )


def _from_sizes(indices: np.ndarray, sizes: np.ndarray) -> ClientPartition:
    """CSR partition of ``indices`` cut into consecutive runs of ``sizes``."""
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    return ClientPartition(indices=np.asarray(indices, dtype=np.int64), offsets=offsets)


def _from_owner(owner: np.ndarray, num_clients: int) -> ClientPartition:
    """CSR partition from each sample's client id (``-1``: the sample is not used)."""
    used = np.flatnonzero(owner >= 0)
    indices = used[np.argsort(owner[used], kind="stable")]
    return _from_sizes(indices, np.bincount(owner[used], minlength=num_clients))


def _near_equal_sizes(total: int, parts: int) -> np.ndarray:
    """``parts`` sizes summing to ``total`` that differ by at most one (larger ones first)."""
    base, remainder = divmod(total, parts)
    return base + (np.arange(parts) < remainder).astype(np.int64)


def _apportion(total: int, weights: np.ndarray, minimum: int, capacity: np.ndarray | None = None) -> np.ndarray:
    """Integers ``≥ minimum`` (and ``≤ capacity``) summing to ``total`` (or to ``capacity.sum()``
    if that is smaller), proportional to ``weights`` above the minimum; largest remainders round
    up."""
    share = minimum + (total - minimum * weights.shape[0]) * weights / weights.sum()
    counts = np.floor(share).astype(np.int64)
    if capacity is not None:
        counts = np.minimum(counts, capacity)
    while (shortfall := total - int(counts.sum())) > 0:
        has_room = np.ones_like(counts, dtype=bool) if capacity is None else counts < capacity
        if not has_room.any():
            break
        priority = np.where(has_room, share - counts, -np.inf)
        grow = np.argsort(-priority, kind="stable")[: min(shortfall, int(has_room.sum()))]
        counts[grow] += 1
    return counts


def _iid(num_samples: int, num_clients: int, rng: np.random.Generator) -> ClientPartition:
    """Shuffled indices cut into near-equal consecutive parts."""
    return _from_sizes(rng.permutation(num_samples), _near_equal_sizes(num_samples, num_clients))


def _quantity(num_samples: int, num_clients: int, sigma: float, rng: np.random.Generator) -> ClientPartition:
    """Quantity skew: iid labels, client sizes ∝ log-normal(0, sigma) weights, each at least 1."""
    weights = rng.lognormal(mean=0.0, sigma=sigma, size=num_clients)
    sizes = _apportion(num_samples, weights, minimum=1)
    return _from_sizes(rng.permutation(num_samples), sizes)


def _class_segments(labels: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Sample indices grouped by class (shuffled within each class) and the per-class counts."""
    shuffled = rng.permutation(labels.shape[0])
    by_class = shuffled[np.argsort(labels[shuffled], kind="stable")]
    return by_class, np.bincount(labels)


def _shards(labels: np.ndarray, num_clients: int, classes_per_client: int, rng: np.random.Generator) -> ClientPartition:
    """Pathological label skew (FedAvg-paper shards).

    The label-sorted samples are cut into ``K · classes_per_client`` shards, each inside one class
    (a class gets shards in proportion to its size, at least one, at most one per sample), so no
    shard straddles two classes. The shards are shuffled and dealt round-robin, so every client
    gets at least one and at most ``classes_per_client`` shards, hence at most that many classes.
    """
    by_class, class_counts = _class_segments(labels, rng)
    present = class_counts > 0
    num_shards = num_clients * classes_per_client
    if num_shards < int(present.sum()):
        raise ConfigError(
            "data.partition=shards",
            "data.num_clients × data.classes_per_client "
            f"({num_clients} × {classes_per_client} = {num_shards}) must be at least the number "
            f"of classes ({int(present.sum())}) so that every class is dealt out",
            within=None,
        )
    shards_per_class = np.zeros_like(class_counts)
    shards_per_class[present] = _apportion(num_shards, class_counts[present].astype(np.float64), 1, class_counts[present])
    # Shard id of every sample in `by_class` order: class c's samples are cut into
    # shards_per_class[c] near-equal consecutive runs.
    shard_of_sample = np.empty(labels.shape[0], dtype=np.int64)
    class_start = np.concatenate([[0], np.cumsum(class_counts)])
    shard_start = np.concatenate([[0], np.cumsum(shards_per_class)])
    for c in np.flatnonzero(present):
        run_sizes = _near_equal_sizes(int(class_counts[c]), int(shards_per_class[c]))
        shard_of_sample[class_start[c] : class_start[c + 1]] = shard_start[c] + np.repeat(np.arange(shards_per_class[c]), run_sizes)
    client_of_shard = np.empty(int(shard_start[-1]), dtype=np.int64)
    client_of_shard[rng.permutation(client_of_shard.shape[0])] = np.arange(client_of_shard.shape[0]) % num_clients
    owner = np.empty(labels.shape[0], dtype=np.int64)
    owner[by_class] = client_of_shard[shard_of_sample]
    return _from_owner(owner, num_clients)


def _dirichlet(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    min_samples: int,
    rng: np.random.Generator,
) -> ClientPartition:
    """Per-class Dirichlet label skew over clients (Hsu et al. 2019; the MOON/NIID-Bench split
    without its per-client size cap).

    For each class c: draw p ~ Dir(α·1_K) and cut class c's shuffled indices at the cumulative
    proportions ``⌊cumsum(p)·n_c⌋``. The draw is repeated until every client has at least
    ``min_samples`` samples, at most ``_MAX_DIRICHLET_DRAWS`` times, and not again once a draw
    leaves more than ``_HOPELESS_SHORT_CLIENTS`` clients short (as when K is close to N: e.g.
    1,000 clients on 1,437 digits). Fallback: the last draw is repaired by moving samples, one at
    a time from whichever clients are then largest, to the clients that are short, each short
    client getting as few classes as possible (see :func:`_repair_short_clients`). Every other
    client keeps its Dirichlet draw except that the largest ones lose a few samples, so the skew
    is preserved.
    """
    if num_clients * min_samples > labels.shape[0]:
        raise ConfigError(
            None,
            f"data.min_samples_per_client ({min_samples}) × data.num_clients ({num_clients}) "
            f"exceeds the number of training samples ({labels.shape[0]})",
            within=None,
        )
    by_class, class_counts = _class_segments(labels, rng)
    concentration = np.full(num_clients, alpha)
    for _ in range(_MAX_DIRICHLET_DRAWS):
        counts = np.zeros((class_counts.shape[0], num_clients), dtype=np.int64)
        for c, n_c in enumerate(class_counts):
            if n_c == 0:
                continue
            cuts = np.minimum((np.cumsum(rng.dirichlet(concentration)) * n_c).astype(np.int64), n_c)
            cuts[-1] = n_c
            counts[c] = np.diff(cuts, prepend=0)
        num_short = int((counts.sum(axis=0) < min_samples).sum())
        if num_short == 0 or num_short > _HOPELESS_SHORT_CLIENTS:
            break
    owner = np.empty(labels.shape[0], dtype=np.int64)
    class_of_run, client_of_run = np.nonzero(counts)  # runs in class-major order, like `by_class`
    owner[by_class] = np.repeat(client_of_run, counts[class_of_run, client_of_run])
    if num_short:
        _repair_short_clients(owner, labels, num_clients, min_samples, rng)
    return _from_owner(owner, num_clients)


def _repair_short_clients(
    owner: np.ndarray,
    labels: np.ndarray,
    num_clients: int,
    min_samples: int,
    rng: np.random.Generator,
) -> None:
    """Move samples (in place in ``owner``) so that every client has ``min_samples``.

    Donors: each client's samples are put in random order and a sample at position j of its client's
    list is given away before any sample at a lower position. Taking the highest positions first is
    taking one sample at a time from the currently largest clients, and positions below
    ``min_samples`` are never given away, so donors keep their minimum. Recipients: the given-away
    samples are sorted by label and dealt in consecutive runs to the short clients (in random
    order), so each short client is filled with as few classes as possible, like a skewed draw.
    """
    sizes = np.bincount(owner, minlength=num_clients)
    deficit = np.maximum(min_samples - sizes, 0)
    order = np.lexsort((rng.random(owner.shape[0]), owner))
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    position = np.empty(owner.shape[0], dtype=np.int64)
    position[order] = np.arange(owner.shape[0]) - offsets[owner[order]]
    # Highest positions first; ties (same position in different clients) in random order.
    donated = np.lexsort((rng.random(owner.shape[0]), -position))[: int(deficit.sum())]
    donated = donated[np.argsort(labels[donated], kind="stable")]
    short_clients = rng.permutation(np.flatnonzero(deficit))
    owner[donated] = np.repeat(short_clients, deficit[short_clients])


def _long_tail_subset(labels: np.ndarray, imbalance_ratio: float, seed: int) -> np.ndarray:
    """Spec C.1 step 1: class c keeps the first ⌊n_max · ρ^{-c/(C-1)}⌋ of its shuffled indices,
    n_max = N / C (at most all of them). The official code shuffles with the global numpy RNG
    after seeding it; a private ``RandomState(seed)`` draws the same without touching global
    state."""
    num_classes = int(labels.max()) + 1
    random_state = np.random.RandomState(seed)
    n_max = labels.shape[0] / num_classes
    kept = []
    for c in range(num_classes):
        indices = np.flatnonzero(labels == c)
        random_state.shuffle(indices)
        kept.append(indices[: int(n_max * imbalance_ratio ** (-c / (num_classes - 1)))])
    return np.concatenate(kept)


def _dirichlet_equal_size(labels: np.ndarray, num_clients: int, alpha: float, imbalance_ratio: float, seed: int) -> ClientPartition:
    """The CReFF partition (the official ``utils/sample_dirichlet.py`` and
    ``utils/long_tailed_cifar10.py`` of FedSC/FedSKC): equal client sizes, Dirichlet label mixtures.

    1. Long tail with ρ = ``imbalance_ratio`` (ρ = 1: none, every sample is used).
    2. With ``RandomState(seed)``: shuffle the (index, label) list; cut it into ⌈K/10⌉ chunks of
       ⌊10/K · n⌋ (the last takes the rest), each shared by 10 workers (the last chunk by the
       remainder). In a chunk of T samples and W workers, repeat until every worker has at least
       ⌊0.5·T/W⌋ samples: for each class draw p ~ Dir(α·1_W), zero p_w of workers already
       holding ≥ T/W, renormalise, cut the chunk's class indices at ⌊cumsum(p)·n_c⌋.
    3. Concatenate all workers' lists in order and cut into K parts of ⌊n/K⌋ or ⌊n/K⌋+1 (the
       larger first).
    """
    if num_clients < _WORKERS_PER_CHUNK:
        raise ConfigError(
            None,
            f"data.partition=dirichlet_equal_size needs data.num_clients >= {_WORKERS_PER_CHUNK} "
            f"(the official procedure asserts K >= 10), got {num_clients}; use "
            f"data.partition=dirichlet for fewer clients",
            within=None,
        )
    if imbalance_ratio > 1:
        used = _long_tail_subset(labels, imbalance_ratio, seed)
    else:
        used = np.arange(labels.shape[0])
    if num_clients > used.shape[0]:
        raise ConfigError(
            None,
            f"data.num_clients (K={num_clients}) exceeds the number of training samples left after "
            f"the long tail of data.imbalance_ratio={imbalance_ratio} (N={used.shape[0]})",
            within=None,
        )
    num_classes = int(labels.max()) + 1
    random_state = np.random.RandomState(seed)
    pairs = np.stack([used, labels[used]], axis=1)
    random_state.shuffle(pairs)
    num_used = pairs.shape[0]
    num_chunks = math.ceil(num_clients / _WORKERS_PER_CHUNK)
    chunk_step = int(_WORKERS_PER_CHUNK / num_clients * num_used)
    workers_left = num_clients
    worker_lists: list[np.ndarray] = []
    for chunk in range(num_chunks):
        start = chunk * chunk_step
        stop = num_used if chunk == num_chunks - 1 else start + chunk_step
        num_workers = min(_WORKERS_PER_CHUNK, workers_left)
        workers_left -= num_workers
        worker_lists.extend(_dirichlet_chunk(pairs[start:stop], num_workers, num_classes, alpha, random_state))
    return _from_sizes(np.concatenate(worker_lists), _near_equal_sizes(num_used, num_clients))


def _dirichlet_chunk(
    pairs: np.ndarray,
    num_workers: int,
    num_classes: int,
    alpha: float,
    random_state: np.random.RandomState,
) -> list[np.ndarray]:
    """Spec C.1 step 2 inside one chunk of (index, label) rows: capped Dirichlet with redraws."""
    chunk_size = pairs.shape[0]
    fair_share = chunk_size / num_workers
    concentration = np.repeat(alpha, num_workers)
    for _ in range(_MAX_CHUNK_DRAWS):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_workers)]
        held = np.zeros(num_workers, dtype=np.int64)
        for c in range(num_classes):
            class_indices = pairs[pairs[:, 1] == c, 0]
            # A tiny data.alpha makes the draw NaN (every gamma variate underflows to 0); like the official
            # code, such a draw is used as it is and fails the check below, without numpy's warnings.
            with np.errstate(invalid="ignore"):
                proportions = random_state.dirichlet(concentration) * (held < fair_share)
                if proportions.sum() == 0:  # every worker is full, which leaves no samples to split
                    continue
                proportions /= proportions.sum()
                cuts = (np.cumsum(proportions) * class_indices.shape[0]).astype(np.int64)[:-1]
            for worker, piece in enumerate(np.split(class_indices, cuts)):
                parts[worker].append(piece)
                held[worker] += piece.shape[0]
        if held.min() >= int(0.5 * fair_share):
            return [np.concatenate(worker_parts) for worker_parts in parts]
    raise ConfigError(
        "data.alpha",
        f"data.partition=dirichlet_equal_size found no draw in {_MAX_CHUNK_DRAWS} that gave each of the {num_workers} clients "
        f"sharing a chunk of {chunk_size} samples at least half of its {fair_share:.1f}; raise data.alpha (now {alpha:g})",
    )
