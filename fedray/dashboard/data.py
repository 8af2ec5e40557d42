"""Reading what a sweep or run writes, for the dashboard: only files, no Ray, no fedray runtime.

Four kinds of folder are understood (:func:`detect_kind`):

- a **sweep directory** written by ``fedray tune`` (the sweep directory contract): ``meta.json``,
  ``trials.parquet`` (one row per trial), ``rounds.parquet`` (one row per trial per round) and
  ``trials/<trial_id>/`` (each trial's own run directory);
- a **run directory** written by ``fedray run``: ``config.yaml``, ``metrics.parquet`` (rows with
  ``scope`` = ``"round"`` or ``"client"``), ``summary.json``, ``partition.png``, ...;
- a **folder of run directories** (e.g. ``runs/``): shown like a sweep whose swept keys are the config
  keys that differ between the runs;
- a **folder of sweep directories** (e.g. ``sweeps/``): each sweep read by its own :class:`DashboardData`, and
  the sweeps the page ticks compared side by side (:meth:`DashboardData.compare_sweeps`).

A single run and a folder of runs are turned into the same shape as a sweep (:class:`Overview`: a trials
table plus per-trial round rows), so the page has one code path. The files may be growing or
half-written while they are read (a live sweep, a copy in progress): nothing here raises on their
content; problems become :class:`Message` s shown on the page, and the last good read of a file that
has become unreadable is kept.

Comparison views: each trial gets a ``label`` (its swept values, :func:`trial_label`) and a ``metric_name``
(the quantity its metric measures, :func:`metric_name`); trials are ranked only within one quantity
(:func:`best_by_metric`) and grouped into mean ± std rows and bands (:func:`group_trials`, :func:`band`).
Trials that ended without finishing are ``ERROR`` (recorded by the sweep), ``INTERRUPTED`` (the sweep ended
or stalled first) or ``STALLED`` (a run without ``summary.json`` whose files stopped changing, :func:`stale_after`).
Nothing outside the folder is read and no absolute path is put in what the page gets (:func:`inside`,
:func:`shown_path`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import threading
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import yaml

from fedray.config.schema import TASK_REPORTS, OutputConfig
from fedray.layout import (
    ERROR,
    LEARNING_CURVE_PLOT,
    LOG_FILE,
    META_FILE,
    PARTITION_PLOT,
    PENDING,
    ROUNDS_FILE,
    RUNNING,
    RUN_INFO_FILE,
    SAVED_CONFIG_FILE,
    STOPPED_FILE,
    SUMMARY_FILE,
    SWEEP_FILE,
    TERMINATED,
    TRIALS_DIR,
    TRIALS_FILE,
)
from fedray.dashboard.run_metrics import RunMetrics, read_clients_at_round, read_run_metrics
from fedray.tracking.metrics_file import METRICS_FILE, PARTS_DIR

# Files of a run directory the page may fetch (nothing else under the folder is ever served).
RUN_FILES = (SAVED_CONFIG_FILE, PARTITION_PLOT, LEARNING_CURVE_PLOT, SUMMARY_FILE, LOG_FILE)
#: The end of a trial's ``log.txt`` that /api/log sends (the whole file is served by /api/file).
LOG_TAIL_BYTES = 64 * 1024
#: The simulated clock of runs with ``systems.enabled`` (docs/guide/systems.md): the curves' other x-axis.
SIM_TIME = "sim_time"
#: In a folder of sweeps, the curves of this many best trials of each sweep are compared.
COMPARED_TRIALS_PER_SWEEP = 10
#: The files whose change means a run made progress or ended (metrics arrive as Parquet parts while it runs;
#: ``stopped.json`` when its user stopped it).
RUN_PROGRESS_FILES = (SAVED_CONFIG_FILE, METRICS_FILE, PARTS_DIR, SUMMARY_FILE, STOPPED_FILE)
#: A sweep trial's record of the placement group it held (fedray.tune.trainable.PlacementRecord).
PLACEMENT_FILE = "placement.json"

DEFAULT_METRIC = "test_accuracy"
MAX_CURVE_POINTS = 500
#: Clients whose values /api/run sends for one round; a larger round is shown by this many of them.
MAX_CLIENT_POINTS = 1000
# Columns of trials.parquet that are not swept keys.
TRIAL_COLUMNS = ("trial_id", "status", "round", "latest_metric", "best_metric", "best_round", "wall_time_s", "run_dir", "error")
# Round-row columns that are bookkeeping, not metrics to plot.
NON_METRIC_COLUMNS = {"trial_id", "round", "scope", "client_id"}
# Config keys that differ between any two runs and say nothing about the method.
IGNORED_CONFIG_KEYS = {"output.dir", "output.name"}
ALGORITHM_KEY = "algorithm.name"
# Symbols of the hyperparameters in trial labels (``fedsc τ=0.1 M=3 α=0.5``); other keys go by their last part.
SYMBOLS = {"algorithm.tau": "τ", "algorithm.num_neighbors": "M", "algorithm.beta": "β", "algorithm.mu": "μ", "data.alpha": "α"}
# Statuses of a trial that ended without finishing: no final value, shown as failed with their error.
FAILED_STATUSES = (ERROR, "INTERRUPTED", "STALLED")
# A run its user stopped (Ctrl-C, SIGTERM: exit 130, ``stopped.json``): unfinished, not failed.
STOPPED = "STOPPED"
UNFINISHED_STATUSES = (*FAILED_STATUSES, STOPPED)
# fANOVA's random forest (Hutter et al. 2014, through optuna.importance.FanovaImportanceEvaluator): fixed seed, so
# the page shows the same importances on every refresh.
IMPORTANCE_TREES = 64
IMPORTANCE_SEED = 0
# A run (or a sweep that says "running") whose files have not changed for longer than
# max(STALE_AFTER_S, STALE_ROUNDS × its slowest round) is taken for dead (crashed, killed, machine lost).
STALE_AFTER_S = 600.0
STALE_ROUNDS = 5
# Searches whose keys take a few listed values: their axes are categories, not ranges.
CATEGORICAL_DOMAINS = ("grid", "choice")

Kind = Literal["sweep", "sweeps", "run", "runs", "empty", "missing"]


class BadRequest(ValueError):
    """A request's parameter names nothing here (an unknown swept key or metric): the server answers
    400 with the message."""


@dataclass
class Message:
    level: Literal["info", "warning", "error"]
    text: str


@dataclass
class Overview:
    """Everything the page's header, trials table, parallel coordinates and best-config panel show."""

    kind: Kind
    title: str  # the folder's name (absolute paths are never sent to the page)
    version: str
    metric: str
    mode: Literal["max", "min"]
    swept_keys: list[str]
    trials: list[dict[str, Any]]
    round_metrics: list[str]  # numeric columns of the round rows, for the curve's metric menu
    best_trial: str | None  # best among the trials whose metric is the sweep's own quantity (``metric``)
    best_config: str | None  # the best trial's config.yaml, ready for ``fedray run``
    categorical_keys: list[str] = field(default_factory=list)  # swept keys drawn on categorical axes
    best_by_metric: dict[str, str] = field(default_factory=dict)  # quantity (``metric_name``) → its best trial
    status: str | None = None  # the sweep's meta.json status
    num_trials: int | None = None  # trials the sweep will run (meta.json), when known
    started_at: str | None = None
    ray_dashboard_url: str | None = None
    sweeps: list[dict[str, Any]] = field(default_factory=list)  # a folder of sweeps: each sweep's summary (DashboardData.sweep_summary)
    # a sweep over algorithm.name: each algorithm's paired differences from the reference algorithm
    # (fedray.tracking.paired.paired_comparison, as in comparison.md); None otherwise
    paired_comparison: dict[str, Any] | None = None
    messages: list[Message] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return json_safe(asdict(self))


# ---------------------------------------------------------------------------------------------------
# Pure helpers (unit-tested on their own)


