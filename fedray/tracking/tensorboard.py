"""TensorBoard event files under ``<run_dir>/tensorboard``: every numeric round metric."""

from __future__ import annotations

import math
from typing import Any

from fedray.tracking.callbacks import Callback, RunContext


class TensorBoardLogger(Callback):
    def __init__(self) -> None:
        self.writer = None

    def on_run_start(self, run: RunContext) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(run.run_dir / "tensorboard"), purge_step=run.start_round + 1)

    def on_round_end(self, run: RunContext, row: dict[str, Any], client_rows: list[dict[str, Any]]) -> None:
        for name, value in row.items():
            if name != "round" and isinstance(value, (int, float)) and math.isfinite(value):
                self.writer.add_scalar(name, value, global_step=row["round"])
        self.writer.flush()

    def on_run_end(self, run: RunContext) -> None:
        self.writer.close()
