"""``metrics.parquet``: one row per round (``scope == "round"``) plus one row per client per round
(``scope == "client"``, with ``client_id``).

The file is rewritten atomically, so a reader (the dashboard, a notebook) never sees a half-written
file. It is rewritten at every checkpoint round, at the end, and otherwise at most once per
``min_interval`` seconds: rows after the last checkpoint are recomputed on resume anyway, and the
rewrite grows with the run, so rewriting it every round would make long runs quadratic."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from fedray.tracking.callbacks import Callback, RunContext

METRICS_FILE = "metrics.parquet"


def write_parquet_atomically(table: pa.Table, path: Path) -> None:
    """Write ``table`` to a temporary file beside ``path``, then rename it over ``path``: a reader
    sees the old file or the new one, never half of one."""
    temporary = path.with_suffix(".parquet.tmp")
    pq.write_table(table, temporary)
    os.replace(temporary, path)


def write_table_atomically(rows: list[dict[str, Any]], path: Path) -> None:
    """Write ``rows`` (dicts whose keys may differ) as one Parquet table; missing values are null."""
    columns = list(dict.fromkeys(key for row in rows for key in row))
    write_parquet_atomically(pa.Table.from_pydict({c: [row.get(c) for row in rows] for c in columns}), path)


def read_metrics(run_dir: str | Path, scope: str = "round") -> list[dict[str, Any]]:
    """Rows of ``metrics.parquet`` with the given scope (``"round"`` or ``"client"``)."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return []
    return [row for row in pq.read_table(path).to_pylist() if row["scope"] == scope]


class MetricsParquet(Callback):
    def __init__(self, min_interval: float = 1.0) -> None:
        self.rows: list[dict[str, Any]] = []
        self.min_interval = min_interval
        self._last_write = 0.0

    def on_run_start(self, run: RunContext) -> None:
        path = run.run_dir / METRICS_FILE
        if run.start_round > 0 and path.is_file():  # resuming: keep what the checkpoint covers
            self.rows = [r for r in pq.read_table(path).to_pylist() if r["round"] <= run.start_round]
            run.history.extend(r for r in self.rows if r["scope"] == "round")

    def on_round_end(self, run: RunContext, row: dict[str, Any], client_rows: list[dict[str, Any]]) -> None:
        self.rows.append({"scope": "round", "client_id": None, **row})
        self.rows.extend({"scope": "client", "round": row["round"], **client} for client in client_rows)
        checkpoint_round = row["round"] % run.config.checkpoint.every == 0
        if checkpoint_round or time.monotonic() - self._last_write >= self.min_interval:
            self._write(run)

    def on_run_end(self, run: RunContext) -> None:
        self._write(run)

    def _write(self, run: RunContext) -> None:
        write_table_atomically(self.rows, run.run_dir / METRICS_FILE)
        self._last_write = time.monotonic()
