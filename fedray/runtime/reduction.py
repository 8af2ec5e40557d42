"""Worker-side pre-aggregation (docs/architecture.md, principle 3) and the server-side merge.

A worker adds each client's ``sums`` into float64 running totals in ascending client order, so the
same clients give bit-identical partials on any worker. Updates with a non-finite value anywhere are
left out and reported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from fedray.algorithms.base import ClientUpdate, RoundResults


def is_finite_update(update: ClientUpdate) -> bool:
    """True if every tensor the server would use (sums and payload tensors) is finite. A NaN or inf
    entry makes the float64 sum non-finite, so one reduction per tensor replaces an element-wise
    mask (a model-sized allocation per client)."""
    tensors = list(update.sums.values()) + [v for v in update.payload.values() if isinstance(v, torch.Tensor)]
    return all(math.isfinite(float(t.sum(dtype=torch.float64))) for t in tensors if t.is_floating_point())


@dataclass
class PartialResult:
    """One worker's reduction of its clients' updates (moved to the CPU for transport)."""

    sums: dict[str, torch.Tensor] = field(default_factory=dict)
    payloads: dict[int, dict[str, Any]] = field(default_factory=dict)
    client_metrics: dict[int, dict[str, float]] = field(default_factory=dict)
    num_clients: int = 0
    excluded_clients: list[int] = field(default_factory=list)
    stateful_clients: list[int] = field(default_factory=list)  # clients that stored new state

    def add(self, client_id: int, update: ClientUpdate) -> bool:
        """Fold one client in; returns False (and records the client) if its update is not finite."""
        self.client_metrics[client_id] = dict(update.metrics)
        if not is_finite_update(update):
            self.excluded_clients.append(client_id)
            return False
        for name, value in update.sums.items():
            value = value.detach().to(dtype=torch.float64)
            if name in self.sums:
                self.sums[name] += value
            else:
                self.sums[name] = value.clone()
        if update.payload:
            self.payloads[client_id] = update.payload
        self.num_clients += 1
        return True

    def to_cpu(self) -> "PartialResult":
        self.sums = {name: value.cpu() for name, value in self.sums.items()}
        self.payloads = {cid: tensors_to(payload, "cpu") for cid, payload in self.payloads.items()}
        return self


def tensors_to(values: dict[str, Any], device: torch.device | str) -> dict[str, Any]:
    """``values`` with every tensor detached and moved to ``device``; other values as they are."""
    return {k: v.detach().to(device) if isinstance(v, torch.Tensor) else v for k, v in values.items()}


def merge_partials(partials: list[PartialResult]) -> RoundResults:
    """Add the workers' partials in worker order (fixed by the schedule, so deterministic)."""
    sums: dict[str, torch.Tensor] = {}
    for partial in partials:
        for name, value in partial.sums.items():
            sums[name] = sums[name] + value if name in sums else value.clone()
    return RoundResults.merged(partials, sums)
