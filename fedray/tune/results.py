"""The sweep directory's result files, written by a Tune callback in the sweep's driver process.

The files follow the sweep-directory contract (docs/tune.md), so the dashboard and notebooks read a
sweep with pandas/pyarrow and no Ray:

- ``trials.parquet``: one row per trial (``trial_id``, ``status``, one column per swept key named by
  the key, ``round``, ``latest_metric``, ``best_metric``, ``best_round``, ``wall_time_s``, ``run_dir``,
  ``error``), rewritten whenever a trial appears, reports, changes status or ends. A trial that failed
  deterministically (on its config, by diverging, in the user's code: :data:`CONFIG_ERROR` in its
  result, see :func:`fedray.tune.trainable.run_trial`) ends at once, is never retried, and has
  ``status == "ERROR"`` with the error's message;
- ``rounds.parquet``: one row per trial per reported round (``trial_id``, ``round`` and every numeric
  metric of the engine's round row), rewritten whenever a trial reports;
- ``meta.json``: the sweep's description and status (:func:`write_meta`, :func:`set_meta_status`).

Every write goes to a temporary file that replaces the old one (``os.replace``), so a reader never
sees a half-written file. When a sweep resumes, the callback first reloads both tables, so finished
trials keep their rows.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from ray import tune
from ray.tune.experiment import Trial
from ray.tune.result import AUTO_RESULT_KEYS

from fedray.layout import ERROR, META_FILE, PENDING, ROUNDS_FILE, RUNNING, STOPPED_EARLY, SWEEP_FILE, TERMINATED, TRIALS_DIR, TRIALS_FILE
from fedray.tracking.metrics_file import write_parquet_atomically
from fedray.tune.spec import Domain, SweepSpec, load_sweep

#: The result key of a trial that failed deterministically, e.g. on its config (its value: the error message).
CONFIG_ERROR = "fedray_config_error"
_TRIAL_COLUMNS = {
    "round": pa.int64(),
    "latest_metric": pa.float64(),
    "best_metric": pa.float64(),
    "best_round": pa.int64(),
    "wall_time_s": pa.float64(),
    "run_dir": pa.string(),
    "error": pa.string(),
}


def trial_run_dir(trial_id: str) -> str:
    """A trial's fedray run directory, relative to the sweep directory."""
    return f"{TRIALS_DIR}/{trial_id}"


def write_json_atomically(data: dict[str, Any], path: Path) -> None:
    temporary = path.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(data, indent=2))
    os.replace(temporary, path)


def write_meta(sweep_dir: Path, spec: SweepSpec, started_at: str, dashboard_url: str | None, status: str) -> None:
    write_json_atomically(
        {
            "sweep_id": sweep_dir.name,
            "metric": spec.metric,
            "mode": spec.mode,
            "swept_keys": spec.swept_keys,
            "num_trials": spec.num_trials,
            "started_at": started_at,
            "ray_dashboard_url": dashboard_url,
            "status": status,
        },
        sweep_dir / META_FILE,
    )


def read_meta(sweep_dir: Path) -> dict[str, Any]:
    return json.loads((sweep_dir / META_FILE).read_text())


def update_meta(sweep_dir: Path, **fields: Any) -> None:
    write_json_atomically({**read_meta(sweep_dir), **fields}, sweep_dir / META_FILE)


def read_table(path: Path) -> pd.DataFrame:
    """A sweep Parquet file as pandas, integer columns kept as (nullable) integers: a column with a
    missing value must not turn ``best_round`` 7 into ``7.0``."""
    return pq.read_table(path).to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get)


def set_meta_status(sweep_dir: Path, status: str, dashboard_url: str | None = None) -> None:
    update_meta(sweep_dir, status=status, **({} if dashboard_url is None else {"ray_dashboard_url": dashboard_url}))


def swept_column_type(domain: Domain) -> pa.DataType:
    """The Parquet type of a swept key's column (one type per key, whatever the trial)."""
    if domain.kind == "randint":
        return pa.int64()
    if domain.kind in ("uniform", "loguniform"):
        return pa.float64()
    if all(isinstance(v, bool) for v in domain.values):
        return pa.bool_()
    if all(isinstance(v, int) and not isinstance(v, bool) for v in domain.values):
        return pa.int64()
    if all(isinstance(v, (int, float)) for v in domain.values):
        return pa.float64()
    return pa.string()


def engine_metrics(result: dict[str, Any]) -> dict[str, float | int]:
    """The engine's numeric round metrics in a Tune result (Tune's own bookkeeping keys dropped)."""
    return {
        key: value
        for key, value in result.items()
        if key not in AUTO_RESULT_KEYS and isinstance(value, (int, float)) and not isinstance(value, bool)
    }


