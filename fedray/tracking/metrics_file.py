"""A run's metrics: one row per round (``scope == "round"``) plus one row per client per round
(``scope == "client"``, with ``client_id``).

Layout, append-only so that writing costs O(rows) in total however long the run:

- while the run goes on, rows are written to ``metrics_parts/rounds_<first>-<last>.parquet``, each
  part written once, atomically, and never changed: at every checkpoint round (the part then covers
  the rounds since the previous checkpoint and replaces the parts written in between) and otherwise
  at most once per ``min_interval`` seconds (sooner past ``MAX_UNWRITTEN_ROWS`` rows), so a live
  reader sees recent rounds; every ``MERGED_PARTS`` such parts are merged into one, and so are
  every ``MERGED_PARTS`` parts of checkpoint intervals, so that neither a long checkpoint interval
  nor many short ones leave many files;
- when the run ends, the parts are compacted into ``metrics.parquet`` (one write of every row) and
  removed.

Merging reads the parts back one at a time, so the driver holds only the rows not yet in a part:
its memory stays flat however many rounds and clients, and every row is written at most five times.

:func:`read_metrics` reads either layout (and both, while a compaction is half done), so the
dashboard, Ray Tune and notebooks use it rather than ``metrics.parquet`` directly; after a run ends,
``pd.read_parquet(run_dir / "metrics.parquet")`` also works. On resume the rows up to the checkpoint
are read back from the parts (a damaged or deleted ``metrics.parquet`` of an interrupted run plays no
part) and must cover every round up to it; parts are written with Parquet page checksums, so a
damaged part is reported, naming the file, rather than read as different numbers.
"""

from __future__ import annotations

import logging
import re
import shutil
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from fedray.layout import CHECKPOINTS_DIR, list_checkpoints
from fedray.tracking.atomic import write_bytes_atomically
from fedray.tracking.callbacks import Callback, RunContext

logger = logging.getLogger(__name__)
METRICS_FILE = "metrics.parquet"
PARTS_DIR = "metrics_parts"
MERGED_PARTS = 64  # parts merged into one (see the module docstring)
MAX_UNWRITTEN_ROWS = 20_000  # rows held before a part is written, even within min_interval
_PART = re.compile(r"^rounds_(\d+)-(\d+)\.parquet$")
_ARROW_OPEN_PREFIX = re.compile(r"^Could not open Parquet input source '.*?': ")  # it repeats the path the message names
Part = tuple[int, int, Path]  # first round, last round, path


class MetricsError(RuntimeError):
    """A run's metric files are damaged or incomplete, so a resume cannot rebuild its rows."""

    fedray_exit_code = 2  # the CLI prints the message alone: the run directory given is unusable

    def __init__(self, message: str, path: Path | None = None, reason: str | None = None) -> None:
        super().__init__(message)
        self.path, self.reason = path, reason  # the damaged file, if one is, and what is wrong with it


def write_parquet_atomically(table: pa.Table, path: Path) -> None:
    """Write ``table`` to ``path`` atomically (see :mod:`fedray.tracking.atomic`): a reader sees the
    old file or the new one, never half of one. Pages carry checksums, verified by :func:`read_metrics`."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, write_page_checksum=True)
    write_bytes_atomically(path, memoryview(sink.getvalue()))


def rows_table(rows: list[dict[str, Any]]) -> pa.Table:
    """``rows`` (dicts whose keys may differ) as one table; missing values are null."""
    columns = list(dict.fromkeys(key for row in rows for key in row))
    return pa.Table.from_pydict({c: [row.get(c) for row in rows] for c in columns})


def write_table_atomically(rows: list[dict[str, Any]], path: Path) -> None:
    """Write ``rows`` (dicts whose keys may differ) as one Parquet table; missing values are null."""
    write_parquet_atomically(rows_table(rows), path)


def concatenate_atomically(parts: list[Path], path: Path, tail: pa.Table | None = None) -> None:
    """Write the rows of the Parquet files ``parts``, then those of ``tail``, in that order, as one
    Parquet file at ``path`` (atomically), with the columns of all of them (missing values are null,
    types promoted as :func:`pyarrow.concat_tables` does). Only one part is in memory at a time."""
    schemas = [pq.read_schema(part) for part in parts] + ([] if tail is None else [tail.schema])
    schema = pa.unify_schemas(schemas, promote_options="permissive")
    sink = pa.BufferOutputStream()
    with pq.ParquetWriter(sink, schema, write_page_checksum=True) as writer:
        for part in parts:
            writer.write_table(_conform(_read_table(part), schema))
        if tail is not None:
            writer.write_table(_conform(tail, schema))
    write_bytes_atomically(path, memoryview(sink.getvalue()))


def _conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with ``schema``'s columns, in its order (null where ``table`` lacks one)."""
    columns = [
        table[field.name].cast(field.type) if field.name in table.column_names else pa.nulls(len(table), field.type) for field in schema
    ]
    return pa.Table.from_arrays(columns, schema=schema)


