"""One Tune trial = one full fedray simulation, inside the trial's own placement group.

Resources (docs/architecture.md, principle 8): a trial reserves, in one ``tune.PlacementGroupFactory``,

- bundle 0: the trial's driver (``driver_cpus`` of the sweep file) plus the server actor
  (``resources.server_cpus``, 0 by default), which :func:`fedray.runtime.run_experiment` schedules in
  bundle 0 of the group it is given;
- bundles 1..W: one per worker, ``{"CPU": cpus_per_worker, "GPU": gpus_per_worker}``.

So concurrent trials never oversubscribe a CPU or a GPU: Tune starts a trial only when its whole group
fits. Tune's head bundle is declared empty (``{}``) and bundle 0's CPUs are listed as the first
"child" bundle: Tune then runs the trial's driver in bundle 0 *without* charging it to the bundle,
which leaves bundle 0's CPUs for the server (a driver charged with the whole bundle would leave the
server no room and it would never be scheduled). The driver's share is still reserved by the group.

Reporting: every evaluated round is sent to Tune (``tune.report``) with the engine's round row (so
ASHA can stop a weak trial after any round) and, when the engine has written a newer checkpoint into
the trial's run directory, a small Tune checkpoint naming that round. The last round is sent once the
simulation has ended (see :class:`TuneReporter`). A trial that Tune restores (a
retry after a crash, or ``fedray tune --resume``) continues from the engine's latest checkpoint in
its run directory (``run_experiment(resume=True)``) and first re-reports the rounds Tune has not seen.

Warm trials (``reuse_workers``, the default): Tune reuses a trial's process for the next trial with
the same resources, and that process keeps its server and workers in the same placement group and
resets them for the next trial (:mod:`fedray.tune.pool`).

Population-based training (``scheduler: pbt``): each Tune checkpoint also carries a copy of the engine's
state at that round (the checkpoint file, the metrics (``metrics.parquet`` or ``metrics_parts/``) and
``client_state/``), so a trial that Tune restarts from *another* trial's checkpoint with a perturbed config (an exploit) continues from
that donor's round: its run directory is reset to the donor's state and the exploit is recorded in
``exploits.json`` (round, donor trial, new values).

Each trial writes ``log.txt`` in its run directory (:mod:`fedray.tune.trial_log`): its rounds, warnings and,
when it fails, the traceback.

A trial that fails deterministically reports the error as its last result and ends, never retried
(:data:`DETERMINISTIC_ERRORS`): on its config (:class:`ConfigError`, e.g. data missing on the trial's
node), by diverging (:class:`TrainingDiverged`: every run of the trial's seeded config diverges in the
same round), or in the user's code (:class:`UserCodeError`, seeded as well).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable

import ray
from ray import tune
from ray.util.placement_group import get_current_placement_group

from fedray.config import ConfigError, RunConfig
from fedray.layout import CHECKPOINTS_DIR, SUMMARY_FILE, list_checkpoints
from fedray.runtime import run_experiment
from fedray.runtime.errors import TrainingDiverged, UserCodeError
from fedray.runtime.experiment import default_callbacks
from fedray.tracking import Callback, MetricsParquet, RunContext, read_metrics
from fedray.tracking.metrics_file import METRICS_FILE, PARTS_DIR
from fedray.tune.pool import warm_server
from fedray.tune.results import CONFIG_ERROR, engine_metrics, trial_run_dir
from fedray.tune.spec import SweepSpec
from fedray.tune.trial_log import TrialLog

SERVER_BUNDLE = 0
FIRST_WORKER_BUNDLE = 1
CHECKPOINT_FILE = "fedray_checkpoint.json"
PLACEMENT_FILE = "placement.json"
EXPLOITS_FILE = "exploits.json"
CLIENT_STATE_DIR = "client_state"
ENGINE_STATE_DIR = "engine"  # inside a Tune checkpoint: the engine state a PBT exploit clones
#: Errors a retry of the trial would raise again: they end it at once (Tune's max_failures is for crashes).
DETERMINISTIC_ERRORS = (ConfigError, TrainingDiverged, UserCodeError)


def trial_bundles(config: RunConfig, driver_cpus: float) -> list[dict[str, float]]:
    """Bundle 0 (driver + server), then one bundle per worker."""
    resources = config.resources
    worker = {"CPU": resources.cpus_per_worker}
    if resources.gpus_per_worker > 0:
        worker["GPU"] = resources.gpus_per_worker
    return [{"CPU": driver_cpus + resources.server_cpus}] + [dict(worker) for _ in range(resources.num_workers)]


def trial_resources(spec: SweepSpec) -> Callable[[dict[str, Any]], tune.PlacementGroupFactory]:
    """Per-trial resources for ``tune.with_resources`` (a function: a sweep may vary ``resources.*``)."""

    def resources(values: dict[str, Any]) -> tune.PlacementGroupFactory:
        config = spec.trial_config({key: values[key] for key in spec.swept_keys})
        # The empty head bundle: see the module docstring.
        return tune.PlacementGroupFactory([{}] + trial_bundles(config, spec.driver_cpus), strategy="PACK")

    return resources


class TuneReporter(Callback):
    """Sends each evaluated round to Tune, with a Tune checkpoint when the engine wrote a new one.

    The last round is held back until the simulation has ended (:meth:`report_held_back`): Tune may
    end a trial at any report (ASHA stops every trial that reaches its last round), and the run
    directory is complete (``summary.json``, final plots) only once ``run_experiment`` returns.
    """

    def __init__(self, metric: str, reported_round: int, last_round: int, copy_engine_state: bool = False) -> None:
        self.metric = metric
        self.copy_engine_state = copy_engine_state  # PBT: Tune checkpoints carry the engine state
        self.reported_round = reported_round  # rounds up to here are already in Tune's records
        self.checkpointed_round = reported_round
        self.last_round = last_round
        self.held_back: dict[str, Any] | None = None

    def on_run_start(self, run: RunContext) -> None:
        for row in run.history:  # rows a resumed run kept from before its checkpoint
            self.report(row, run.run_dir)

    def on_round_end(self, run: RunContext, row: dict[str, Any], client_rows: list[dict[str, Any]]) -> None:
        self.report(row, run.run_dir)

    def report_held_back(self, run_dir: Path) -> None:
        if self.held_back is not None:
            self.report(self.held_back, run_dir, hold_last=False)

    def report(self, row: dict[str, Any], run_dir: Path, hold_last: bool = True) -> None:
        if row["round"] <= self.reported_round or row.get(self.metric) is None:
            return  # Tune needs the sweep's metric in every result (rounds without evaluation are skipped)
        if hold_last and row["round"] == self.last_round:
            self.held_back = row
            return
        metrics = engine_metrics({key: value for key, value in row.items() if value is not None})
        checkpoints = [round for round, _ in list_checkpoints(run_dir) if round <= row["round"]]
        if checkpoints and checkpoints[-1] > self.checkpointed_round:
            with tempfile.TemporaryDirectory() as directory:
                trial_id = tune.get_context().get_trial_id()
                Path(directory, CHECKPOINT_FILE).write_text(json.dumps({"round": checkpoints[-1], "trial_id": trial_id}))
                if self.copy_engine_state:
                    copy_engine_state(run_dir, checkpoints[-1], Path(directory, ENGINE_STATE_DIR))
                tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(directory))
            self.checkpointed_round = checkpoints[-1]
        else:
            tune.report(metrics)
        self.reported_round = row["round"]


class PlacementRecord(Callback):
    """Writes ``placement.json`` (the trial's placement group, its bundles, the group each worker runs
    in and the workers' process ids: the same as the previous trial's when it reused its warm pool) and
    fails the trial if a worker landed outside the trial's group."""

    def on_run_start(self, run: RunContext) -> None:
        group = get_current_placement_group()
        workers = run.server.worker_handles()
        worker_groups = ray.get([worker.placement_group_id.remote() for worker in workers])
        worker_pids = ray.get([worker.pid.remote() for worker in workers])
        record = {
            "trial_id": tune.get_context().get_trial_id(),
            "placement_group_id": None if group is None else group.id.hex(),
            "bundles": None if group is None else group.bundle_specs,
            "server_bundle": SERVER_BUNDLE,
            "first_worker_bundle": FIRST_WORKER_BUNDLE,
            "worker_placement_group_ids": worker_groups,
            "worker_pids": worker_pids,
        }
        (run.run_dir / PLACEMENT_FILE).write_text(json.dumps(record, indent=2))
        outside = [i for i, group_id in enumerate(worker_groups) if group_id != record["placement_group_id"]]
        if outside:
            raise RuntimeError(f"workers {outside} run outside the trial's placement group {record['placement_group_id']}")


