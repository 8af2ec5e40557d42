"""Who of a round's selected clients reports in time (``systems.selection``), decided before any
client trains (Bonawitz et al. 2019, "Towards Federated Learning at Scale", §2.2 and §9).

The server selects ⌈``over_selection`` · K⌉ online clients (K = ``train.clients_per_round``). Each
selected client c

- drops out with probability ``dropout`` (a draw from (seed, round, c)), or because the availability
  process takes it offline before it would finish (trace availability);
- else is late if it would finish after ``deadline_seconds``, or after the first K reports: the
  server closes the round as soon as K clients have reported;
- else reports, and is the only kind of client that trains: a dropped or late client is not run at
  all, so it stores no client state (SCAFFOLD's control variate, FedDyn's gradient, MOON's model
  keep their last reported values) and costs no compute.

The round closes at the K-th report; failing that, at the deadline; without a deadline, when the last
selected client has reported or dropped (a drop is noticed when the client would have finished, or
when it goes offline). With nobody selected (nobody online) it lasts the deadline, or
``empty_round_seconds``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedray.config.schema import SelectionConfig
from fedray.systems.draws import DROPOUT_STREAM, uniform


@dataclass(frozen=True)
class RoundPlan:
    """A round's selection and its outcome on the simulated clock."""

    start_time: float  # simulated seconds when the round starts
    selected: np.ndarray  # ascending ids of the clients selected
    reporting: np.ndarray  # ascending ids of those that report in time: the clients to train
    dropped: int
    late: int
    duration: float  # simulated seconds from the start to the close of the round

    @property
    def end_time(self) -> float:
        return self.start_time + self.duration


def selection_size(config: SelectionConfig, target: int, online: int) -> int:
    """How many of ``online`` clients to select for a target of ``target`` reports."""
    return min(math.ceil(config.over_selection * target - 1e-9), online)  # 1.3 · 10 is 13.000000000000002


def plan_round(
    config: SelectionConfig,
    seed: int,
    round: int,
    start_time: float,
    selected: np.ndarray,
    durations: np.ndarray,
    offline_at: np.ndarray,
    target: int,
) -> RoundPlan:
    """The outcome of ``round`` for ``selected`` (ascending ids) whose rounds would take ``durations``
    and who go offline at ``offline_at`` (module docstring); at most ``target`` clients report."""
    if len(selected) == 0:
        duration = config.deadline_seconds if config.deadline_seconds is not None else config.empty_round_seconds
        return RoundPlan(start_time, selected, selected, 0, 0, duration)
    time_online = offline_at - start_time
    dropped = (uniform(seed, DROPOUT_STREAM, round, selected) < config.dropout) | (time_online < durations)
    on_time = ~dropped if config.deadline_seconds is None else ~dropped & (durations <= config.deadline_seconds)
    candidates = np.flatnonzero(on_time)
    first = candidates[np.lexsort((selected[candidates], durations[candidates]))][:target]  # first to finish, ties by id
    reporting = np.sort(selected[first])
    if len(first) == target:
        duration = float(durations[first].max())
    elif config.deadline_seconds is not None:
        duration = config.deadline_seconds
    else:
        duration = float(np.minimum(durations, time_online).max())
    return RoundPlan(start_time, selected, reporting, int(dropped.sum()), int((~dropped).sum()) - len(first), duration)
