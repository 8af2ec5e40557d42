"""Which clients are online when a round starts, and until when (``systems.availability``).

Every process answers for all clients at once with arrays, and from (seed, round, client id) and the
simulated time only, so it needs no state of its own to checkpoint:

- ``always``: every client, for the whole round.
- ``bernoulli``: client c is online in round r with ``probability``: ``u(seed, r, c) < p``.
- ``diurnal``: as bernoulli with p_c(t) = clip(p · (1 + a · cos 2π(t / day + φ_c)), 0, 1) at the round's
  start time t, where φ_c ∈ [0, 1) is client c's time zone, drawn once from (seed, c); a =
  ``diurnal_amplitude``, day = ``day_seconds``. Over a day the mean is p (where p · (1 + a) ≤ 1).
- ``trace``: the online intervals of the user's table (:func:`read_trace`), in simulated seconds,
  repeating every ``trace_period_seconds`` if set. A client is online at t if an interval has
  start ≤ t < end, and goes offline at that interval's end: one that goes offline before it
  finishes its round drops out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedray.config import ConfigError
from fedray.config.schema import AvailabilityConfig
from fedray.systems.draws import AVAILABILITY_STREAM, TIME_ZONE_STREAM, uniform
from fedray.systems.tables import check_client_ids, read_columns

TRACE_KEY = "systems.availability.trace_file"


class AvailabilityProcess:
    """``always``: every client is online, until the round ends. The base of the other processes."""

    def __init__(self, num_clients: int) -> None:
        self.num_clients = num_clients

    def online(self, round: int, time: float) -> np.ndarray:
        """bool ``[num_clients]``: who is online when ``round`` starts at simulated ``time``."""
        return np.ones(self.num_clients, dtype=bool)

    def offline_at(self, client_ids: np.ndarray, time: float) -> np.ndarray:
        """float64: when each of ``client_ids`` (online at ``time``) goes offline (inf: not this round)."""
        return np.full(len(client_ids), np.inf)


class BernoulliAvailability(AvailabilityProcess):
    """``bernoulli``: online in each round with ``probability``, independently of other rounds."""

    def __init__(self, num_clients: int, seed: int, probability: float) -> None:
        super().__init__(num_clients)
        self.seed = seed
        self.probability = probability
        self.client_ids = np.arange(num_clients)

    def probabilities(self, time: float) -> np.ndarray | float:
        return self.probability

    def online(self, round: int, time: float) -> np.ndarray:
        return uniform(self.seed, AVAILABILITY_STREAM, round, self.client_ids) < self.probabilities(time)


class DiurnalAvailability(BernoulliAvailability):
    """``diurnal``: bernoulli with a probability that follows each client's local time of day."""

    def __init__(self, num_clients: int, seed: int, probability: float, amplitude: float, day_seconds: float) -> None:
        super().__init__(num_clients, seed, probability)
        self.amplitude = amplitude
        self.day_seconds = day_seconds
        self.time_zones = uniform(seed, TIME_ZONE_STREAM, 0, self.client_ids)

    def probabilities(self, time: float) -> np.ndarray:
        phase = 2.0 * np.pi * (time / self.day_seconds + self.time_zones)
        return np.clip(self.probability * (1.0 + self.amplitude * np.cos(phase)), 0.0, 1.0)


@dataclass(frozen=True)
class Trace:
    """Online intervals sorted by (client, start), none overlapping another of its client."""

    client_ids: np.ndarray  # int64 [intervals]
    starts: np.ndarray  # float64 [intervals], simulated seconds
    ends: np.ndarray
    period: float | None  # the trace repeats with this period (None: it does not)


def read_trace(path: str, num_clients: int, period: float | None) -> Trace:
    """The trace in ``path``: a ``.csv`` or ``.parquet`` with one row per online interval, columns
    ``client_id, start, end`` (simulated seconds, 0 ≤ start < end, ≤ ``period`` if one is set). A client
    may have many rows, which must not overlap; a client without rows is never online. Unknown client
    ids, negative, empty or overlapping intervals and a trace with no interval at all are config errors."""
    columns = read_columns(path, TRACE_KEY, ("client_id", "start", "end"))
    ids, starts, ends = columns["client_id"], columns["start"], columns["end"]
    if len(ids) == 0:
        raise ConfigError(TRACE_KEY, f"{path} has no online interval: no client is ever online")
    check_client_ids(ids, num_clients, path, TRACE_KEY)
    bad = np.flatnonzero((starts < 0) | (ends <= starts))
    if len(bad):
        row = int(bad[0])
        raise ConfigError(
            TRACE_KEY,
            f"{path} row {row + 1}: interval [{starts[row]:g}, {ends[row]:g}) of client {int(ids[row])} is negative or empty; need 0 <= start < end",
        )
    if period is not None and (ends > period).any():
        row = int(np.flatnonzero(ends > period)[0])
        raise ConfigError(
            TRACE_KEY, f"{path} row {row + 1}: interval ends at {ends[row]:g}, after systems.availability.trace_period_seconds={period:g}"
        )
    order = np.lexsort((starts, ids))
    ids, starts, ends = ids[order], starts[order], ends[order]
    overlapping = np.flatnonzero((ids[1:] == ids[:-1]) & (starts[1:] < ends[:-1]))
    if len(overlapping):
        i = int(overlapping[0])
        raise ConfigError(
            TRACE_KEY,
            f"{path}: client {int(ids[i])} has overlapping intervals [{starts[i]:g}, {ends[i]:g}) and [{starts[i + 1]:g}, {ends[i + 1]:g})",
        )
    return Trace(ids, starts, ends, period)


class TraceAvailability(AvailabilityProcess):
    """``trace``: online during the intervals of a :class:`Trace`."""

    def __init__(self, num_clients: int, trace: Trace) -> None:
        super().__init__(num_clients)
        self.trace = trace

    def _trace_time(self, time: float) -> float:
        return time % self.trace.period if self.trace.period is not None else time

    def _active(self, time: float) -> np.ndarray:
        """bool [intervals]: the intervals holding ``time`` (at most one per client)."""
        t = self._trace_time(time)
        return (self.trace.starts <= t) & (t < self.trace.ends)

    def online(self, round: int, time: float) -> np.ndarray:
        online = np.zeros(self.num_clients, dtype=bool)
        online[self.trace.client_ids[self._active(time)]] = True
        return online

    def offline_at(self, client_ids: np.ndarray, time: float) -> np.ndarray:
        active = self._active(time)
        active_clients, active_ends = self.trace.client_ids[active], self.trace.ends[active]  # ascending clients
        offline = np.full(len(client_ids), time)  # a client in no interval is offline already
        if len(active_clients):
            position = np.minimum(np.searchsorted(active_clients, client_ids), len(active_clients) - 1)
            found = active_clients[position] == client_ids
            offline[found] = time + active_ends[position[found]] - self._trace_time(time)
        return offline


def build_availability(config: AvailabilityConfig, seed: int, num_clients: int) -> AvailabilityProcess:
    """The process ``systems.availability.process`` names; a bad trace file is a config error."""
    if config.process == "bernoulli":
        return BernoulliAvailability(num_clients, seed, config.probability)
    if config.process == "diurnal":
        return DiurnalAvailability(num_clients, seed, config.probability, config.diurnal_amplitude, config.day_seconds)
    if config.process == "trace":
        assert config.trace_file is not None
        return TraceAvailability(num_clients, read_trace(config.trace_file, num_clients, config.trace_period_seconds))
    return AvailabilityProcess(num_clients)