def list_parts(run_dir: str | Path) -> list[Part]:
    """(first round, last round, path) of each metrics part of a run, in round order."""
    directory = Path(run_dir) / PARTS_DIR
    parts = []
    for path in directory.iterdir() if directory.is_dir() else []:
        match = _PART.match(path.name)
        if match:
            parts.append((int(match.group(1)), int(match.group(2)), path))
    return sorted(parts)


def _read_table(path: Path) -> pa.Table:
    try:
        return pq.read_table(path, page_checksum_verification=True)
    except FileNotFoundError:
        raise  # replaced by a wider part while being read: the caller lists the parts again
    except (OSError, pa.ArrowException) as error:
        text = _ARROW_OPEN_PREFIX.sub("", str(error).strip().splitlines()[0] if str(error).strip() else "")
        reason = (text if len(text) <= 200 else text[:199] + "…") or type(error).__name__
        raise MetricsError(f"{path} is damaged ({reason})", path, reason) from None


def read_metrics_table(run_dir: str | Path) -> pa.Table | None:
    """Every metrics row of a run as one table (columns unified; missing values are null), sorted by
    round; None if the run has written no metrics yet. Raises :class:`MetricsError` for a damaged file.
    Safe while the run writes: a part replaced during the read makes it start again."""
    for _ in range(10):
        try:
            return _read_metrics_once(Path(run_dir))
        except FileNotFoundError:
            continue
    return _read_metrics_once(Path(run_dir))


def _current_parts(run_dir: Path) -> list[Part]:
    """The parts that hold the run's rows, in round order: of overlapping parts (a wider part written,
    the parts it replaces not yet removed) the widest."""
    parts, covered_to = [], 0
    for first, last, path in sorted(list_parts(run_dir), key=lambda part: (part[0], -part[1])):
        if last > covered_to:  # else a wider part holds its rounds (it is being replaced)
            parts.append((first, last, path))
            covered_to = last
    return parts


def _read_metrics_once(run_dir: Path) -> pa.Table | None:
    parts = _current_parts(run_dir)
    tables = [_read_table(path) for _, _, path in parts]
    if (run_dir / METRICS_FILE).is_file():
        try:
            compacted = _read_table(run_dir / METRICS_FILE)
        except MetricsError:
            if not parts:
                raise
            # A run with parts is unfinished: its metrics.parquet is left over (or was damaged) and the
            # parts are the record; any round missing from them is caught by check_metrics_cover.
            logger.warning("ignoring the unreadable %s: the run's rows are in %s/", run_dir / METRICS_FILE, PARTS_DIR)
            compacted = None
        if compacted is not None:
            if parts:  # a compaction that stopped before removing the parts: the parts hold those rounds
                in_parts = pa.array(sorted({r for first, last, _ in parts for r in range(first, last + 1)}), pa.int64())
                compacted = compacted.filter(pc.invert(pc.is_in(compacted["round"], in_parts)))
            tables.insert(0, compacted)
    if not tables:
        return None
    table = pa.concat_tables(tables, promote_options="permissive")
    return table.take(pc.sort_indices(table, [("round", "ascending")]))


def read_metrics(run_dir: str | Path, scope: str = "round") -> list[dict[str, Any]]:
    """Rows of a run's metrics with the given scope (``"round"`` or ``"client"``), by round; none while
    the run has finished no round. A ``run_dir`` that does not exist raises :class:`FileNotFoundError`:
    a mistyped path must not read as a run without rounds."""
    if not Path(run_dir).is_dir():
        reason = "it is a file" if Path(run_dir).exists() else "it does not exist"
        raise FileNotFoundError(f"{run_dir} is not a run directory: {reason}")
    table = read_metrics_table(run_dir)
    return [] if table is None else [row for row in table.to_pylist() if row["scope"] == scope]


