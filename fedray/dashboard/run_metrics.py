"""A run's metrics as the dashboard serves them, in memory bounded by a round's rows, not the run's.

A run's ``metrics.parquet`` holds one row per round and one per client per round: millions of rows
for a long run with many clients. The dashboard keeps, per file version (:class:`RunMetrics`):

- the round rows whole (one per round: what the curves plot);
- the client rows summarised per round: for each numeric client metric, the count, mean, minimum,
  quartiles and maximum of the clients' values in each round (exact, ``numpy.percentile``);
- each client's participation: the number of rounds that have a row of it (one integer per client id);

and reads a single round's client rows from the file when the page asks for the per-client
distribution at that round (:func:`read_clients_at_round`: Parquet row-group statistics skip the
other rounds). A finished run's ``metrics.parquet`` is read in record batches of
:data:`BATCH_ROWS`, so building the summaries holds one batch and the values of the rounds in it;
a live run's parts (``metrics_parts/``) are read through :func:`~fedray.tracking.metrics_file.read_metrics_table`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from fedray.tracking.metrics_file import METRICS_FILE, PARTS_DIR, list_parts, read_metrics_table

BATCH_ROWS = 1 << 16
#: Statistics of the clients' values in a round, in :attr:`RunMetrics.client_summary`.
SUMMARY_STATISTICS = ("count", "mean", "min", "q25", "median", "q75", "max")
#: Columns that identify a row rather than measure something.
KEY_COLUMNS = frozenset({"trial_id", "round", "scope", "client_id"})


@dataclass
class RunMetrics:
    """A run's round rows and its client rows summarised per round (see the module docstring)."""

    rounds: pd.DataFrame  # the round rows, by round, without ``scope`` and ``client_id``
    client_rounds: list[int] = field(default_factory=list)  # rounds that have client rows, ascending
    client_summary: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)  # metric → statistic → value per client round
    participation: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # client id → rounds it has a row in


class _RoundSummaries:
    """Client values gathered round by round from batches in round order; a round is summarised
    (and its values dropped) once a batch starts past it."""

    def __init__(self) -> None:
        self.pending: dict[int, dict[str, list[np.ndarray]]] = defaultdict(lambda: defaultdict(list))
        self.done: dict[int, dict[str, tuple[float, ...]]] = {}
        self.participation = np.zeros(0, np.int64)

    def add(self, clients: pa.Table) -> None:
        if len(clients) == 0:
            return
        if "client_id" in clients.column_names:
            ids = clients["client_id"].to_numpy(zero_copy_only=False).astype(np.float64)
            counts = np.bincount(ids[np.isfinite(ids) & (ids >= 0)].astype(np.int64))
            if len(counts) > len(self.participation):
                self.participation = np.pad(self.participation, (0, len(counts) - len(self.participation)))
            self.participation[: len(counts)] += counts
        rounds = clients["round"].to_numpy(zero_copy_only=False).astype(np.int64)
        first = int(rounds.min())
        if any(round in self.done for round in np.unique(rounds).tolist()):
            raise _OutOfOrder
        self._finish(below=first)
        order = np.argsort(rounds, kind="stable")
        boundaries = np.flatnonzero(np.diff(rounds[order])) + 1
        for name in metric_columns(clients.schema):
            values = clients[name].to_numpy(zero_copy_only=False).astype(np.float64)[order]
            for round, chunk in zip(rounds[order][np.r_[0, boundaries]].tolist(), np.split(values, boundaries)):
                self.pending[round][name].append(chunk)
        for round in np.unique(rounds).tolist():  # a round whose client rows have no numeric metric still counts
            self.pending.setdefault(round, defaultdict(list))

    def _finish(self, below: float) -> None:
        for round in sorted(r for r in self.pending if r < below):
            self.done[round] = {name: summarise(np.concatenate(chunks)) for name, chunks in self.pending.pop(round).items()}

    def result(self) -> tuple[list[int], dict[str, dict[str, np.ndarray]]]:
        self._finish(below=np.inf)
        rounds = sorted(self.done)
        names = list(dict.fromkeys(name for round in rounds for name in self.done[round]))
        empty = (0.0,) + (np.nan,) * (len(SUMMARY_STATISTICS) - 1)
        summary = {}
        for name in names:
            table = np.array([self.done[round].get(name, empty) for round in rounds], dtype=np.float64).reshape(len(rounds), -1)
            if np.any(table[:, 0] > 0):  # some client reported it
                summary[name] = {statistic: table[:, i] for i, statistic in enumerate(SUMMARY_STATISTICS)}
        return rounds, summary