@dataclass
class TrialProgress:
    """What a trial has reported so far."""

    round: int = 0
    latest_metric: float | None = None
    best_metric: float | None = None
    best_round: int | None = None
    wall_time_s: float = 0.0

    def add(self, round: int, value: float | None, mode: str, wall_time_s: float | None) -> None:
        self.round = round
        self.latest_metric = value
        if (
            value is not None
            and not math.isnan(value)
            and (self.best_metric is None or (value > self.best_metric if mode == "max" else value < self.best_metric))
        ):
            self.best_metric, self.best_round = value, round
        if wall_time_s is not None:
            self.wall_time_s = float(wall_time_s)


class SweepResults(tune.Callback):
    """Keeps ``trials.parquet`` and ``rounds.parquet`` of one sweep directory up to date."""

    def __init__(self, sweep_dir: str | Path, spec: SweepSpec) -> None:
        self.sweep_dir = Path(sweep_dir)
        self.spec = spec
        self.progress: dict[str, TrialProgress] = {}
        self.rounds: dict[tuple[str, int], dict[str, Any]] = {}
        self.errors: dict[str, str] = {}
        self.config_errors: dict[str, str] = {}  # trials that failed on their config (Tune: TERMINATED)
        # Trials Tune completed (ran to the end or were stopped by the scheduler). Tune also marks
        # trials TERMINATED when the sweep is interrupted; those are not complete and resume later.
        self.completed: set[str] = set()
        self._seen: set[str] = set()
        self._total_rounds: dict[str, int] = {}
        self._last_written: list[tuple] | None = None
        self._statuses: dict[str, str] = {}  # each trial's status as last written (or read back on resume)

    # Tuner.restore unpickles the callbacks from tuner.pkl, which the sweep's first session wrote, maybe
    # with an older fedray. The pickle therefore holds only the sweep directory, and unpickling builds
    # the callback afresh with this fedray's code: its spec from sweep.yaml, its tables in setup().
    def __getstate__(self) -> dict[str, Any]:
        return {"sweep_dir": self.sweep_dir}

    def __setstate__(self, state: dict[str, Any]) -> None:
        sweep_dir = Path(state["sweep_dir"])
        self.__init__(sweep_dir, load_sweep(sweep_dir / SWEEP_FILE))

    # ------------------------------------------------------------------ Tune hooks
    def setup(self, **info: Any) -> None:
        """Reload what an earlier session of this sweep wrote (``fedray tune --resume``)."""
        self._last_written = None
        trials_path, rounds_path = self.sweep_dir / TRIALS_FILE, self.sweep_dir / ROUNDS_FILE
        if rounds_path.is_file():
            for row in pq.read_table(rounds_path).to_pylist():
                clean = {k: v for k, v in row.items() if v is not None}
                self.rounds[(row["trial_id"], int(row["round"]))] = clean
        if trials_path.is_file():
            for row in pq.read_table(trials_path).to_pylist():
                self.progress[row["trial_id"]] = TrialProgress(
                    round=row["round"] or 0,
                    latest_metric=row["latest_metric"],
                    best_metric=row["best_metric"],
                    best_round=row["best_round"],
                    wall_time_s=row["wall_time_s"] or 0.0,
                )
                self._statuses[row["trial_id"]] = row["status"]
                if row["error"] is not None:
                    self.errors[row["trial_id"]] = row["error"]

    def get_state(self) -> dict[str, Any]:
        """Saved with Tune's experiment state: which trials failed on their config."""
        return {"config_errors": dict(self.config_errors)}

    def set_state(self, state: dict[str, Any]) -> None:
        self.config_errors.update(state.get("config_errors", {}))

    def on_trial_result(self, iteration: int, trials: list[Trial], trial: Trial, result: dict[str, Any], **info: Any) -> None:
        if CONFIG_ERROR in result:
            self.config_errors[trial.trial_id] = str(result[CONFIG_ERROR])
            self._write_trials(trials)
            return
        metrics = engine_metrics(result)
        if "round" not in metrics:
            return
        round = int(metrics["round"])
        self.rounds[(trial.trial_id, round)] = {"trial_id": trial.trial_id, **metrics, "round": round}
        value = metrics.get(self.spec.metric)
        self.progress.setdefault(trial.trial_id, TrialProgress()).add(
            round, None if value is None else float(value), self.spec.mode, result.get("time_total_s")
        )
        self._write_rounds()
        self._write_trials(trials)

    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self.errors[trial.trial_id] = _error_line(trial)
        self._write_trials(trials)

    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self.completed.add(trial.trial_id)
        self._write_trials(trials)

    def on_step_end(self, iteration: int, trials: list[Trial], **info: Any) -> None:
        self._write_trials(trials)  # new PENDING trials and status changes; a no-op when nothing changed

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        self._write_trials(trials)

    # ------------------------------------------------------------------ files
    def trial_status(self, trial: Trial) -> str:
        if trial.trial_id not in self._seen:
            self._seen.add(trial.trial_id)
            if trial.status == Trial.TERMINATED:  # finished in an earlier session of a resumed sweep
                self.completed.add(trial.trial_id)
        if trial.status == Trial.ERROR or trial.trial_id in self.config_errors:
            return ERROR
        if trial.trial_id in self.completed:
            reported = self.progress.get(trial.trial_id, TrialProgress()).round
            return STOPPED_EARLY if reported < self._rounds_of(trial) else TERMINATED
        if trial.status == Trial.RUNNING:
            return RUNNING
        return PENDING  # PENDING, PAUSED (unused by FIFO and ASHA), or stopped by an interruption

    def _rounds_of(self, trial: Trial) -> int:
        if trial.trial_id not in self._total_rounds:
            values = {key: trial.config[key] for key in self.spec.swept_keys if key in trial.config}
            self._total_rounds[trial.trial_id] = self.spec.trial_config(values).train.rounds
        return self._total_rounds[trial.trial_id]

    def _write_trials(self, trials: list[Trial]) -> None:
        rows = []
        for trial in trials:
            progress = self.progress.get(trial.trial_id, TrialProgress())
            status = self._statuses[trial.trial_id] = self.trial_status(trial)
            rows.append(
                (trial.trial_id, status)
                + tuple(trial.config.get(key) for key in self.spec.swept_keys)
                + (
                    progress.round,
                    progress.latest_metric,
                    progress.best_metric,
                    progress.best_round,
                    progress.wall_time_s,
                    trial_run_dir(trial.trial_id),
                    self.config_errors.get(trial.trial_id, self.errors.get(trial.trial_id)) if status == ERROR else None,
                )
            )
        if rows == self._last_written:
            return
        names = ["trial_id", "status", *self.spec.swept_keys, *_TRIAL_COLUMNS]
        types = [pa.string(), pa.string(), *(swept_column_type(d) for d in self.spec.space.values()), *_TRIAL_COLUMNS.values()]
        columns = list(zip(*rows)) if rows else [[] for _ in names]
        table = pa.table([pa.array(list(c), type=t) for c, t in zip(columns, types)], names=names)
        write_parquet_atomically(table, self.sweep_dir / TRIALS_FILE)
        self._last_written = rows

    def _write_rounds(self) -> None:
        rows = sorted(self.rounds.values(), key=lambda row: (row["trial_id"], row["round"]))
        names = ["trial_id", "round", *dict.fromkeys(k for row in rows for k in row if k not in ("trial_id", "round"))]
        columns = {name: [row.get(name) for row in rows] for name in names}
        table = pa.table({name: pa.array(values, type=_metric_type(name, values)) for name, values in columns.items()})
        write_parquet_atomically(table, self.sweep_dir / ROUNDS_FILE)

    def counts(self) -> dict[str, int]:
        """Trials per status in the last written ``trials.parquet``."""
        counts: dict[str, int] = {}
        for row in self._last_written or []:
            counts[row[1]] = counts.get(row[1], 0) + 1
        return counts

    def best(self) -> tuple[str, float] | None:
        """The best trial so far that is not ERROR now (a resumed sweep retries its errored trials), and
        its best value of the sweep's metric."""
        reported = [
            (trial_id, p.best_metric)
            for trial_id, p in self.progress.items()
            if p.best_metric is not None and self._statuses.get(trial_id) != ERROR
        ]
        if not reported:
            return None
        pick = max if self.spec.mode == "max" else min
        return pick(reported, key=lambda item: item[1])


def _metric_type(name: str, values: list[Any]) -> pa.DataType:
    """int64 for ``trial_id``-free integer metrics (``round``, ``clients``, ...), float64 otherwise, so a
    count stays an integer whichever trials (and missing values) the file holds."""
    if name == "trial_id":
        return pa.string()
    present = [v for v in values if v is not None]
    return pa.int64() if all(isinstance(v, int) and not isinstance(v, bool) for v in present) else pa.float64()


def _error_line(trial: Trial) -> str:
    """The last line of the trial's error trace (the exception and its message): from the ``error.txt``
    that Tune has just written in the trial's local directory (a killed trial's included), else from
    Tune's storage, where it arrives later."""
    text = None
    try:
        local = getattr(trial, "error_file", None)
        text = Path(local).read_text() if local and Path(local).is_file() else trial.get_error()
    except Exception:  # a missing or unreadable file must not stop the sweep
        pass
    lines = [line for line in str(text or "").splitlines() if line.strip()]
    return lines[-1].strip()[:500] if lines else "the trial failed (see the trial's error.txt under tune/)"