def check_metrics_cover(run_dir: str | Path, round: int) -> None:
    """Raise :class:`MetricsError` unless the run's metric files hold a round row for every round
    ``1..round`` (what a resume from ``round``'s checkpoint needs); checked before Ray starts."""
    if round == 0:
        return
    try:
        table = read_metrics_table(run_dir)
    except MetricsError as error:
        if error.path is None:
            raise
        match = _PART.match(error.path.name)
        first_lost, last_lost = (int(match.group(1)), int(match.group(2))) if match else (1, None)  # metrics.parquet: every round
        damaged = f"{PARTS_DIR}/{error.path.name}" if match else error.path.name  # in the run directory
        lost = "every round" if last_lost is None else _rounds(first_lost, last_lost)
        raise MetricsError(
            f"cannot resume {run_dir}: {damaged} is damaged ({error.reason}), so the metrics of {lost} cannot be rebuilt; "
            + _fallback(run_dir, first_lost, [damaged] if match else []),
            error.path,
            error.reason,
        ) from None
    have = set() if table is None else {r["round"] for r in table.select(["round", "scope"]).to_pylist() if r["scope"] == "round"}
    missing = [r for r in range(1, round + 1) if r not in have]
    if missing:
        shown = ", ".join(map(str, missing[:10])) + (", ..." if len(missing) > 10 else "")
        raise MetricsError(
            f"cannot resume {run_dir}: the metrics of round(s) {shown} (up to the checkpoint of round {round}) "
            f"are missing from {PARTS_DIR}/ and {METRICS_FILE} (deleted?), so they cannot be rebuilt; " + _fallback(run_dir, missing[0], [])
        )


def _rounds(first: int, last: int) -> str:
    return f"round {first}" if first == last else f"rounds {first}-{last}"


def _fallback(run_dir: str | Path, first_lost: int, damaged: list[str]) -> str:
    """The remedy for metrics lost from round ``first_lost`` on: delete the ``damaged`` files (paths in
    the run directory) and the checkpoints after the newest one before ``first_lost``, and resume from
    that one (the rows up to it are intact; the later ones are recomputed)."""
    intact = f"the metrics of {_rounds(1, first_lost - 1)} are intact" if first_lost > 1 else "no round's metrics are intact"
    checkpoints = list_checkpoints(run_dir)
    usable = [r for r, _ in checkpoints if r < first_lost]
    if not usable:
        return f"{intact} and no checkpoint before round {first_lost} is left: start the run again under a new output.name"
    delete = damaged + [f"{CHECKPOINTS_DIR}/{path.name}" for r, path in checkpoints if r > usable[-1]]
    return f"{intact}: delete {', '.join(delete)}, then resume again to continue from the checkpoint of round {usable[-1]}"