class _OutOfOrder(Exception):
    """A batch holds client rows of a round already summarised: the file is not in round order."""


def summarise(values: np.ndarray) -> tuple[float, ...]:
    """The :data:`SUMMARY_STATISTICS` of ``values``' finite entries (count 0 and NaNs if none)."""
    finite = values[np.isfinite(values)]
    if len(finite) == 0:
        return (0.0,) + (np.nan,) * (len(SUMMARY_STATISTICS) - 1)
    q25, median, q75 = np.percentile(finite, [25, 50, 75])
    return float(len(finite)), float(finite.mean()), float(finite.min()), float(q25), float(median), float(q75), float(finite.max())


def metric_columns(schema: pa.Schema) -> list[str]:
    """The numeric (not boolean) columns of ``schema`` that measure something."""
    return [
        field.name
        for field in schema
        if field.name not in KEY_COLUMNS and (pa.types.is_integer(field.type) or pa.types.is_floating(field.type))
    ]


def _client_mask(table: pa.Table) -> pa.ChunkedArray | None:
    return pc.equal(table["scope"], "client") if "scope" in table.column_names else None


def summarise_batches(batches: Iterable[pa.RecordBatch]) -> RunMetrics:
    """:class:`RunMetrics` of a run's rows given as record batches in round order."""
    round_tables: list[pa.Table] = []
    clients = _RoundSummaries()
    for batch in batches:
        table = pa.Table.from_batches([batch])
        mask = _client_mask(table)
        if mask is None:
            round_tables.append(table)
            continue
        mask = pc.fill_null(mask, False)
        round_tables.append(table.filter(pc.invert(mask)))
        clients.add(table.filter(mask))
    client_rounds, summary = clients.result()
    if round_tables:
        frame = pa.concat_tables(round_tables, promote_options="permissive").to_pandas()
        frame = frame.drop(columns=[c for c in ("scope", "client_id") if c in frame.columns])
        frame = (
            frame.sort_values("round", kind="stable").reset_index(drop=True)
            if "round" in frame.columns
            else pd.DataFrame(columns=["round"])
        )
    else:
        frame = pd.DataFrame(columns=["round"])
    return RunMetrics(frame, client_rounds, summary, clients.participation)


def read_run_metrics(path: Path) -> RunMetrics:
    """:class:`RunMetrics` of the run whose metrics are at ``path`` (its ``metrics.parquet``, or its
    ``metrics_parts/`` while it runs). A ``metrics.parquet`` is streamed in batches (its page
    checksums verified); one not in round order is read whole and sorted."""
    try:
        return _read_run_metrics(path)
    finally:
        pa.default_memory_pool().release_unused()  # the decoded row groups' memory: the allocator would keep it


def _read_run_metrics(path: Path) -> RunMetrics:
    run_dir = path.parent
    if path.name == METRICS_FILE and not (run_dir / PARTS_DIR).is_dir():
        try:
            return summarise_batches(pq.ParquetFile(path, page_checksum_verification=True).iter_batches(BATCH_ROWS))
        except _OutOfOrder:
            pass
    table = read_metrics_table(run_dir)  # sorted by round
    return RunMetrics(pd.DataFrame(columns=["round"])) if table is None else summarise_batches(table.to_batches(BATCH_ROWS))


def read_clients_at_round(run_dir: Path, round: int) -> pd.DataFrame:
    """The client rows of one round of a run: from the widest metrics part that covers it while the
    run goes on, else from ``metrics.parquet`` (a filter on ``round``: row groups of other rounds are
    skipped by their statistics)."""
    covering = [(last - first, path) for first, last, path in list_parts(run_dir) if first <= round <= last]
    source = max(covering)[1] if covering else run_dir / METRICS_FILE
    if not source.is_file():
        return pd.DataFrame(columns=["round"])
    table = pq.read_table(source, filters=pc.field("round") == round)
    mask = _client_mask(table)
    return (table if mask is None else table.filter(pc.fill_null(mask, False))).to_pandas()