def json_safe(value: Any) -> Any:
    """``value`` with NaN/inf replaced by None and numpy scalars/arrays made plain, for strict JSON."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "iub" or (value.dtype.kind == "f" and np.isfinite(value).all()):
            return value.tolist()  # the common case (downsampled curves): no per-element walk
        return json_safe(value.tolist())
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is pd.NaT:
        return None
    return value


def downsample(x: np.ndarray, y: np.ndarray, max_points: int = MAX_CURVE_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """At most ``max_points`` points of the curve ``(x, y)`` that still look like it when plotted.

    Points with a non-finite ``y`` (rounds without evaluation) are dropped. Longer curves keep the
    first and last point and, from each of ``(max_points - 2) // 2`` equal buckets in between, the
    points with the lowest and highest ``y`` (min-max decimation), so peaks such as the best round
    survive. ``x`` must be increasing.
    """
    if max_points < 4:
        raise ValueError(f"max_points must be at least 4, got {max_points}")
    x, y = np.asarray(x), np.asarray(y, dtype=np.float64)
    finite = np.isfinite(y)
    x, y = x[finite], y[finite]
    if len(y) <= max_points:
        return x, y
    interior = y[1:-1]
    buckets = (max_points - 2) // 2  # each bucket holds at least two points, since len(y) > max_points
    starts = np.linspace(0, len(interior), buckets + 1).astype(int)[:-1]
    bucket_of = np.repeat(np.arange(buckets), np.diff(np.append(starts, len(interior))))
    keep = [np.array([0, len(y) - 1])]
    for extreme in (np.minimum, np.maximum):
        hits = np.flatnonzero(interior == extreme.reduceat(interior, starts)[bucket_of])
        keep.append(1 + hits[np.unique(bucket_of[hits], return_index=True)[1]])  # the first extreme of each bucket
    keep = np.unique(np.concatenate(keep))
    return x[keep], y[keep]


def curve_of(rows: pd.DataFrame, column: str, max_points: int) -> dict[str, Any] | None:
    """One metric's curve from round rows in round order: ``{"round", "value"}``, downsampled (:func:`downsample`),
    plus ``sim_time`` at the rounds kept when the rows carry the simulated clock (``systems.enabled``), so the page
    can draw the curve against simulated time; None when no round reported the metric."""
    values = pd.to_numeric(rows[column], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    kept, _ = downsample(np.arange(len(values)), values, max_points)
    if not len(kept):
        return None
    curve = {"round": rows["round"].to_numpy()[kept], "value": values[kept]}
    if SIM_TIME in rows.columns:
        clock = pd.to_numeric(rows[SIM_TIME], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)[kept]
        if np.isfinite(clock).all():
            curve[SIM_TIME] = clock
    return curve


def participation_histogram(participation: np.ndarray, num_clients: int | None) -> dict[str, Any]:
    """How many clients took part in how many rounds: ``{"rounds": [k, ...], "clients": [n_k, ...]}`` from each
    client's count of rounds with a row (``participation``), clients with no row at all counted at k = 0 when
    ``num_clients`` (``data.num_clients``) is known; plus ``num_clients`` and ``clients_seen``."""
    counts = np.asarray(participation, dtype=np.int64)
    seen = int(np.count_nonzero(counts))
    histogram = np.bincount(counts[counts > 0]) if seen else np.zeros(1, np.int64)
    if num_clients is not None and num_clients >= len(counts):
        histogram[0] = num_clients - seen
    else:
        histogram[0] = 0
    rounds = np.flatnonzero(histogram)
    return {"rounds": rounds, "clients": histogram[rounds], "num_clients": num_clients, "clients_seen": seen}


def task_headline(config: dict[str, Any]) -> tuple[str, Literal["max", "min"]]:
    """``(test_<headline>, mode)`` of a saved run config's ``data.task`` (classification when it has
    none: configs saved before tasks existed); a user's task, whose report is in its code, as classification."""
    data = config.get("data") if isinstance(config.get("data"), dict) else {}
    report = TASK_REPORTS.get(data.get("task", "classification"))
    return (DEFAULT_METRIC, "max") if report is None else (f"test_{report.headline}", report.mode)


def select_best_trial(trials: list[dict[str, Any]], mode: str) -> str | None:
    """The ``trial_id`` with the best finite ``best_metric`` (largest for ``mode="max"``, smallest for
    ``"min"``) among the trials whose ``status`` is not ERROR (a trial that diverged after leading is
    not the best); the first such trial in table order on ties; None if no trial qualifies. The trials
    must report the same quantity (see :func:`best_by_metric`)."""
    if mode not in ("max", "min"):
        raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
    sign = 1.0 if mode == "max" else -1.0
    best_id, best_score = None, -math.inf
    for trial in trials:
        value = trial.get("best_metric")
        if trial.get("status") != ERROR and isinstance(value, (int, float)) and math.isfinite(value) and sign * value > best_score:
            best_id, best_score = trial["trial_id"], sign * value
    return best_id


def metric_name(metric: str, reported: set[str]) -> str:
    """The quantity a trial's ``metric`` column measures, given the round metrics it ``reported``.

    Self-supervised algorithms (``hetero_ssfl``, ``fedavg_byol``) report a linear probe's accuracy as
    ``test_accuracy`` too, next to ``probe_accuracy``; it is not the supervised model's test accuracy, so
    such trials are ranked and averaged apart from the others."""
    return "probe_accuracy" if metric == "test_accuracy" and "probe_accuracy" in reported else metric


def best_by_metric(trials: list[dict[str, Any]], mode: str) -> dict[str, str]:
    """The best trial of each quantity (the trials' ``metric_name``): trials are ranked only against
    trials whose metric measures the same thing."""
    names = list(dict.fromkeys(t["metric_name"] for t in trials))
    best = {name: select_best_trial([t for t in trials if t["metric_name"] == name], mode) for name in names}
    return {name: trial_id for name, trial_id in best.items() if trial_id is not None}


def format_value(value: Any) -> str:
    """A swept value for reading: numbers to 4 significant digits (``0.30000000000000004`` → ``0.3``)."""
    if isinstance(value, bool) or value is None:
        return str(value).lower() if isinstance(value, bool) else "–"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    return str(value)


def key_symbols(keys: list[str]) -> dict[str, str]:
    """How each key is named in labels: its symbol (τ, M, β, μ, α), else its last part (``train.lr`` → ``lr``),
    else (two keys with the same last part, e.g. ``data.name`` and ``model.name``) the whole key."""
    short = {key: SYMBOLS.get(key, key.rsplit(".", 1)[-1]) for key in keys}
    taken = list(short.values())
    return {key: name if taken.count(name) == 1 else key for key, name in short.items()}


def trial_label(values: dict[str, Any], keys: list[str]) -> str:
    """A trial named by its swept values: ``fedsc τ=0.1 M=3 α=0.5`` (the algorithm's name bare and first,
    keys that do not apply to the trial, i.e. None, left out), marked ``(personalised)`` when its
    results are each client's own model (``evaluation`` from ``run_info.json``), so that it never
    reads as a global model beside one."""
    names = key_symbols(keys)
    parts = [format_value(values[ALGORITHM_KEY])] if values.get(ALGORITHM_KEY) is not None and ALGORITHM_KEY in keys else []
    if values.get("evaluation") == "personalised":
        parts.append("(personalised)")
    parts += [f"{names[key]}={format_value(values.get(key))}" for key in keys if key != ALGORITHM_KEY and values.get(key) is not None]
    return " ".join(parts)


def label_trials(trials: list[dict[str, Any]], keys: list[str]) -> None:
    """Set each trial's ``label`` (:func:`trial_label`); labels that would be equal (or empty) get the
    trial id, so a legend never shows two identical names."""
    labels = [trial_label(t, keys) for t in trials]
    for trial, label in zip(trials, labels):
        unique = label and labels.count(label) == 1
        trial["label"] = label if unique else f"{label} ({trial['trial_id']})" if label else trial["trial_id"]


def stale_after(longest_round_s: float | None) -> float:
    """Seconds without a file change after which an unfinished run counts as dead."""
    return max(STALE_AFTER_S, STALE_ROUNDS * (longest_round_s or 0.0))


def format_duration(seconds: float) -> str:
    minutes = int(seconds // 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"


def mean_std(values: list[float]) -> dict[str, Any]:
    """``{"mean", "std", "n"}`` of the finite ``values``; the std is the population std (ddof=0), as in
    ``comparison.md`` (0 for one value); None for no value."""
    finite = np.array([v for v in values if isinstance(v, (int, float)) and math.isfinite(v)], dtype=np.float64)
    if not len(finite):
        return {"mean": None, "std": None, "n": 0}
    return {"mean": float(finite.mean()), "std": float(finite.std()), "n": int(len(finite))}


def sort_key(value: Any) -> tuple:
    """Orders swept values: numbers by value, then text, None last."""
    if value is None:
        return (2, 0, "")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, float(value), "")
    return (1, 0, str(value))


def group_trials(trials: list[dict[str, Any]], by: list[str], mode: str, metric: str) -> list[dict[str, Any]]:
    """The comparison table: trials grouped by their values of the keys ``by`` (averaging over every other
    swept key, e.g. ``seed``) and by the quantity their metric measures (never averaged together).

    Each group: ``values`` (of ``by``), ``metric_name``, ``label``, ``trial_ids`` (trials that count),
    ``failed`` (trials that ended without finishing: not counted), ``final`` and ``best`` (mean ± std of
    ``latest_metric`` and ``best_metric``) and ``best_group`` (the best mean final value among groups of the
    same quantity). Groups are ordered by their values, the sweep's own ``metric`` before other quantities.
    """
    groups: dict[tuple, dict[str, Any]] = {}
    for trial in trials:
        values = {key: trial.get(key) for key in by}
        key = (tuple(repr(values[k]) for k in by), trial["metric_name"])
        group = groups.setdefault(key, {"values": values, "metric_name": trial["metric_name"], "trial_ids": [], "failed": []})
        group["failed" if trial.get("status") in UNFINISHED_STATUSES else "trial_ids"].append(trial["trial_id"])
    by_id = {t["trial_id"]: t for t in trials}
    ordered = sorted(groups.values(), key=lambda g: ([sort_key(g["values"][k]) for k in by], g["metric_name"] != metric, g["metric_name"]))
    for group in ordered:
        members = [by_id[i] for i in group["trial_ids"]]
        group["final"] = mean_std([t.get("latest_metric") for t in members])
        group["best"] = mean_std([t.get("best_metric") for t in members])
        group["label"] = trial_label(group["values"], by) or "all trials"
        if group["metric_name"] != metric:  # the quantity tells groups of equal values apart
            group["label"] = f"{group['label']} [{group['metric_name']}]"
    sign = 1.0 if mode == "max" else -1.0
    for name in dict.fromkeys(g["metric_name"] for g in ordered):
        scored = [g for g in ordered if g["metric_name"] == name and g["final"]["mean"] is not None]
        best = max(scored, key=lambda g: sign * g["final"]["mean"], default=None)
        for group in ordered:
            if group["metric_name"] == name:
                group["best_group"] = group is best
    return ordered