def copy_engine_state(run_dir: Path, round: int, target: Path) -> None:
    """Copy what a run needs to continue after ``round`` (the round's checkpoint file(s), the metrics
    and the client state) from ``run_dir`` to ``target`` (laid out like a run directory)."""
    checkpoint_file = next(path for r, path in list_checkpoints(run_dir) if r == round)
    (target / checkpoint_file.parent.name).mkdir(parents=True)
    for path in checkpoint_file.parent.glob(checkpoint_file.name + "*"):  # the file and any sidecar
        shutil.copy2(path, target / checkpoint_file.parent.name / path.name)
    if (run_dir / METRICS_FILE).is_file():
        shutil.copy2(run_dir / METRICS_FILE, target / METRICS_FILE)
    if (run_dir / PARTS_DIR).is_dir():  # the rows of a run still going on (rows after `round` are dropped on resume)
        shutil.copytree(run_dir / PARTS_DIR, target / PARTS_DIR)
    if (run_dir / CLIENT_STATE_DIR).is_dir():
        shutil.copytree(run_dir / CLIENT_STATE_DIR, target / CLIENT_STATE_DIR)


def adopt_engine_state(source: Path, run_dir: Path, round: int, donor: str, values: dict[str, Any]) -> None:
    """Reset ``run_dir`` to the engine state copied by :func:`copy_engine_state` from the trial
    ``donor`` (a PBT exploit) and record the exploit in ``exploits.json``."""
    for stale in (run_dir / CHECKPOINTS_DIR, run_dir / CLIENT_STATE_DIR, run_dir / PARTS_DIR):
        shutil.rmtree(stale, ignore_errors=True)
    for stale in (run_dir / METRICS_FILE, run_dir / SUMMARY_FILE):
        stale.unlink(missing_ok=True)
    shutil.copytree(source, run_dir, dirs_exist_ok=True)
    exploits_file = run_dir / EXPLOITS_FILE
    exploits = json.loads(exploits_file.read_text()) if exploits_file.is_file() else []
    exploits.append({"round": round, "donor": donor, "values": values})
    exploits_file.write_text(json.dumps(exploits, indent=2))


