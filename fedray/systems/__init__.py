"""The systems model: simulated devices, their availability and a simulated clock (``systems``;
docs/guide/systems.md).

Off by default; off, nothing here runs and a run computes exactly what it did before. On, the round
engine asks :meth:`SystemsModel.plan_round` which clients to train before it dispatches any work, and
:meth:`SystemsModel.finish_round` for the round's columns of the metrics row (``sim_time``,
``selected``, ``aggregated``, ``dropped``, ``late``, ``bytes_down``, ``bytes_up``). Everything is an
array indexed by client id and a pure function of (seed, round, client id) and the clock, so the
model's only state is the clock and the last measured upload size (:meth:`SystemsModel.state_dict`).

- :mod:`~fedray.systems.devices`: each client's FLOP/s and bandwidths;
- :mod:`~fedray.systems.availability`: who is online when a round starts, and until when;
- :mod:`~fedray.systems.clock`: bytes moved and each client's round duration;
- :mod:`~fedray.systems.selection`: over-selection, deadline, dropouts: who reports;
- :mod:`~fedray.systems.compression`: what a client's upload is compressed to (the upload path applies it);
- :mod:`~fedray.systems.fedbuff`: buffered asynchronous aggregation (``train.mode: async``) on the clock;
- :mod:`~fedray.systems.draws`: the per-client random draws behind them.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from fedray.algorithms import Algorithm, RoundResults
from fedray.config import ConfigError, RunConfig
from fedray.data import FederatedDataset
from fedray.algorithms.costs import client_forward_flops
from fedray.privacy.secure_aggregation import PROTOCOL_ROUNDS, client_bytes
from fedray.seeding import sample_cohort_among
from fedray.systems.availability import AvailabilityProcess, build_availability
from fedray.systems.clock import client_durations, payload_bytes, upload_bytes
from fedray.systems.compression import check_compression
from fedray.systems.devices import Devices, build_devices
from fedray.systems.fedbuff import check_fedbuff
from fedray.systems.selection import RoundPlan, plan_round, selection_size

logger = logging.getLogger(__name__)

#: The metrics-row columns the systems model adds (absent when it is off).
ROW_KEYS = ("sim_time", "selected", "aggregated", "dropped", "late", "bytes_down", "bytes_up")


class SystemsModel:
    """The simulated devices and clock of one run (``systems.enabled: true``).

    ``forward_flops``: ``[num_clients]`` forward FLOPs per sample of each client's model
    (:func:`~fedray.algorithms.costs.client_forward_flops` with ``exact=True``)."""

    def __init__(self, config: RunConfig, client_sizes: np.ndarray, forward_flops: np.ndarray) -> None:
        systems = config.systems
        self.config = config
        num_clients = len(client_sizes)
        self.devices: Devices = build_devices(systems.devices, config.seed, num_clients)
        self.availability: AvailabilityProcess = build_availability(systems.availability, config.seed, num_clients)
        # n_c · E · F_c · k of every client (clock.py)
        self.train_flops = client_sizes * config.train.local_epochs * forward_flops * systems.train_flops_per_forward
        self.clock = 0.0  # simulated seconds at the end of the last round
        # mean bytes a client uploaded in the last round that aggregated any (None before one did):
        # what a round's timing assumes, since it is decided before its clients run
        self.upload_bytes_per_client: float | None = None

    @classmethod
    def for_run(cls, config: RunConfig, data: FederatedDataset, algorithm: Algorithm) -> "SystemsModel":
        return cls(config, data.clients.sizes, client_forward_flops(algorithm, data, exact=True))

    def durations(self, client_ids: np.ndarray, broadcast_bytes: int) -> np.ndarray:
        """Each client's simulated round duration, uploading the size of the last measured upload
        (before any: the broadcast's size) and, under ``privacy.secure_aggregation``, the protocol's
        bytes among ``client_ids`` (:func:`fedray.privacy.secure_aggregation.client_bytes`)."""
        upload = broadcast_bytes if self.upload_bytes_per_client is None else self.upload_bytes_per_client
        if self.config.privacy.secure_aggregation.enabled:
            upload += client_bytes(self.config.privacy.secure_aggregation, len(client_ids))
        return client_durations(self.devices, client_ids, self.train_flops[client_ids], broadcast_bytes, upload)

    def plan_round(self, round: int, broadcast_bytes: int, selected: np.ndarray | None = None) -> RoundPlan:
        """Select ``round``'s clients among those online (or take ``selected``) and decide who
        reports (:mod:`fedray.systems.selection`); only ``RoundPlan.reporting`` is to be trained."""
        cfg = self.config
        if selected is None:
            online = np.flatnonzero(self.availability.online(round, self.clock))
            size = selection_size(cfg.systems.selection, cfg.train.clients_per_round, len(online))
            selected = sample_cohort_among(cfg.seed, round, online, size)
        selected = np.asarray(selected, dtype=np.int64)
        return plan_round(
            cfg.systems.selection,
            cfg.seed,
            round,
            self.clock,
            selected,
            self.durations(selected, broadcast_bytes),
            self.availability.offline_at(selected, self.clock),
            cfg.train.clients_per_round,
        )

    def finish_round(self, round: int, plan: RoundPlan, results: RoundResults, broadcast_bytes: int) -> dict[str, Any]:
        """Advance the clock past ``plan`` and return the row's :data:`ROW_KEYS` (:meth:`record_round`)."""
        return self.record_round(round, plan.end_time, len(plan.selected), plan.dropped, plan.late, results, broadcast_bytes)

    def record_round(
        self, round: int, end_time: float, selected: int, dropped: int, late: int, results: RoundResults, broadcast_bytes: int
    ) -> dict[str, Any]:
        """Move the clock to ``end_time``, measure the round's uploads and return the row's
        :data:`ROW_KEYS` for ``selected`` clients that each downloaded ``broadcast_bytes``; warns of a
        round that aggregated nobody (it counts, and moves the clock, but changes no model)."""
        uploads = upload_bytes(results)
        if uploads:
            self.upload_bytes_per_client = float(np.mean(list(uploads.values())))
        self.clock = end_time
        if results.num_clients == 0:
            reason = "no client was online" if selected == 0 else f"{dropped} dropped, {late} late"
            logger.warning("round %d aggregated no client update (%s); the model is unchanged", round, reason)
        row = {
            "sim_time": self.clock,
            "selected": int(selected),
            "aggregated": int(results.num_clients),
            "dropped": int(dropped),
            "late": int(late),
            "bytes_down": int(broadcast_bytes * selected),
            "bytes_up": int(sum(uploads.values())),
        }
        secagg = self.config.privacy.secure_aggregation
        if secagg.enabled:  # the protocol runs among the selected clients (Bell et al. 2020)
            row.update(secagg_bytes_per_client=client_bytes(secagg, selected), secagg_rounds=PROTOCOL_ROUNDS)
        return row

    def check_deadline(self, broadcast_bytes: int) -> None:
        """A deadline that not even the fastest client meets is a config error (before Ray starts)."""
        deadline = self.config.systems.selection.deadline_seconds
        if deadline is None:
            return
        fastest = float(self.durations(np.arange(len(self.train_flops)), broadcast_bytes).min())
        if fastest > deadline:
            raise ConfigError(
                "systems.selection.deadline_seconds",
                f"{deadline:g} s, but the fastest client needs {fastest:.4g} s (download, {self.config.train.local_epochs} "
                "local epoch(s), upload); raise it, lower train.local_epochs or choose faster systems.devices",
            )

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, torch.Tensor]:
        """The clock and the upload size the next round's timing assumes (NaN: none measured yet)."""
        upload = float("nan") if self.upload_bytes_per_client is None else self.upload_bytes_per_client
        return {
            "clock": torch.tensor(self.clock, dtype=torch.float64),
            "upload_bytes_per_client": torch.tensor(upload, dtype=torch.float64),
        }

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.clock = float(state["clock"])
        upload = float(state["upload_bytes_per_client"])
        self.upload_bytes_per_client = None if np.isnan(upload) else upload


def check_systems(config: RunConfig, data: FederatedDataset, algorithm: Algorithm, model: torch.nn.Module) -> None:
    """Before Ray starts: build the run's systems model (device and trace files, profile names),
    check its deadline against the broadcast of round 1, that the algorithm uploads what
    ``systems.compression`` compresses and, with ``train.mode: async``, that its aggregation is a
    weighted mean; no-op when ``systems.enabled`` is false (which ``train.mode: async`` needs)."""
    if not config.systems.enabled:
        return
    check_compression(config, algorithm)
    check_fedbuff(config, algorithm)
    systems = SystemsModel.for_run(config, data, algorithm)
    systems.check_deadline(payload_bytes(algorithm.broadcast(algorithm.init_server_state(model), 1)))


__all__ = ["ROW_KEYS", "RoundPlan", "SystemsModel", "check_systems"]
