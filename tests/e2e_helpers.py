"""Helpers shared by the end-to-end tests: reading a run's results back, and a simulated crash."""

from __future__ import annotations

import torch

from fedray.runtime import list_checkpoints, load_checkpoint
from fedray.tracking import Callback, read_metrics


def final_weights(run_dir) -> torch.Tensor:
    """The global weights in the run's newest checkpoint."""
    return load_checkpoint(list_checkpoints(run_dir)[-1][1])["server_state"]["weights"]


def round_rows(run_dir) -> list[dict]:
    return read_metrics(run_dir, "round")


def comparable_rows(rows: list[dict]) -> list[dict]:
    """Rows without wall-clock time and the count of replaced workers (the only intended
    differences between a faulted or resumed run and a clean one), for exact comparisons."""
    return [{k: v for k, v in row.items() if k not in ("seconds", "worker_restarts")} for row in rows]


class CrashAfterRound(Callback):
    """Raises after ``round`` ends, as a driver crash would (the round's checkpoint, if any, is not written)."""

    def __init__(self, round: int) -> None:
        self.round = round

    def on_round_end(self, run, row, client_rows):
        if row["round"] == self.round:
            raise RuntimeError("simulated driver crash")
