"""Side concerns of a run (metrics files, TensorBoard, plots, checkpoints, progress) as callbacks,
so the round loop in :mod:`fedray.runtime.experiment` stays a loop."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedray.config import RunConfig

if TYPE_CHECKING:  # torch-free at run time, so readers of run files (the dashboard) import fedray.tracking cheaply
    from fedray.data import FederatedDataset


@dataclass
class RunContext:
    """What callbacks may read about the run in progress."""

    config: RunConfig
    run_dir: Path
    data: FederatedDataset
    server: Any  # the server actor handle
    start_round: int  # rounds already done (0, or the checkpoint's round when resuming)
    history: list[dict[str, Any]] = field(default_factory=list)  # round rows of this run so far


class Callback:
    def on_run_start(self, run: RunContext) -> None:
        pass

    def on_round_end(self, run: RunContext, row: dict[str, Any], client_rows: list[dict[str, Any]]) -> None:
        pass

    def on_run_end(self, run: RunContext) -> None:
        pass