def final_values(rounds: pd.DataFrame, metric: str) -> dict[str, float]:
    """Each trial's final value of ``metric`` in ``rounds`` (rows of several trials): its value at the last
    round that reported it finite; trials that never did get no entry."""
    if metric not in rounds.columns:
        return {}
    values = pd.to_numeric(rounds[metric], errors="coerce")
    frame = pd.DataFrame({"trial_id": rounds["trial_id"].to_numpy(), "round": rounds["round"].to_numpy(), "value": values.to_numpy()})
    frame = frame[np.isfinite(frame["value"])].sort_values("round", kind="stable")
    return {str(trial_id): float(value) for trial_id, value in frame.groupby("trial_id", sort=False)["value"].last().items()}


def heatmap_grid(trials: list[dict[str, Any]], values: dict[str, float], x: str, y: str) -> dict[str, Any]:
    """The heatmap of ``values`` (trial id → the trial's value) over the keys ``x`` and ``y`` of ``trials``:
    the cell of (x value, y value) is the mean of the values of the trials with those values (so averaged over
    every other key, seeds included) and ``count`` how many they are. Trials without a value are left out; a
    pair that no trial with a value has is a missing cell (mean None, count 0). The axes' values are ordered by
    :func:`sort_key` (numbers by value, then text, None last), and named by :func:`format_value` in
    ``x_labels``/``y_labels``; ``mean`` and ``count`` are lists of rows, one per y value."""
    cells: dict[tuple[str, str], list[float]] = {}
    axis_values: dict[str, dict[str, Any]] = {x: {}, y: {}}
    for trial in trials:
        value = values.get(trial["trial_id"])
        if value is None:
            continue
        for key in (x, y):
            axis_values[key].setdefault(repr(trial.get(key)), trial.get(key))
        cells.setdefault((repr(trial.get(x)), repr(trial.get(y))), []).append(value)
    xs, ys = (sorted(axis_values[key].items(), key=lambda item: sort_key(item[1])) for key in (x, y))
    stats = {cell: mean_std(cell_values) for cell, cell_values in cells.items()}
    empty = {"mean": None, "n": 0}
    return {
        "x": x,
        "y": y,
        "x_values": [v for _, v in xs],
        "y_values": [v for _, v in ys],
        "x_labels": [format_value(v) for _, v in xs],
        "y_labels": [format_value(v) for _, v in ys],
        "mean": [[stats.get((i, j), empty)["mean"] for i, _ in xs] for j, _ in ys],
        "count": [[stats.get((i, j), empty)["n"] for i, _ in xs] for j, _ in ys],
    }


def band(rounds: pd.DataFrame, metric: str, max_points: int) -> dict[str, Any]:
    """Mean ± std over trials, round by round, of ``metric`` in ``rounds`` (rows of several trials):
    ``{"round", "mean", "std", "n"}``, downsampled like a curve (the rounds kept are those
    :func:`downsample` keeps for the mean)."""
    values = pd.to_numeric(rounds[metric], errors="coerce") if metric in rounds.columns else pd.Series(dtype=float)
    frame = pd.DataFrame({"round": rounds["round"].to_numpy(), "value": values.to_numpy()}).dropna()
    if frame.empty:
        return {"round": [], "mean": [], "std": [], "n": []}
    stats = frame.groupby("round")["value"].agg(["mean", lambda v: float(np.std(v)), "count"]).sort_index()
    stats.columns = ["mean", "std", "n"]
    x = stats.index.to_numpy()
    kept, _ = downsample(np.arange(len(x)), stats["mean"].to_numpy(), max_points)
    return {
        "round": x[kept],
        "mean": stats["mean"].to_numpy()[kept],
        "std": stats["std"].to_numpy()[kept],
        "n": stats["n"].to_numpy()[kept],
    }


def summarize_curve(rounds: list[int], values: list[float | None], mode: str) -> dict[str, Any]:
    """``round``, ``latest_metric``, ``best_metric`` and ``best_round`` of one trial's metric curve
    (used where no ``trials.parquet`` gives them: single runs and folders of runs)."""
    points = [(r, float(v)) for r, v in zip(rounds, values) if v is not None and math.isfinite(v)]
    pick = max if mode == "max" else min
    best = pick(points, key=lambda p: p[1]) if points else None  # first of equal values wins
    return {
        "round": int(max(rounds)) if len(rounds) else 0,
        "latest_metric": points[-1][1] if points else None,
        "best_metric": None if best is None else best[1],
        "best_round": None if best is None else best[0],
    }


def run_times(run_dir: Path, status: str) -> tuple[float | None, float | None]:
    """When a run started and ended, in seconds since the epoch, from its files: it starts when it writes its
    ``config.yaml`` (again when it resumes) and ends when it writes ``summary.json``; one that ended without
    it (failed, stopped, interrupted) ended at its newest progress file. ``None`` for what has not happened."""
    started = file_stamp(run_dir / SAVED_CONFIG_FILE)
    if started is None:
        return None, None
    ended = file_stamp(run_dir / SUMMARY_FILE)
    if ended is None and status not in (RUNNING, PENDING):
        ended = max((stamp for stamp in map(file_stamp, (run_dir / name for name in RUN_PROGRESS_FILES)) if stamp), default=None)
    return started[0] / 1e9, None if ended is None else ended[0] / 1e9


def held_resources(placement: dict[str, Any] | None) -> dict[str, float] | None:
    """The resources a sweep trial held: the sum of its placement group's bundles (``placement.json``,
    ``{"CPU": 2.0, "GPU": 0.5}``); None without that record (runs outside ``fedray tune``)."""
    total: dict[str, float] = {}
    for bundle in (placement or {}).get("bundles") or []:
        for name, amount in bundle.items() if isinstance(bundle, dict) else ():
            if isinstance(amount, (int, float)) and not isinstance(amount, bool):
                total[name] = total.get(name, 0.0) + float(amount)
    return total or None


def importance_distribution(values: list[Any], categorical: bool, domain_kind: str | None) -> Any:
    """The Optuna distribution a swept key's ``values`` (one per trial) were drawn from: an int or float range
    (log-scaled for ``loguniform``, or, without the sweep's spec, for positive values spanning two decades, as the
    page's axes are) for sampled numbers, else categories: the values as text, ``n/a`` where the key does not
    apply to a trial."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if not categorical and numbers and len(numbers) == len(values):
        low, high = min(numbers), max(numbers)
        log = domain_kind == "loguniform" or (domain_kind is None and low > 0 and high / low >= 100)
        if all(isinstance(v, int) for v in numbers):
            return IntDistribution(int(low), int(high), log=log)
        return FloatDistribution(float(low), float(high), log=log)
    return CategoricalDistribution(sorted({importance_choice(v) for v in values}))


def importance_choice(value: Any) -> str:
    return "n/a" if value is None else format_value(value)


def param_importances(
    trials: list[dict[str, Any]], swept_keys: list[str], categorical_keys: list[str], space: dict[str, Any], value_key: str
) -> list[dict[str, Any]]:
    """fANOVA importance of each swept key for ``value_key`` (``best_metric`` or ``latest_metric``) over
    ``trials`` (finished, all of one quantity): the share of the value's variance that each key explains on its
    own, from a random forest fitted to the trials (Hutter, Hoos & Leyton-Brown, ICML 2014, eq. 5–6), as
    :class:`optuna.importance.FanovaImportanceEvaluator` computes it on an in-memory study built from the
    trials. Sorted, most important first; the importances add up to 1."""
    import optuna

    domains = {key: next(iter(space[key]), None) if isinstance(space.get(key), dict) else None for key in swept_keys}
    distributions = {
        key: importance_distribution([t.get(key) for t in trials], key in categorical_keys, domains[key]) for key in swept_keys
    }
    frozen = []
    for trial in trials:
        params = {
            key: importance_choice(trial.get(key)) if isinstance(distribution, optuna.distributions.CategoricalDistribution) else trial[key]
            for key, distribution in distributions.items()
        }
        frozen.append(optuna.trial.create_trial(params=params, distributions=distributions, value=float(trial[value_key])))
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "A new study created in memory" line in the server's terminal
    try:
        study = optuna.create_study()
        study.add_trials(frozen)
        evaluator = optuna.importance.FanovaImportanceEvaluator(n_trees=IMPORTANCE_TREES, seed=IMPORTANCE_SEED)
        importances = optuna.importance.get_param_importances(study, evaluator=evaluator)
    finally:
        optuna.logging.set_verbosity(verbosity)
    return [{"key": key, "importance": float(value)} for key, value in importances.items()]


def flatten_config(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"data": {"alpha": 0.5}}`` → ``{"data.alpha": 0.5}``; lists become their YAML text."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten_config(value, f"{name}."))
        else:
            flat[name] = yaml.safe_dump(value, default_flow_style=True).strip() if isinstance(value, list) else value
    return flat


def differing_keys(configs: list[dict[str, Any]]) -> list[str]:
    """The flattened config keys whose values differ between the configs that have them (in first-seen
    order, ``algorithm.name`` first), except the run's output location.

    A key only some configs have (an algorithm's own hyperparameter, e.g. ``algorithm.tau`` of FedSC in a
    folder that also holds FedAvg runs) counts only if it differs among those configs: a folder of runs of
    different algorithms shows the algorithm and what was varied, not every algorithm's defaults."""
    flats = [flatten_config(c) for c in configs]
    keys = list(dict.fromkeys(k for flat in flats for k in flat))
    keys = [k for k in keys if k not in IGNORED_CONFIG_KEYS and len({repr(flat[k]) for flat in flats if k in flat}) > 1]
    return sorted(keys, key=lambda k: k != ALGORITHM_KEY)


