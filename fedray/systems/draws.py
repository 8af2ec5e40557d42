"""Per-client random draws as pure functions of (seed, stream, round, client id), for whole arrays of
clients at once.

:func:`fedray.seeding.derive_seed` mixes its keys with numpy's ``SeedSequence`` (~10 µs a call): right
for one cohort a round, too slow for one draw per client among a million every round. Here one
``derive_seed(seed, stream, round)`` gives a key, and client ``c``'s value is splitmix64's output at
position ``c + 1`` of the stream that key starts (Steele et al., "Fast splittable pseudorandom number
generators", OOPSLA 2014): ~10 ns a client, vectorised, and the same value whichever clients are
drawn alongside (a client's draw does not depend on ``num_clients`` or on the order of the ids).
"""

from __future__ import annotations

import numpy as np

from fedray.seeding import derive_seed

# Streams of the systems model, apart from each other and from fedray.seeding's (1, 2).
DEVICE_STREAM = 101  # devices: one draw per client for the whole run (round 0)
AVAILABILITY_STREAM = 102  # bernoulli/diurnal availability, per round
TIME_ZONE_STREAM = 103  # diurnal: each client's phase (round 0)
DROPOUT_STREAM = 104  # systems.selection.dropout, per round
COMPRESSION_STREAM = 105  # systems.compression.method=int8: a client's stochastic rounding, per round
FEDBUFF_STREAM = 106  # train.mode=async: the order in which idle clients start, per model version
_GOLDEN_GAMMA = np.uint64(0x9E3779B97F4A7C15)


def _splitmix64(state: np.ndarray) -> np.ndarray:
    """splitmix64's output function on each uint64 of ``state`` (multiplications wrap modulo 2^64)."""
    z = state.copy()
    z ^= z >> np.uint64(30)
    z *= np.uint64(0xBF58476D1CE4E5B9)
    z ^= z >> np.uint64(27)
    z *= np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return z


def uniform(seed: int, stream: int, round: int, client_ids: np.ndarray, draw: int = 0) -> np.ndarray:
    """float64 in [0, 1), one per id of ``client_ids``; ``draw`` numbers independent values of the
    same (seed, stream, round, client)."""
    key = np.uint64(derive_seed(seed, stream, round, draw))
    with np.errstate(over="ignore"):
        state = key + (np.asarray(client_ids, dtype=np.uint64) + np.uint64(1)) * _GOLDEN_GAMMA
        bits = _splitmix64(state)
    return (bits >> np.uint64(11)).astype(np.float64) * 2.0**-53


def standard_normal(seed: int, stream: int, round: int, client_ids: np.ndarray, draw: int = 0) -> np.ndarray:
    """N(0, 1) draws, one per id (Box–Muller on two :func:`uniform` draws, ``2·draw`` and ``2·draw + 1``)."""
    radius = np.sqrt(-2.0 * np.log1p(-uniform(seed, stream, round, client_ids, 2 * draw)))  # log(u), u in (0, 1]
    return radius * np.cos(2.0 * np.pi * uniform(seed, stream, round, client_ids, 2 * draw + 1))
