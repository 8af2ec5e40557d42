"""Buffered asynchronous aggregation on the simulated clock (``train.mode: async``, ``systems.fedbuff``):
FedBuff (Nguyen et al., "Federated Learning with Buffered Asynchronous Aggregation", AISTATS 2022,
Algorithm 1).

Clients train continuously, at most C = ``systems.fedbuff.concurrency`` at once, each from the global
model version current when it starts; the server adds each arriving update to a buffer and, at the
K-th (K = ``buffer_size``), updates the model and empties the buffer. One aggregation is one round
of the run: round t turns model version t − 1 into version t. This module decides on the simulated
clock, before any client trains, who trains from which version and which updates each aggregation
receives (:class:`BufferSchedule`), and how a buffer's updates combine (:func:`buffered_results`);
:mod:`fedray.runtime.async_rounds` trains them on the worker pool.

The schedule of round t, from the time the last aggregation closed:

- whenever a slot is free at simulated time s, the server starts the next eligible client: online at
  s (``systems.availability``, drawn for round t), not training, and not finished (reported or
  dropped) since the last aggregation, so that a client trains once per model version at most and
  contributes once per buffer at most. Eligible clients start in a random order drawn per version
  from (seed, t, client id). A client's duration T_c is the systems clock's (download, local
  training, upload: :mod:`fedray.systems.clock`);
- a started client drops out with probability ``systems.selection.dropout`` (drawn from (seed, t,
  client id)), or when its availability ends before it would finish; its slot frees when it would
  have finished, or went offline, and it counts in the round's ``dropped``;
- clients finish in order of time, ties by id; everything that finishes at one instant is received
  before any client starts at that instant. The K-th update to arrive closes the round at its time
  (updates that arrive at the same instant after it go to the next round's buffer);
- when no client is training and none can start, the round closes with the updates it has (a
  warning), or with none: a counted empty round that moves the clock by
  ``systems.selection.empty_round_seconds`` when no time has passed, as a synchronous round with
  nobody online does. A round therefore always ends: each client starts at most once in it.

An update trained from version v and aggregated in round t is τ = t − 1 − v versions stale and
weighted s(τ) = (1 + τ)^−a, a = ``staleness_exponent`` (:func:`staleness_weights`). With
``max_staleness`` = τ_max set, an update that arrives with τ > τ_max is discarded: it does not fill
the buffer, its client counts in the round's ``late`` and may start again from the current version (the
lag tolerance of SAFA, Wu et al., "SAFA: a Semi-Asynchronous Protocol for Fast Federated Learning with
Low Overhead", IEEE Trans. Computers 2021). The discarded update is not computed: its client's state
(e.g. MOON's previous local model) stays what it was, as if it had not trained.

With ``privacy`` or ``robust`` on, the buffer's groups go to the server's upload path instead of
:func:`buffered_results` (:meth:`fedray.runtime.upload_path.ServerUploadPath.apply_buffer`): central
noise once on the sum of the staleness-weighted clipped deltas over the fixed denominator K, local DP's
noised deltas, or a robust rule over the buffer's staleness-weighted deltas. That a client contributes
to a buffer at most once (above) is what bounds one client's change of the buffer's sum by C.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

from fedray.algorithms import RoundResults
from fedray.algorithms.uploads import MODEL_WEIGHTS, no_uploads
from fedray.config import ConfigError, RunConfig
from fedray.systems.draws import DROPOUT_STREAM, FEDBUFF_STREAM, uniform

if TYPE_CHECKING:
    from fedray.algorithms import Algorithm
    from fedray.systems.availability import AvailabilityProcess

logger = logging.getLogger(__name__)


class SystemsView(Protocol):
    """What the schedule uses of :class:`fedray.systems.SystemsModel`, whose package imports this
    module (declared here, so that this module does not import its package)."""

    train_flops: np.ndarray
    clock: float
    availability: AvailabilityProcess

    def durations(self, client_ids: np.ndarray, broadcast_bytes: int) -> np.ndarray: ...


#: The sums of a weighted-mean algorithm's update (:data:`~fedray.algorithms.uploads.MODEL_WEIGHTS`).
WEIGHTED_SUMS = frozenset(MODEL_WEIGHTS.sums)


def staleness_weights(staleness: np.ndarray, exponent: float) -> np.ndarray:
    """s(τ) = (1 + τ)^−a for each staleness τ ≥ 0: the polynomial staleness function of FedAsync (Xie
    et al. 2019, §5.2), which FedBuff uses with a = 0.5, s(τ) = 1/√(1 + τ) (Nguyen et al. 2022, §6);
    a = ``systems.fedbuff.staleness_exponent``, 0: every update counts fully."""
    return np.power(1.0 + np.asarray(staleness, dtype=np.float64), -exponent)


def buffered_results(groups: list[tuple[RoundResults, float, torch.Tensor]], current: torch.Tensor, mixing: str = "delta") -> RoundResults:
    """A buffer's updates as the :class:`RoundResults` of one weighted-mean round, whose
    ``sums["weights"] / sums["num_samples"]`` the algorithm's ``aggregate`` takes as the round's mean:

        w + Σ_k s(τ_k) · n_k · (w_k − w_{v_k}) / Σ_k n_k

    with w = ``current`` (the weights of the version being updated), n_k and w_k client k's weight and
    model, and w_{v_k} the weights it started from. It is FedBuff's buffered update Δ̄ (Algorithm 1,
    with the clients' n_k / Σ n_k in place of 1/K), applied by the algorithm's server rule: w + Δ̄
    with ``algorithm.server_optimizer: none`` and ``server_lr`` η = 1, w + η·Δ̄ with another η (the
    paper's server learning rate), or a server optimizer's step on the pseudo-gradient Δ̄.

    With ``mixing`` = ``"model"`` (``systems.fedbuff.mixing``) w_{v_k} is replaced by w: the mean is
    w + Σ_k s(τ_k) · n_k · (w_k − w) / Σ_k n_k, and with one update a buffer (``buffer_size`` 1) and
    ``server_lr`` α the server's step is FedAsync's mixing (Xie et al., "Asynchronous Federated
    Optimization", 2019, Algorithm 1): w ← (1 − α_t)·w + α_t·w_k, α_t = α·s(τ). For fresh updates
    (w_{v_k} = w) both are the same sums.

    ``groups``: per model version the buffer's clients started from, their merged results, their
    common s(τ), and that version's float32 weights. The sums are formed so that one group of fresh
    updates (τ = 0, from ``current``) gives exactly the sums a synchronous round of the same clients
    would: Σ n_k w_k + (N·w − N·w), whose correction term is exactly 0 in floating point."""
    weighted: torch.Tensor | None = None  # Σ_g s_g · Σ_{k in g} n_k w_k
    started_from: torch.Tensor | None = None  # Σ_g s_g · N_g · w_g
    num_samples = torch.zeros((), dtype=torch.float64)
    for results, weight, start in groups:
        if results.num_clients == 0:
            continue
        if mixing == "model":
            start = current
        if set(results.sums) != WEIGHTED_SUMS:
            raise TypeError(f"train.mode=async combines the sums {sorted(WEIGHTED_SUMS)} only; the clients uploaded {sorted(results.sums)}")
        term = float(weight) * results.sums["weights"]
        origin = (float(weight) * results.sums["num_samples"]) * start.double()
        weighted = term if weighted is None else weighted + term
        started_from = origin if started_from is None else started_from + origin
        num_samples = num_samples + results.sums["num_samples"]
    sums = {}
    if weighted is not None and started_from is not None:
        sums = {"weights": weighted + (num_samples * current.double() - started_from), "num_samples": num_samples}
    return RoundResults.merged([results for results, _, _ in groups], sums)


@dataclass(frozen=True)
class Buffer:
    """What one aggregation receives, and what happened on the clock since the last one."""

    clients: np.ndarray  # ids of the updates received, in order of arrival
    versions: np.ndarray  # the model version each of them started from
    end_time: float  # simulated seconds at which the round closes
    started: int  # clients started since the last aggregation
    dropped: int  # clients that dropped out since the last aggregation
    late: int  # updates discarded as more than systems.fedbuff.max_staleness versions old


class BufferSchedule:
    """The clients in training and their fate on the simulated clock (module docstring), as arrays:
    ``clients[i]`` started from model version ``versions[i]`` and finishes (or drops, where
    ``dropped[i]``) at simulated time ``finish[i]``. Its clock is ``systems.clock``: the time the last
    aggregation closed."""

    def __init__(self, config: RunConfig, systems: SystemsView) -> None:
        self.config = config
        self.systems = systems
        self.num_clients = len(systems.train_flops)
        self.concurrency = config.systems.fedbuff.concurrency_for(config.train.clients_per_round)
        self.buffer_size = config.systems.fedbuff.buffer_size
        self.max_staleness = config.systems.fedbuff.max_staleness
        self.clients = np.empty(0, dtype=np.int64)
        self.versions = np.empty(0, dtype=np.int64)
        self.finish = np.empty(0, dtype=np.float64)
        self.dropped = np.empty(0, dtype=bool)

    def next_buffer(self, round: int, broadcast_bytes: int) -> Buffer:
        """Run the clock from the last aggregation to the close of ``round`` (module docstring);
        ``broadcast_bytes``: the size of the model version ``round - 1``, which the clients that start
        download."""
        start_time = now = self.systems.clock
        finished = np.zeros(self.num_clients, dtype=bool)  # reported or dropped since the last aggregation
        arrived: list[tuple[int, int]] = []
        started = dropped = late = 0
        while len(arrived) < self.buffer_size:
            started += self._start_clients(round, now, finished, broadcast_bytes)
            if len(self.clients) == 0:  # nobody training, nobody can start
                break
            now = float(self.finish.min())
            at_now = np.flatnonzero(self.finish == now)
            received = []
            for index in at_now[np.argsort(self.clients[at_now])]:
                received.append(index)
                finished[self.clients[index]] = True
                if self.dropped[index]:
                    dropped += 1
                    continue
                if self.max_staleness is not None and round - 1 - self.versions[index] > self.max_staleness:
                    late += 1
                    continue
                arrived.append((int(self.clients[index]), int(self.versions[index])))
                if len(arrived) == self.buffer_size:  # the rest of this instant arrives after the aggregation
                    break
            self._remove(np.asarray(received, dtype=np.int64))
        if len(arrived) < self.buffer_size and arrived:
            logger.warning(
                "round %d aggregates %d of systems.fedbuff.buffer_size=%d updates: no client is training and none can start",
                round,
                len(arrived),
                self.buffer_size,
            )
        if not arrived and now == start_time:  # nothing happened: let time pass, as an empty synchronous round
            now += self.config.systems.selection.empty_round_seconds
        arrivals = np.array(arrived, dtype=np.int64).reshape(-1, 2)
        return Buffer(arrivals[:, 0], arrivals[:, 1], now, started, dropped, late)

    def _start_clients(self, round: int, now: float, finished: np.ndarray, broadcast_bytes: int) -> int:
        """Fill the free slots at ``now`` with eligible clients; returns how many started."""
        free = self.concurrency - len(self.clients)
        if free <= 0:
            return 0
        eligible = self.systems.availability.online(round, now) & ~finished
        eligible[self.clients] = False
        candidates = np.flatnonzero(eligible)
        if len(candidates) == 0:
            return 0
        priority = uniform(self.config.seed, FEDBUFF_STREAM, round, candidates)
        chosen = np.sort(candidates[np.lexsort((candidates, priority))[:free]])
        durations = self.systems.durations(chosen, broadcast_bytes)
        time_online = self.systems.availability.offline_at(chosen, now) - now
        drops = (uniform(self.config.seed, DROPOUT_STREAM, round, chosen) < self.config.systems.selection.dropout) | (
            time_online < durations
        )
        self.clients = np.concatenate([self.clients, chosen])
        self.versions = np.concatenate([self.versions, np.full(len(chosen), round - 1, dtype=np.int64)])
        self.finish = np.concatenate([self.finish, now + np.minimum(durations, time_online)])
        self.dropped = np.concatenate([self.dropped, drops])
        return len(chosen)

    def _remove(self, indices: np.ndarray) -> None:
        keep = np.ones(len(self.clients), dtype=bool)
        keep[indices] = False
        self.clients, self.versions, self.finish, self.dropped = (
            self.clients[keep],
            self.versions[keep],
            self.finish[keep],
            self.dropped[keep],
        )

    def versions_in_training(self) -> set[int]:
        """The model versions that clients now training started from."""
        return {int(version) for version in np.unique(self.versions)}

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, torch.Tensor]:
        return {
            "clients": torch.from_numpy(self.clients.copy()),
            "versions": torch.from_numpy(self.versions.copy()),
            "finish": torch.from_numpy(self.finish.copy()),
            "dropped": torch.from_numpy(self.dropped.copy()),
        }

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.clients = state["clients"].numpy().astype(np.int64)
        self.versions = state["versions"].numpy().astype(np.int64)
        self.finish = state["finish"].numpy().astype(np.float64)
        self.dropped = state["dropped"].numpy().astype(bool)


def check_fedbuff(config: RunConfig, algorithm: Algorithm) -> None:
    """``train.mode: async`` combines updates as a weighted mean (:func:`buffered_results`): refuse an
    algorithm whose aggregation is not one, i.e. that uploads anything but
    :data:`~fedray.algorithms.uploads.MODEL_WEIGHTS` (the declaration privacy and robust aggregation
    rely on too)."""
    if config.train.mode != "async":
        return
    cls = type(algorithm)
    if cls.uploads == {MODEL_WEIGHTS}:
        return
    name = cls.name or cls.__name__
    if not cls.uploads:
        what = no_uploads(cls)
    else:
        what = f"{name} uploads {', '.join(sorted(upload.kind for upload in cls.uploads - {MODEL_WEIGHTS}))}"
    raise ConfigError(
        "train.mode",
        f"async combines updates trained from different model versions as a weighted mean of model weights; {what}, "
        "so its aggregation is not one. Use train.mode=sync, or a weighted-mean algorithm such as fedavg, fedprox or moon",
    )