def numeric_columns(frame: pd.DataFrame) -> list[str]:
    return [
        c
        for c in frame.columns
        if c not in NON_METRIC_COLUMNS and pd.api.types.is_numeric_dtype(frame[c]) and not pd.api.types.is_bool_dtype(frame[c])
    ]


def file_stamp(path: Path) -> tuple[int, int] | None:
    """``(mtime_ns, size)`` of a file, or None if it is not there: what changes when it is rewritten."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return (stat.st_mtime_ns, stat.st_size)


def is_run_dir(path: Path) -> bool:
    return (path / SAVED_CONFIG_FILE).is_file() or (path / METRICS_FILE).is_file()


def is_sweep_dir(path: Path) -> bool:
    return any((path / name).is_file() for name in (META_FILE, TRIALS_FILE, ROUNDS_FILE, SWEEP_FILE))


def detect_kind(path: Path) -> Kind:
    """What ``path`` is now: a sweep directory, a run directory, a folder of run directories, a folder of
    sweep directories, an empty/unrecognised folder, or missing (deleted, or not a directory). A sweep wins
    over a run, and run directories over sweep directories beside them."""
    if not path.is_dir():
        return "missing"
    if is_sweep_dir(path):
        return "sweep"
    if is_run_dir(path):
        return "run"
    children = subdirectories(path)
    if any(is_run_dir(child) for child in children):
        return "runs"
    if any(is_sweep_dir(child) for child in children):
        return "sweeps"
    return "empty"


def subdirectories(path: Path) -> list[Path]:
    """The visible subdirectories of ``path`` that are really inside it: a link to a directory elsewhere
    is left out (the dashboard shows only what is in the folder it was started on)."""
    try:
        children = sorted(child for child in path.iterdir() if child.is_dir() and not child.name.startswith("."))
    except OSError:
        return []
    root = path.resolve()
    return [child for child in children if inside(child, root) is not None]


# ---------------------------------------------------------------------------------------------------
# Cached, fault-tolerant file reads


def inside(path: Path, root: Path) -> Path | None:
    """``path`` with every symbolic link resolved, or None when that leads outside ``root`` (itself
    resolved): the dashboard never reads or serves what a link inside the folder points at elsewhere."""
    try:
        resolved = path.resolve()
    except (OSError, RuntimeError):  # a symlink loop
        return None
    return resolved if resolved == root or resolved.is_relative_to(root) else None


def shown_path(path: Path, root: Path) -> str:
    """``path`` as the page shows it: relative to the served folder and starting with its name, never
    absolute (the page may be seen by others than the person who started the server)."""
    try:
        return str(Path(root.name) / path.relative_to(root))
    except ValueError:
        return path.name


class FileCache:
    """Parsed file contents keyed by path and ``(mtime_ns, size)``: a file is parsed again only when
    it changed. If a file that was read before cannot be parsed now (half-written by a non-atomic
    copy), the last good contents are returned with a warning instead of an error. Only files inside
    ``root`` (after resolving links) are read. Concurrent reads of one changed file parse it once:
    the others wait for that parse (so many readers of a large file hold one parse, not one each)."""

    def __init__(self, root: Path, max_entries: int = 512) -> None:
        self.root = root
        self.max_entries = max_entries
        self.entries: OrderedDict[tuple[Path, Callable, Any], tuple[tuple[int, int], Any]] = OrderedDict()
        self.entries_lock = threading.Lock()
        self.parse_locks = [threading.Lock() for _ in range(64)]  # a key's parse holds the lock of its hash

    def read(self, path: Path, parse: Callable[..., Any], messages: list[Message], variant: Any = None) -> Any | None:
        """The parsed file, or None if it does not exist, leads outside the folder or was never readable
        (a message says why). ``parse`` is part of the key, so pass a module-level function, not a new
        lambda each call. ``variant`` (hashable; part of the key): a second argument of ``parse``, for
        several parses of one file (one round's rows)."""
        if not path.exists():
            return None
        resolved = inside(path, self.root)
        if resolved is None:
            messages.append(Message("warning", f"{shown_path(path, self.root)} is a link to outside the served folder; it is ignored."))
            return None
        path = resolved
        stamp = file_stamp(path)
        if stamp is None:
            return None
        key = (path, parse, variant)
        with self.parse_locks[hash(key) % len(self.parse_locks)]:
            return self._read_locked(key, stamp, messages)

    def _read_locked(self, key: tuple[Path, Callable, Any], stamp: tuple[int, int], messages: list[Message]) -> Any | None:
        path, parse, variant = key
        with self.entries_lock:
            cached = self.entries.get(key)
            if cached is not None and cached[0] == stamp:
                self.entries.move_to_end(key)
                return cached[1]
        try:
            value = parse(path) if variant is None else parse(path, variant)
        except Exception as error:  # any parse failure of a half-written file is reported, not raised
            reason = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            reason = reason.replace(str(path), path.name).replace(str(self.root), self.root.name)  # readers name the absolute path
            if cached is not None:
                messages.append(
                    Message(
                        "warning",
                        f"{path.name} could not be read ({reason}); showing its last good contents. It is probably being written or copied.",
                    )
                )
                return cached[1]
            messages.append(
                Message("error", f"{shown_path(path, self.root)} could not be read ({reason}). Is it half-written or copied incompletely?")
            )
            return None
        with self.entries_lock:
            self.entries[key] = (stamp, value)
            while len(self.entries) > self.max_entries:
                self.entries.popitem(last=False)
        return value


def read_text(path: Path) -> str:
    return path.read_text()


def read_parquet_frame(path: Path) -> pd.DataFrame:
    return pq.read_table(path).to_pandas()


def run_metrics_path(run_dir: Path) -> Path:
    """What changes when a run's metrics do: its ``metrics_parts/`` folder while it runs (a part is
    renamed in), else its compacted ``metrics.parquet``."""
    parts = run_dir / PARTS_DIR
    return parts if parts.is_dir() else run_dir / METRICS_FILE


def read_round_clients(path: Path, round: int) -> pd.DataFrame:
    """The client rows of one round of the run whose metrics are at ``path`` (from :func:`run_metrics_path`)."""
    return read_clients_at_round(path.parent, round)


def read_json_object(path: Path) -> dict[str, Any]:
    loaded = json.loads(path.read_text())
    if not isinstance(loaded, dict):
        raise ValueError(f"expected a JSON object, got {type(loaded).__name__}")
    return loaded


def read_yaml_mapping(path: Path) -> dict[str, Any]:
    loaded = yaml.safe_load(path.read_text())
    if not isinstance(loaded, dict):
        raise ValueError(f"expected a YAML mapping, got {type(loaded).__name__}")
    return loaded


def frame_records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows of ``frame`` as plain dicts, missing values as None."""
    return json_safe(frame.astype(object).where(frame.notna(), None).to_dict("records"))


# ---------------------------------------------------------------------------------------------------
# The folder as the page sees it


class DashboardData:
    """Reads one folder (sweep, run, or folder of runs) on demand; thread-safe, cheap when nothing changed.

    ``version()`` only stats files; ``overview()``, ``curves()``, ``groups()`` and ``run_view()`` parse
    what changed since the last call. Nothing outside the folder is read: links that lead out of it are
    ignored (see :func:`inside`).
    """

    def __init__(self, path: str | Path, max_curve_points: int = MAX_CURVE_POINTS) -> None:
        self.root = Path(path).expanduser().resolve()
        self.max_curve_points = max_curve_points
        self.cache = FileCache(self.root)
        self.lock = threading.Lock()
        self._overview: Overview | None = None
        self._rounds: pd.DataFrame = pd.DataFrame(columns=["trial_id", "round"])
        self._longest_round: dict[str, float] = {}  # per unit watched for staleness ("" = the sweep), from the last overview
        self.importance_lock = threading.Lock()  # one fANOVA fit at a time (a second request waits for the first's result)
        self._importance: dict[tuple[str, str], dict[str, Any]] = {}  # (version, value) → the last result
        self.sweeps_lock = threading.Lock()
        self._sweeps: dict[str, DashboardData] = {}  # a folder of sweeps: each sweep's reader, by directory name

    def shown(self, path: Path) -> str:
        return shown_path(path, self.root)

    # -- change detection -------------------------------------------------------------------------

    def watched_files(self, kind: Kind) -> list[Path]:
        """The files whose change means the overview changed. (A trial's ``config.yaml`` is written when
        it starts, before it reports a metric, so the best trial's config needs no watching.)"""
        if kind == "sweep":
            return [self.root / name for name in (META_FILE, TRIALS_FILE, ROUNDS_FILE, SWEEP_FILE)]
        if kind == "sweeps":
            return [d / name for d in self.sweep_dirs() for name in (META_FILE, TRIALS_FILE, ROUNDS_FILE, SWEEP_FILE)]
        return [d / name for d in self.run_dirs(kind) for name in RUN_PROGRESS_FILES]

    def idle_seconds(self, paths: list[Path]) -> float | None:
        """Seconds since the newest of ``paths`` last changed (None if none exists)."""
        stamps = [file_stamp(p) for p in paths]
        newest = max((s[0] for s in stamps if s is not None), default=None)
        return None if newest is None else max(0.0, time.time() - newest / 1e9)

    def is_stale(self, unit: str, paths: list[Path]) -> bool:
        """Whether ``paths`` (a sweep's files, or one run's) have not changed for longer than
        :func:`stale_after` of the unit's slowest round."""
        idle = self.idle_seconds(paths)
        return idle is not None and idle > stale_after(self._longest_round.get(unit))

    def version(self) -> str:
        """A fingerprint of the watched files (and the folder's kind); it changes when any of them does,
        and when a running sweep or run goes stale."""
        kind = detect_kind(self.root)
        watched = self.watched_files(kind)
        stamps = [(str(p.relative_to(self.root)), file_stamp(p)) for p in watched]
        if kind == "sweep":
            stale = [self.is_stale("", watched)]
        else:
            stale = [self.is_stale(d.name, [d / n for n in RUN_PROGRESS_FILES]) for d in self.run_dirs(kind)]
        return f"{kind}:{hashlib.sha1(repr((stamps, stale)).encode()).hexdigest()[:16]}"

    # -- the overview --------------------------------------------------------------------------------

    def overview(self) -> Overview:
        with self.lock:
            # Taken before reading: a file that changes while it is read changes the next version(),
            # so the change is picked up on the next call rather than lost.
            version = self.version()
            if self._overview is not None and self._overview.version == version:
                return self._overview
            kind = detect_kind(self.root)
            if kind == "sweep":
                overview = self._sweep_overview(version)
            elif kind == "sweeps":
                overview = self._sweeps_overview(version)
            elif kind in ("run", "runs"):
                overview = self._runs_overview(kind, version)
            else:
                overview = self._empty_overview(kind, version)
            self._overview = overview
            return overview

    def _base(self, kind: Kind, version: str, **fields: Any) -> Overview:
        defaults: dict[str, Any] = dict(
            kind=kind,
            title=self.root.name,
            version=version,
            metric=DEFAULT_METRIC,
            mode="max",
            swept_keys=[],
            trials=[],
            round_metrics=[],
            best_trial=None,
            best_config=None,
        )
        return Overview(**{**defaults, **fields})

    def _empty_overview(self, kind: Kind, version: str) -> Overview:
        self._rounds = pd.DataFrame(columns=["trial_id", "round"])
        name = self.root.name
        if kind == "missing":
            what = "is not a directory" if self.root.exists() else "does not exist (any more)"
            text = f"{name} {what}. Give a sweep directory, a fedray run directory or a folder of runs."
            return self._base(kind, version, messages=[Message("error", text)])
        text = (
            f"Nothing to show yet in {name}: no {META_FILE}/{TRIALS_FILE} (a sweep), no {SAVED_CONFIG_FILE}/{METRICS_FILE} "
            "(a run) and no run or sweep directories inside. This page updates by itself when a sweep or run starts writing here."
        )
        return self._base(kind, version, messages=[Message("info", text)])

    # -- a folder of sweeps ----------------------------------------------------------------------------

    def sweep_dirs(self) -> list[Path]:
        return [d for d in subdirectories(self.root) if is_sweep_dir(d)]

    def sweep_data(self, name: str) -> DashboardData | None:
        """The reader of the sweep directory ``name`` of a folder of sweeps (kept, so that its files are parsed again
        only when they change), or None when the folder has no such sweep."""
        directory = next((d for d in self.sweep_dirs() if d.name == name), None)
        if directory is None:
            return None
        with self.sweeps_lock:
            data = self._sweeps.get(name)
            if data is None or data.root != directory.resolve():
                data = self._sweeps[name] = DashboardData(directory, self.max_curve_points)
            return data

    def _sweeps_overview(self, version: str) -> Overview:
        """A folder of sweep directories (e.g. ``sweeps/``): no trials of its own, each sweep summarised
        (:func:`sweep_summary`) for the page's comparison of the sweeps it ticks (:meth:`compare_sweeps`)."""
        self._rounds = pd.DataFrame(columns=["trial_id", "round"])
        summaries, problems = [], []
        for directory in self.sweep_dirs():
            sweep = self.sweep_data(directory.name)
            if sweep is None:  # removed meanwhile
                continue
            overview = sweep.overview()
            summaries.append(sweep_summary(directory.name, overview))
            problems += [Message(m.level, f"{directory.name}: {m.text}") for m in overview.messages if m.level == "error"]
        names = [summary["name"] for summary in summaries]
        listed = f"{', '.join(names[:10])}{', ...' if len(names) > 10 else ''}"
        messages = [
            Message(
                "info",
                f"{self.root.name} holds sweep directories: tick two or more below to compare them side by side, "
                f"or open one of them ({listed}) with `fedray dashboard {self.root.name}/NAME`.",
            )
        ]
        metrics = sorted({summary["metric"] for summary in summaries})
        if len(metrics) > 1:
            messages.append(
                Message("warning", f"The sweeps optimise different metrics ({', '.join(metrics)}): their best values do not compare.")
            )
        return self._base("sweeps", version, sweeps=summaries, messages=messages + problems)

    def compare_sweeps(self, names: list[str], metric: str | None) -> dict[str, Any]:
        """Sweeps of a folder of sweeps side by side: for each of ``names``, its trials' best and final values, and the
        curves of ``metric`` (default: each sweep's own metric) of its :data:`COMPARED_TRIALS_PER_SWEEP` best trials
        (ranked among the trials of the sweep's own quantity first, as the sweep's page ranks them)."""
        self.overview()
        sweeps, messages = [], []
        for name in dict.fromkeys(names):
            data = self.sweep_data(name)
            if data is None:
                messages.append(asdict(Message("warning", f"No sweep named {name!r} in {self.root.name}.")))
                continue
            overview = data.overview()
            sign = 1.0 if overview.mode == "max" else -1.0
            scored = [t for t in overview.trials if isinstance(t.get("best_metric"), (int, float)) and math.isfinite(t["best_metric"])]
            ranked = sorted(scored, key=lambda t: (t["metric_name"] != overview.metric, -sign * t["best_metric"]))
            compared = [t["trial_id"] for t in ranked[:COMPARED_TRIALS_PER_SWEEP]]
            curve_metric = metric if metric else overview.metric
            trial_columns = ("trial_id", "label", "status", "best_metric", "latest_metric", "best_round", "metric_name")
            sweeps.append(
                {
                    **sweep_summary(name, overview),
                    "trials": [{key: t.get(key) for key in trial_columns} for t in overview.trials],
                    "compared_trials": compared,
                    "curve_metric": curve_metric,
                    "curves": data.curves(compared, curve_metric)["curves"],
                }
            )
        return json_safe({"sweeps": sweeps, "messages": messages})

    # -- a trial's log -----------------------------------------------------------------------------

    def run_log(self, trial_id: str, tail_bytes: int = LOG_TAIL_BYTES) -> dict[str, Any]:
        """The end of a trial's ``log.txt`` (its last ``tail_bytes``, from the first whole line), as the page shows
        it: ``{"trial_id", "exists", "text", "truncated", "size"}``. The served folder's absolute path is replaced
        by its name, as everywhere on the page."""
        path = self.run_file(trial_id, LOG_FILE)
        result: dict[str, Any] = {"trial_id": trial_id, "exists": path is not None, "text": "", "truncated": False, "size": 0}
        if path is None:
            return result
        try:
            with path.open("rb") as file:
                size = os.fstat(file.fileno()).st_size
                start = max(0, size - tail_bytes)
                file.seek(start)
                tail = file.read(size - start)
        except OSError:  # removed between finding and reading it
            return {**result, "exists": False}
        if start:
            tail = tail[tail.find(b"\n") + 1 :]
        text = tail.decode("utf-8", errors="replace").replace(str(self.root), self.root.name)
        return {**result, "text": text, "truncated": start > 0, "size": size}

    def _finish(
        self,
        kind: Kind,
        version: str,
        trials: list[dict[str, Any]],
        metric: str,
        mode: str,
        swept_keys: list[str],
        messages: list[Message],
        **fields: Any,
    ) -> Overview:
        """What sweeps and runs share: labels, the best trial of each quantity, the failed-trials message."""
        label_trials(trials, swept_keys)
        best = best_by_metric(trials, mode)
        best_trial = best.get(metric, next(iter(best.values()), None))
        if len(best) > 1:
            others = ", ".join(f"{name} ({best[name]})" for name in best if name != metric)
            messages.append(
                Message(
                    "info",
                    f"Some trials report a different quantity as {metric} ({', '.join(n for n in best if n != metric)}: "
                    f"a linear probe's accuracy, not a supervised one); they are ranked among themselves. Best of those: {others}.",
                )
            )
        failed = [t for t in trials if t["status"] in FAILED_STATUSES]
        if failed:
            listed = "; ".join(f"{t['trial_id']} ({t['status']}): {t['error']}" for t in failed[:5])
            messages.append(Message("error", f"{len(failed)} of {len(trials)} trials failed — {listed}{' ...' if len(failed) > 5 else ''}"))
        stopped = [t for t in trials if t["status"] == STOPPED]
        if stopped:
            listed = "; ".join(f"{t['trial_id']}: {t['error']}" for t in stopped[:5])
            more = " ..." if len(stopped) > 5 else ""
            messages.append(Message("info", f"{len(stopped)} of {len(trials)} runs were stopped by their user — {listed}{more}"))
        rounds_metrics = numeric_columns(self._rounds)
        return self._base(
            kind,
            version,
            metric=metric,
            mode=mode,
            swept_keys=swept_keys,
            trials=json_safe(trials),
            round_metrics=rounds_metrics,
            best_trial=best_trial,
            best_by_metric=best,
            best_config=self._best_config(best_trial, trials, messages),
            messages=messages,
            **fields,
        )

    def _add_timing(self, trial: dict[str, Any], run_dir: Path | None, messages: list[Message]) -> None:
        """The trial's ``started_at`` and ``ended_at`` (:func:`run_times`) and ``resources`` (:func:`held_resources`),
        for the timeline, the optimisation history and the CSV export."""
        trial["started_at"], trial["ended_at"] = run_times(run_dir, trial["status"]) if run_dir is not None else (None, None)
        placement = self.cache.read(run_dir / PLACEMENT_FILE, read_json_object, messages) if run_dir is not None else None
        trial["resources"] = held_resources(placement)

    def _evaluation(self, run_dir: Path | None, messages: list[Message]) -> str | None:
        """``personalised`` or ``global`` (``run_info.json``); None for a run from before that file."""
        info = self.cache.read(run_dir / RUN_INFO_FILE, read_json_object, messages) if run_dir is not None else None
        return (info or {}).get("evaluation")

    def _sweep_overview(self, version: str) -> Overview:
        messages: list[Message] = []
        meta = self.cache.read(self.root / META_FILE, read_json_object, messages) or {}
        if not (self.root / META_FILE).is_file():
            messages.append(Message("info", f"{META_FILE} is not written yet; assuming metric {DEFAULT_METRIC} (max) until it is."))
        metric = str(meta.get("metric") or DEFAULT_METRIC)
        mode = meta.get("mode", "max")
        if mode not in ("max", "min"):
            messages.append(Message("warning", f"{META_FILE}: mode {mode!r} is neither 'max' nor 'min'; using 'max'."))
            mode = "max"

        trials_frame = self.cache.read(self.root / TRIALS_FILE, read_parquet_frame, messages)
        if trials_frame is None and not (self.root / TRIALS_FILE).is_file():
            messages.append(Message("info", f"No trial has reported yet ({TRIALS_FILE} is not written). This page updates by itself."))
        if trials_frame is not None and "trial_id" not in trials_frame.columns:
            messages.append(
                Message("error", f"{TRIALS_FILE} has no trial_id column (columns: {', '.join(map(str, trials_frame.columns))}).")
            )
            trials_frame = None
        trials = frame_records(trials_frame) if trials_frame is not None else []
        for trial in trials:
            trial["trial_id"] = str(trial["trial_id"])
            for column in TRIAL_COLUMNS:
                trial.setdefault(column, None)

        swept_keys = meta.get("swept_keys")
        if not isinstance(swept_keys, list):
            swept_keys = [c for c in (trials_frame.columns if trials_frame is not None else []) if c not in TRIAL_COLUMNS]
        swept_keys = [str(k) for k in swept_keys]
        for trial in trials:
            for key in swept_keys:
                trial[key] = scalar_or_text(trial.get(key))

        rounds = self.cache.read(self.root / ROUNDS_FILE, read_parquet_frame, messages)
        if rounds is None and trials and not (self.root / ROUNDS_FILE).is_file():
            messages.append(Message("info", f"{ROUNDS_FILE} is not written yet: no curves to draw."))
        if rounds is not None and not {"trial_id", "round"} <= set(rounds.columns):
            messages.append(
                Message("error", f"{ROUNDS_FILE} needs trial_id and round columns (has: {', '.join(map(str, rounds.columns))}).")
            )
            rounds = None
        self._rounds = rounds if rounds is not None else pd.DataFrame(columns=["trial_id", "round"])
        self._rounds = self._rounds.astype({"trial_id": str})
        probed = (
            set(self._rounds.loc[self._rounds["probe_accuracy"].notna(), "trial_id"]) if "probe_accuracy" in self._rounds.columns else set()
        )
        for trial in trials:
            trial["metric_name"] = metric_name(metric, {"probe_accuracy"} if trial["trial_id"] in probed else set())
            trial["evaluation"] = self._evaluation(self.trial_run_dir(trial["trial_id"], trials), messages)

        status = meta.get("status")
        if "seconds" in self._rounds.columns:
            self._longest_round[""] = float(pd.to_numeric(self._rounds["seconds"], errors="coerce").max() or 0.0)
        if status == "running" and self.is_stale("", self.watched_files("sweep")):
            idle = format_duration(self.idle_seconds(self.watched_files("sweep")) or 0.0)
            messages.append(
                Message(
                    "warning",
                    f"{META_FILE} says the sweep is running, but none of its files changed for {idle}: its driver "
                    f"probably died (killed, or its machine lost). `fedray tune --resume {self.root.name}` continues it.",
                )
            )
            status = "stalled"
        for trial in trials:
            if trial["status"] == ERROR and not trial["error"]:
                trial["error"] = "the trial failed; no error message was recorded"
            if trial["status"] in (RUNNING, PENDING) and status in ("finished", "failed", "stalled"):
                how = "stopped writing" if status == "stalled" else f"ended ({status})"
                trial["status"] = "INTERRUPTED"
                trial["error"] = f"the sweep {how} before this trial finished; `fedray tune --resume` continues it"
            self._add_timing(trial, self.trial_run_dir(trial["trial_id"], trials), messages)

        return self._finish(
            "sweep",
            version,
            trials,
            metric,
            mode,
            swept_keys,
            messages,
            paired_comparison=self._paired_comparison(trials_frame, metric, mode, swept_keys, messages),
            title=str(meta.get("sweep_id") or self.root.name),
            categorical_keys=self._categorical_keys(swept_keys, trials, messages),
            status=status,
            num_trials=meta.get("num_trials"),
            started_at=meta.get("started_at"),
            ray_dashboard_url=(meta.get("ray_dashboard_url") or None) if status == "running" else None,
        )

    def _paired_comparison(
        self, trials_frame: pd.DataFrame | None, metric: str, mode: str, swept_keys: list[str], messages: list[Message]
    ) -> dict[str, Any] | None:
        """Each algorithm's paired differences from the reference algorithm, seed by seed, with Student's t
        intervals (:func:`fedray.tracking.paired.paired_comparison`: the rows of comparison.md's paired tables);
        None unless the sweep sweeps ``algorithm.name``."""
        if trials_frame is None or ALGORITHM_KEY not in swept_keys or not {ALGORITHM_KEY, "status"} <= set(trials_frame.columns):
            return None
        from fedray.tracking.paired import paired_comparison  # pandas and yaml only; scipy when there are pairs

        spec = self.cache.read(self.root / SWEEP_FILE, read_yaml_mapping, messages) or None
        try:
            return json_safe(paired_comparison(trials_frame.astype({"trial_id": str}), self._rounds, metric, mode, swept_keys, spec))
        except (ValueError, TypeError, KeyError) as error:  # a half-written or odd file: say so, never fail the page
            messages.append(Message("warning", f"The paired comparison of the algorithms could not be computed: {error}"))
            return None

    def _categorical_keys(self, swept_keys: list[str], trials: list[dict[str, Any]], messages: list[Message]) -> list[str]:
        """The swept keys searched over listed values (``grid``/``choice`` in ``sweep.yaml``); without that
        file, the keys whose values are not all non-integer numbers."""
        spec = self.cache.read(self.root / SWEEP_FILE, read_yaml_mapping, messages) or {}
        space = spec.get("space") if isinstance(spec.get("space"), dict) else None
        if space is not None:
            return [k for k in swept_keys if isinstance(space.get(k), dict) and next(iter(space[k]), None) in CATEGORICAL_DOMAINS]
        return [k for k in swept_keys if not all(isinstance(t.get(k), float) for t in trials if t.get(k) is not None)]

    def _runs_overview(self, kind: Kind, version: str) -> Overview:
        """A single run or a folder of runs as a sweep: one trial per run, ranked by the first run's task's
        headline metric in its direction (``test_accuracy``, max, for classification; :func:`task_headline`)."""
        messages: list[Message] = []
        metric, mode = DEFAULT_METRIC, "max"
        run_dirs = self.run_dirs(kind)
        configs: list[dict[str, Any]] = []
        trials: list[dict[str, Any]] = []
        frames: list[pd.DataFrame] = []
        for run_dir in run_dirs:
            trial_id = run_dir.name
            config = self.cache.read(run_dir / SAVED_CONFIG_FILE, read_yaml_mapping, messages) or {}
            if not configs:
                metric, mode = task_headline(config)
            summary = self.cache.read(run_dir / SUMMARY_FILE, read_json_object, messages)
            rounds = self._run_round_rows(run_dir, messages)
            frames.append(rounds.assign(trial_id=trial_id))
            values = rounds[metric].tolist() if metric in rounds.columns else []
            seconds = summary.get("seconds") if summary else (rounds["seconds"].sum() if "seconds" in rounds.columns else None)
            if "seconds" in rounds.columns:
                self._longest_round[trial_id] = float(pd.to_numeric(rounds["seconds"], errors="coerce").max() or 0.0)
            status, error = TERMINATED, None
            stopped = self.cache.read(run_dir / STOPPED_FILE, read_json_object, messages) if summary is None else None
            if stopped is not None:
                status = STOPPED
                error = (
                    f"stopped by its user after round {stopped.get('round', '?')} ({stopped.get('stopped_at', 'time unknown')}); "
                    f"`fedray run --resume {self.shown(run_dir)}` continues it from its last checkpoint"
                )
            elif summary is None:
                status = RUNNING if len(rounds) else PENDING
                run_files = [run_dir / n for n in (SAVED_CONFIG_FILE, METRICS_FILE, SUMMARY_FILE)]
                if self.is_stale(trial_id, run_files):
                    status = "STALLED"
                    error = (
                        f"no {SUMMARY_FILE} and no file written for {format_duration(self.idle_seconds(run_files) or 0.0)}: the run probably "
                        f"crashed or was killed; `fedray run --resume {self.shown(run_dir)}` continues it from its last checkpoint"
                    )
            reported = {c for c in numeric_columns(rounds) if rounds[c].notna().any()}
            trials.append(
                {
                    "trial_id": trial_id,
                    "status": status,
                    **summarize_curve(rounds["round"].tolist(), values, mode),
                    "wall_time_s": seconds,
                    "run_dir": str(run_dir.relative_to(self.root)),
                    "error": error,
                    "metric_name": metric_name(metric, reported),
                    "evaluation": self._evaluation(run_dir, messages),
                }
            )
            self._add_timing(trials[-1], run_dir, messages)
            configs.append(config)
        swept_keys = differing_keys(configs) if kind == "runs" else []
        for trial, config in zip(trials, configs):
            flat = flatten_config(config)
            trial.update({key: scalar_or_text(flat.get(key)) for key in swept_keys})
        if kind == "runs" and len(run_dirs) > 1 and not swept_keys:
            messages.append(Message("info", "The runs have identical configs (apart from output): no hyperparameter differs between them."))
        self._rounds = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["trial_id", "round"])
        # runs are set up by hand, one value at a time: their keys take a few listed values, like a grid
        return self._finish(kind, version, trials, metric, mode, swept_keys, messages, categorical_keys=list(swept_keys))

    def run_dirs(self, kind: Kind) -> list[Path]:
        if kind == "run":
            return [self.root]
        if kind == "runs":
            return [d for d in subdirectories(self.root) if is_run_dir(d)]
        return []

    def _run_round_rows(self, run_dir: Path, messages: list[Message]) -> pd.DataFrame:
        """The ``scope == "round"`` rows of a run's ``metrics.parquet`` (empty frame if none yet)."""
        metrics = self.cache.read(run_metrics_path(run_dir), read_run_metrics, messages)
        return pd.DataFrame(columns=["round"]) if metrics is None else metrics.rounds

    def _best_config(self, trial_id: str | None, trials: list[dict[str, Any]], messages: list[Message]) -> str | None:
        if trial_id is None:
            return None
        run_dir = self.trial_run_dir(trial_id, trials)
        path = None if run_dir is None else run_dir / SAVED_CONFIG_FILE
        if path is None or not path.is_file():
            messages.append(
                Message("warning", f"The best trial {trial_id} has no {SAVED_CONFIG_FILE} here (was the sweep copied without trials/?).")
            )
            return None
        text = self.cache.read(path, read_text, messages)
        try:
            return as_new_run_config(text) if text is not None else None
        except ValueError as error:
            messages.append(Message("warning", f"{self.shown(path)}: {error}; shown as written."))
            return text

    # -- per trial -----------------------------------------------------------------------------------

    def trial_run_dir(self, trial_id: str, trials: list[dict[str, Any]] | None = None) -> Path | None:
        """The trial's run directory inside the folder (its ``run_dir`` in ``trials``, by default the
        current overview's trials; else ``trials/<trial_id>``), or None if it is not there. Paths that lead
        outside the folder (``..``, links) are refused, so the server never reads files it was not pointed at."""
        kind = detect_kind(self.root)
        if kind in ("run", "runs"):
            candidates = [d for d in self.run_dirs(kind) if d.name == trial_id]
        else:
            trial = self._trial(trial_id, trials)
            recorded = trial.get("run_dir") if trial else None
            candidates = ([self.root / recorded] if isinstance(recorded, str) and recorded else []) + [self.root / TRIALS_DIR / trial_id]
        for candidate in candidates:
            resolved = inside(candidate, self.root)
            if resolved is not None and resolved.is_dir():
                return resolved
        return None

    def _trial(self, trial_id: str, trials: list[dict[str, Any]] | None = None) -> dict[str, Any] | None:
        if trials is None:
            trials = self._overview.trials if self._overview is not None else []
        return next((t for t in trials if t["trial_id"] == trial_id), None)

    def curves(self, trial_ids: list[str], metric: str) -> dict[str, Any]:
        """``{"metric", "curves": {trial_id: {"round": [...], "value": [...]}}}``, each curve downsampled
        to at most ``max_curve_points`` points; trials without the metric get no entry."""
        self.overview()
        with self.lock:
            rounds = self._rounds
        curves: dict[str, Any] = {}
        if metric in rounds.columns:
            columns = list(dict.fromkeys(["trial_id", "round", metric, *([SIM_TIME] if SIM_TIME in rounds.columns else [])]))
            selected = rounds[rounds["trial_id"].isin(trial_ids)][columns]
            for trial_id, rows in selected.groupby("trial_id", sort=False):
                curve = curve_of(rows.sort_values("round"), metric, self.max_curve_points)
                if curve is not None:
                    curves[str(trial_id)] = curve
        return json_safe({"metric": metric, "curves": curves})

    def groups(self, by: list[str], metric: str) -> dict[str, Any]:
        """The comparison table of :func:`group_trials` over the swept keys ``by`` (others are ignored),
        each group with the mean ± std band of ``metric`` round by round (:func:`band`)."""
        overview = self.overview()
        keys = [key for key in dict.fromkeys(by) if key in overview.swept_keys]
        with self.lock:
            rounds = self._rounds
        table = group_trials(overview.trials, keys, overview.mode, overview.metric)
        for group in table:
            group["curve"] = band(rounds[rounds["trial_id"].isin(group["trial_ids"])], metric, self.max_curve_points)
        return json_safe({"by": keys, "metric": overview.metric, "mode": overview.mode, "curve_metric": metric, "groups": table})

    def heatmap(self, x: str, y: str, metric: str | None) -> dict[str, Any]:
        """The heatmap of ``metric`` (default: the sweep's) over the swept keys ``x`` and ``y`` (:func:`heatmap_grid`):
        each trial's final value (:func:`final_values`), over the trials that finished or are running (failed,
        interrupted, stalled and stopped ones are left out, as in the comparison table) and, for the sweep's own
        metric, measure its quantity. ``left_out`` counts the trials left out. An unknown key or metric, or
        ``x`` equal to ``y``, raises :class:`BadRequest`."""
        overview = self.overview()
        metric = metric or overview.metric
        for key in (x, y):
            if key not in overview.swept_keys:
                swept = ", ".join(overview.swept_keys) or "none"
                raise BadRequest(f"{key!r} is not a swept key of {self.root.name} (swept keys: {swept})")
        if x == y:
            raise BadRequest(f"pick two different keys for the heatmap's axes (both are {x!r})")
        if metric not in overview.round_metrics:
            reported = ", ".join(overview.round_metrics) or "none yet"
            raise BadRequest(f"no trial of {self.root.name} reports {metric!r} (metrics: {reported})")
        counted = [
            t
            for t in overview.trials
            if t.get("status") not in UNFINISHED_STATUSES and (metric != overview.metric or t["metric_name"] == metric)
        ]
        with self.lock:
            rounds = self._rounds
        values = final_values(rounds[rounds["trial_id"].isin([t["trial_id"] for t in counted])], metric)
        grid = heatmap_grid(counted, values, x, y)
        return json_safe({"metric": metric, "value": "final", **grid, "left_out": len(overview.trials) - len(values)})

    def importance(self, value_key: str) -> dict[str, Any]:
        """Hyperparameter importance (:func:`param_importances`) of the swept keys for ``value_key``
        (``best_metric`` or ``latest_metric``) over the finished trials whose metric is the sweep's own quantity;
        ``available`` is False, with a ``message`` saying why, when Optuna is missing or too few trials differ.
        Computed once per version of the folder."""
        overview = self.overview()
        value_key = value_key if value_key in ("best_metric", "latest_metric") else "latest_metric"
        cache_key = (overview.version, value_key)
        with self.importance_lock:
            if cache_key not in self._importance:
                self._importance = {cache_key: self._compute_importance(overview, value_key)}
            return self._importance[cache_key]

    def _compute_importance(self, overview: Overview, value_key: str) -> dict[str, Any]:
        used = [
            t
            for t in overview.trials
            if t["status"] == TERMINATED and t["metric_name"] == overview.metric and isinstance(t.get(value_key), (int, float))
        ]
        result: dict[str, Any] = {
            "available": False,
            "value": value_key,
            "metric": overview.metric,
            "num_trials": len(used),
            "left_out": len(overview.trials) - len(used),
            "importances": [],
            "message": None,
        }
        varied = [k for k in overview.swept_keys if len({repr(t.get(k)) for t in used}) > 1]
        if importlib.util.find_spec("optuna") is None:
            result["message"] = (
                'Hyperparameter importance is computed by Optuna, which is not installed: pip install "fedray[optuna]" '
                "(or pip install optuna), then restart fedray dashboard."
            )
        elif len(used) < 2 or not varied:
            result["message"] = (
                f"Hyperparameter importance needs at least two finished trials of {overview.metric} that differ in a swept key "
                f"({len(used)} finished so far)."
            )
        else:
            spec = self.cache.read(self.root / SWEEP_FILE, read_yaml_mapping, []) or {}
            space = spec.get("space") if isinstance(spec.get("space"), dict) else {}
            result["importances"] = param_importances(used, overview.swept_keys, overview.categorical_keys, space, value_key)
            result["available"] = True
        return json_safe(result)

    def run_view(self, trial_id: str, client_round: int | None = None) -> dict[str, Any]:
        """One run's page: its round curves (every numeric metric, downsampled), the per-client
        distribution of each client metric at ``client_round`` (default: the last round with client
        rows), its config and which figures it has."""
        overview = self.overview()
        messages: list[Message] = []
        if self._trial(trial_id) is None:
            return json_safe(
                {
                    "trial_id": trial_id,
                    "found": False,
                    "messages": [asdict(Message("error", f"No trial or run named {trial_id!r} in {self.root.name}."))],
                }
            )
        run_dir = self.trial_run_dir(trial_id)
        view: dict[str, Any] = {
            "trial_id": trial_id,
            "found": True,
            "run_dir": None,
            "curves": {},
            "clients": None,
            "client_summary": {},
            "participation": None,
            "config": None,
            "files": {},
            "summary": None,
        }
        metrics = None
        if run_dir is None:
            messages.append(
                Message(
                    "warning",
                    f"The run directory of {trial_id} is not here (the trial has not started, or the sweep was copied without trials/); showing its rows from {ROUNDS_FILE}.",
                )
            )
        else:
            view["run_dir"] = str(run_dir.relative_to(self.root)) or "."
            metrics = self.cache.read(run_metrics_path(run_dir), read_run_metrics, messages)
            view["config"] = self.cache.read(run_dir / SAVED_CONFIG_FILE, read_text, messages)
            view["summary"] = self.cache.read(run_dir / SUMMARY_FILE, read_json_object, messages)
            files = {name: self.run_file(trial_id, name) for name in RUN_FILES}
            view["files"] = {
                name: file_stamp(path)[0] for name, path in files.items() if path is not None and file_stamp(path)
            }  # mtime: busts the browser cache

        if metrics is not None and "round" in metrics.rounds.columns:
            round_rows = metrics.rounds
        else:
            with self.lock:
                round_rows = self._rounds[self._rounds["trial_id"] == trial_id]
        round_rows = round_rows.sort_values("round")
        for column in numeric_columns(round_rows):
            curve = curve_of(round_rows, column, self.max_curve_points)
            if curve is not None:
                view["curves"][column] = curve
        if metrics is not None and metrics.client_rounds:
            chosen = client_round if client_round in metrics.client_rounds else metrics.client_rounds[-1]
            at_round = self.cache.read(run_metrics_path(run_dir), read_round_clients, messages, variant=chosen)
            view["clients"] = clients_at_round(at_round, metrics.client_rounds, chosen)
            view["client_summary"] = downsampled_summary(metrics, self.max_curve_points)
            config = self.cache.read(run_dir / SAVED_CONFIG_FILE, read_yaml_mapping, messages) or {}
            num_clients = (config.get("data") or {}).get("num_clients") if isinstance(config.get("data"), dict) else None
            view["participation"] = participation_histogram(metrics.participation, num_clients if isinstance(num_clients, int) else None)
        view["metric"], view["mode"] = overview.metric, overview.mode
        view["messages"] = [asdict(m) for m in messages]
        return json_safe(view)

    def run_file(self, trial_id: str, name: str) -> Path | None:
        """The resolved path of one of :data:`RUN_FILES` of a trial's run directory, or None (also when
        the file is a link to outside the folder)."""
        if name not in RUN_FILES:
            return None
        self.overview()
        run_dir = self.trial_run_dir(trial_id)
        path = None if run_dir is None else inside(run_dir / name, self.root)
        return path if path is not None and path.is_file() else None


def sweep_summary(name: str, overview: Overview) -> dict[str, Any]:
    """One sweep of a folder of sweeps, as its list on the page shows it: its directory ``name``, id, status, metric
    and mode, trial counts by status, and its best trial (its label and best value)."""
    best = next((t for t in overview.trials if t["trial_id"] == overview.best_trial), None)
    counts: dict[str, int] = {}
    for trial in overview.trials:
        counts[trial["status"]] = counts.get(trial["status"], 0) + 1
    return {
        "name": name,
        "title": overview.title,
        "status": overview.status,
        "metric": overview.metric,
        "mode": overview.mode,
        "swept_keys": overview.swept_keys,
        "num_trials": len(overview.trials),
        "planned_trials": overview.num_trials,
        "counts": counts,
        "round_metrics": overview.round_metrics,
        "best_trial": overview.best_trial,
        "best_label": None if best is None else best["label"],
        "best_metric": None if best is None else best["best_metric"],
        "best_round": None if best is None else best["best_round"],
    }


def as_new_run_config(config_text: str) -> str:
    """A trial's ``config.yaml`` made ready for ``fedray run``: the same YAML with ``output.dir`` and
    ``output.name`` reset to their defaults, so the new run gets its own directory under ``runs/``
    instead of overwriting the trial's directory inside the sweep. Everything else is kept as is."""
    try:
        config = yaml.safe_load(config_text)
    except yaml.YAMLError as error:
        raise ValueError(f"not valid YAML ({str(error).splitlines()[0]})") from None
    if not isinstance(config, dict):
        raise ValueError("not a YAML mapping")
    defaults = OutputConfig()
    config["output"] = {**(config.get("output") or {}), "dir": defaults.dir, "name": defaults.name}
    return yaml.safe_dump(config, sort_keys=False)


def client_distribution(client_rows: pd.DataFrame, client_round: int | None) -> dict[str, Any] | None:
    """Per-client values of each numeric client metric at one round (the last one by default), or None
    when the run has no per-client rows (see :func:`clients_at_round`)."""
    if client_rows.empty:
        return None
    rounds = sorted(int(r) for r in client_rows["round"].unique())
    chosen = client_round if client_round in rounds else rounds[-1]
    return clients_at_round(client_rows[client_rows["round"] == chosen], rounds, chosen)


def clients_at_round(at_round: pd.DataFrame | None, rounds: list[int], chosen: int, max_clients: int = MAX_CLIENT_POINTS) -> dict[str, Any]:
    """The page's per-client values of each numeric client metric at round ``chosen`` (``at_round``:
    its client rows; ``rounds``: the rounds that have some). A round of more than ``max_clients``
    clients is shown by ``max_clients`` of them, evenly spaced in client order (``shown_clients``),
    so that a response stays small however many clients the run has."""
    at_round = pd.DataFrame(columns=["round"]) if at_round is None else at_round
    shown = at_round
    if len(at_round) > max_clients:
        ordered = at_round.sort_values("client_id", kind="stable") if "client_id" in at_round.columns else at_round
        shown = ordered.iloc[np.unique(np.linspace(0, len(ordered) - 1, max_clients).round().astype(int))]
    client_ids = shown["client_id"].tolist() if "client_id" in shown.columns else list(range(len(shown)))
    values = {  # aligned with client_ids; None where a client did not report the metric
        column: pd.to_numeric(shown[column], errors="coerce").tolist() for column in numeric_columns(shown) if shown[column].notna().any()
    }
    return json_safe(
        {
            "rounds": rounds,
            "round": chosen,
            "num_clients": int(len(at_round)),
            "shown_clients": int(len(shown)),
            "client_ids": client_ids,
            "metrics": values,
        }
    )


def downsampled_summary(metrics: RunMetrics, max_points: int) -> dict[str, Any]:
    """The per-round client summaries of :class:`~fedray.dashboard.run_metrics.RunMetrics` for the
    page: ``{metric: {"round": [...], "count": [...], "mean": [...], "min": [...], ...}}``, at most
    ``max_points`` rounds (evenly spaced, the first and last kept), plus ``sim_time`` at those rounds
    when the run's round rows carry the simulated clock for each of them (``systems.enabled``)."""
    rounds = np.asarray(metrics.client_rounds)
    keep = np.unique(np.linspace(0, len(rounds) - 1, min(len(rounds), max_points)).round().astype(int)) if len(rounds) else rounds
    clock = {}
    if SIM_TIME in metrics.rounds.columns and "round" in metrics.rounds.columns:
        at_round = pd.to_numeric(metrics.rounds[SIM_TIME], errors="coerce").groupby(metrics.rounds["round"]).last()
        times = at_round.reindex(rounds[keep]).to_numpy(dtype=np.float64, na_value=np.nan)
        if np.isfinite(times).all():
            clock[SIM_TIME] = times
    return {
        name: {"round": rounds[keep], **clock, **{key: values[keep] for key, values in statistics.items()}}
        for name, statistics in metrics.client_summary.items()
    }


def scalar_or_text(value: Any) -> Any:
    """A swept value as the page shows it: numbers, strings, booleans and None as they are, anything
    else (lists, mappings) as text."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        value = value.tolist()
    return json.dumps(value, default=str)