def restore_from_tune_checkpoint(run_dir: Path, values: dict[str, Any]) -> int:
    """The engine round of the Tune checkpoint this trial starts from (0: a fresh start). A checkpoint
    of another trial (a PBT exploit) first replaces this trial's engine state with the donor's."""
    checkpoint = tune.get_checkpoint()
    if checkpoint is None:
        return 0
    with checkpoint.as_directory() as directory:
        record = json.loads(Path(directory, CHECKPOINT_FILE).read_text())
        donor = record.get("trial_id")
        if donor is not None and donor != tune.get_context().get_trial_id():
            adopt_engine_state(Path(directory, ENGINE_STATE_DIR), run_dir, int(record["round"]), donor, values)
        return int(record["round"])


def _finished(run_dir: Path, config: RunConfig) -> bool:
    summary = run_dir / SUMMARY_FILE
    return summary.is_file() and json.loads(summary.read_text()).get("rounds") == config.train.rounds


def run_trial(values: dict[str, Any], *, spec: SweepSpec, sweep_dir: str) -> None:
    """The Tune trainable: run (or continue) the simulation of the trial with the swept ``values``,
    writing its ``log.txt`` (:class:`~fedray.tune.trial_log.TrialLog`, with the traceback of any error).
    A deterministic error ends the trial with the error as its result (see the module docstring)."""
    trial_id = tune.get_context().get_trial_id()
    run_dir = Path(sweep_dir) / trial_run_dir(trial_id)
    with TrialLog(run_dir, trial_id) as log:
        try:
            _run_trial(values, spec, run_dir, log)
        except DETERMINISTIC_ERRORS as error:
            log.failed(error)
            tune.report(
                {spec.metric: float("nan"), "round": 0, CONFIG_ERROR: error.detail if isinstance(error, ConfigError) else str(error)}
            )


def _run_trial(values: dict[str, Any], spec: SweepSpec, run_dir: Path, log: TrialLog) -> None:
    swept = {key: values[key] for key in spec.swept_keys}
    config = spec.trial_config(swept)
    start_round = restore_from_tune_checkpoint(run_dir, swept)
    reporter = TuneReporter(spec.metric, start_round, config.train.rounds, copy_engine_state=spec.scheduler.type == "pbt")
    if _finished(run_dir, config):
        # The sweep stopped after this simulation ended but before Tune recorded it: report, don't re-run.
        for row in read_metrics(run_dir, "round"):
            reporter.report(row, run_dir)
    else:
        group = get_current_placement_group()
        if group is None:
            raise RuntimeError("run_trial must run as a Tune trial with a placement group (see trial_resources)")
        callbacks = default_callbacks(config, progress=False)
        for callback in callbacks:
            if isinstance(callback, MetricsParquet):
                callback.min_interval = 0.0  # Tune may end the trial at any report: keep metrics.parquet whole
        with warm_server(config, group) if spec.reuse_workers else nullcontext() as warm:
            summary = run_experiment(
                config,
                run_dir=run_dir,
                resume=True,  # continues from the run directory's latest checkpoint; from round 1 if it has none
                placement=(group, FIRST_WORKER_BUNDLE),
                callbacks=callbacks + [PlacementRecord(), log, reporter],
                warm=warm,
            )
        log.summary(summary)
    reporter.report_held_back(run_dir)