class MetricsParquet(Callback):
    """Writes the run's metric rows as described in the module docstring. Holds in memory only the
    rows not yet written to a part."""

    def __init__(self, min_interval: float = 1.0) -> None:
        self.min_interval = min_interval
        self.unwritten: list[dict[str, Any]] = []  # rows not yet in a part
        self.segment_parts: list[Part] = []  # parts since the last checkpoint round (replaced at the next)
        self.unmerged = 0  # the last parts of segment_parts that are not merged ones
        self.closed_parts: list[Part] = []  # parts of the checkpoint intervals since the last merge of them
        self._last_write = 0.0

    def on_run_start(self, run: RunContext) -> None:
        """Start afresh, or on resume keep the rows the checkpoint covers (rounds <= ``run.start_round``)
        as one part, drop later ones (they are recomputed) and put the kept round rows into ``run.history``."""
        table = read_metrics_table(run.run_dir) if run.start_round > 0 else None
        kept = None if table is None else table.filter(pc.less_equal(table["round"], run.start_round))
        old_parts = list_parts(run.run_dir)
        if kept is not None and len(kept) > 0:
            whole = self._part_path(run, int(pc.min(kept["round"]).as_py()), int(pc.max(kept["round"]).as_py()))
            write_parquet_atomically(kept, whole)  # covers every older part that ends by start_round
            old_parts = [part for part in old_parts if part[2] != whole]
        for _, _, path in old_parts:
            path.unlink()
        (run.run_dir / METRICS_FILE).unlink(missing_ok=True)
        if kept is not None:
            run.history.extend(kept.filter(pc.equal(kept["scope"], "round")).to_pylist())

    def on_round_end(self, run: RunContext, row: dict[str, Any], client_rows: list[dict[str, Any]]) -> None:
        self.unwritten.append({"scope": "round", "client_id": None, **row})
        self.unwritten.extend({"scope": "client", "round": row["round"], **client} for client in client_rows)
        round = row["round"]
        if round % run.config.checkpoint.every == 0 or round == run.config.train.rounds:
            self._close_segment(run)
        elif time.monotonic() - self._last_write >= self.min_interval or len(self.unwritten) >= MAX_UNWRITTEN_ROWS:
            self.segment_parts.append(self._write_part(run, [], rows_table(self.unwritten)))
            self.unwritten = []
            self.unmerged += 1
            if self.unmerged == MERGED_PARTS:
                self.segment_parts[-MERGED_PARTS:] = [self._write_part(run, self.segment_parts[-MERGED_PARTS:])]
                self.unmerged = 0

    def on_run_end(self, run: RunContext) -> None:
        """Compact every part into ``metrics.parquet`` and remove the parts. Round rows whose part has
        gone (deleted during the run) are written again from ``run.history``, with a warning: their
        client rows are lost."""
        if self.unwritten or self.segment_parts:
            self._close_segment(run)
        self._restore_missing_rounds(run)
        parts = [path for _, _, path in _current_parts(run.run_dir)]
        if parts:
            concatenate_atomically(parts, run.run_dir / METRICS_FILE)
        shutil.rmtree(run.run_dir / PARTS_DIR, ignore_errors=True)

    def _restore_missing_rounds(self, run: RunContext) -> None:
        """Write a part of the round rows of each stretch of rounds in ``run.history`` that no part
        covers (the driver holds every round row, but only the client rows not yet written)."""
        covered = {r for first, last, _ in _current_parts(run.run_dir) for r in range(first, last + 1)}
        missing = [row for row in run.history if row["round"] not in covered]
        if not missing:
            return
        stretches: list[list[dict[str, Any]]] = []
        for row in missing:
            if stretches and row["round"] == stretches[-1][-1]["round"] + 1:
                stretches[-1].append(row)
            else:
                stretches.append([row])
        for stretch in stretches:
            self._write_part(run, [], rows_table([{"scope": "round", "client_id": None, **row} for row in stretch]))
        shown = ", ".join(f"{s[0]['round']}-{s[-1]['round']}" if len(s) > 1 else str(s[0]["round"]) for s in stretches)
        logger.warning(
            "the metrics of round(s) %s were removed from %s during the run: their round rows are written again "
            "from memory into %s, their client rows are lost",
            shown,
            run.run_dir / PARTS_DIR,
            METRICS_FILE,
        )

    def _close_segment(self, run: RunContext) -> None:
        """One part for the rows since the last checkpoint round, replacing the parts written since."""
        self.closed_parts.append(self._write_part(run, self.segment_parts, rows_table(self.unwritten) if self.unwritten else None))
        self.unwritten, self.segment_parts, self.unmerged = [], [], 0
        if len(self.closed_parts) == MERGED_PARTS:
            self._write_part(run, self.closed_parts)
            self.closed_parts = []

    def _write_part(self, run: RunContext, parts: list[Part], tail: pa.Table | None = None) -> Part:
        """A new part with the rows of ``parts`` (consecutive, in round order), then those of ``tail``;
        ``parts`` are removed once it is written."""
        first = parts[0][0] if parts else pc.min(tail["round"]).as_py()
        last = parts[-1][1] if tail is None else pc.max(tail["round"]).as_py()
        path = self._part_path(run, first, last)
        concatenate_atomically([path for _, _, path in parts], path, tail)
        self._last_write = time.monotonic()
        for _, _, old in parts:
            if old != path:
                old.unlink(missing_ok=True)
        return first, last, path

    def _part_path(self, run: RunContext, first: int, last: int) -> Path:
        directory = run.run_dir / PARTS_DIR
        directory.mkdir(exist_ok=True)
        return directory / f"rounds_{first:06d}-{last:06d}.parquet"
