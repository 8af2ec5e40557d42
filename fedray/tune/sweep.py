"""Run a sweep, or resume an interrupted one, with Ray Tune.

``run_sweep`` creates ``<output.dir>/<name>-<YYYYmmdd-HHMMSS>/`` (the sweep directory: ``sweep.yaml``,
``meta.json``, ``trials.parquet``, ``rounds.parquet``, ``trials/<trial_id>/``, ``tune/``), connects to
Ray (or starts a local Ray big enough for one trial) and runs a ``tune.Tuner`` whose trials are
:func:`fedray.tune.trainable.run_trial`. ``resume_sweep`` restores the Tuner from ``tune/``: finished
trials are kept as they are, unfinished and errored ones continue from their last checkpoint (trials
that failed on their config are finished for Tune and are not run again).

Output: quiet by default (:class:`fedray.tune.progress.SweepProgress`); ``verbose`` shows Tune's table
and the trials' own output. A resumed sweep keeps the output mode of its first session (Tune restores
the run config from ``tune/``).
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import pandas as pd
import ray
from ray import tune
from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

from fedray.config import ConfigError, RunConfig
from fedray.plugins import check_ray_imports, job_runtime_env, load_config, user_module_paths
from fedray.runtime.ray_start import is_local_ray_of_a_run, shutdown_ray
from fedray.tune.progress import SweepProgress
from fedray.layout import ERROR, META_FILE, PENDING, RUNNING, SAVED_CONFIG_FILE, SWEEP_FILE, TRIALS_FILE
from fedray.tune.results import SweepResults, read_table, set_meta_status, write_meta
from fedray.tune.schedulers import SchedulerState, make_scheduler
from fedray.tune.spec import SweepSpec, load_sweep, trial_cpus
from fedray.tune.summary import best_trial
from fedray.tune.trainable import run_trial, trial_resources
from fedray.tune.trust import TuneStateRecorder, record_tune_state, verify_tune_state

TUNE_DIR = "tune"


@dataclass
class SweepOutcome:
    """What :func:`run_sweep` and :func:`resume_sweep` return: how the sweep ended and, read from the
    sweep directory's files when asked for, its trials, its best trial and that trial's config."""

    sweep_dir: Path
    status: str  # meta.json's final status: "finished", or "failed" (interrupted, or every trial failed)
    num_errors: int  # trials that failed past max_failures, or on their config
    num_unfinished: int  # trials left PENDING/RUNNING by an interruption (continue with resume_sweep)

    @property
    def trials(self) -> pd.DataFrame:
        """``trials.parquet``: one row per trial (``trial_id``, ``status``, a column per swept key,
        ``best_metric``, ``best_round``, ``run_dir``, ``error``...; docs/tune.md)."""
        trials_file = self.sweep_dir / TRIALS_FILE
        return read_table(trials_file) if trials_file.is_file() else pd.DataFrame()

    @property
    def best_trial(self) -> pd.Series | None:
        """The best trial's row of :attr:`trials` by the sweep's metric (errored trials are never
        ranked), the one ``fedray tune`` prints; None when no trial reported a value."""
        return best_trial(self.sweep_dir)

    @property
    def best_config(self) -> RunConfig | None:
        """The best trial's complete run config (its ``config.yaml``), e.g. to run it again with more
        rounds: ``fedray.run_experiment(outcome.best_config)``; None when there is no best trial."""
        best = self.best_trial
        return None if best is None else load_config(self.sweep_dir / best["run_dir"] / SAVED_CONFIG_FILE)


def new_sweep_dir(spec: SweepSpec) -> Path:
    """Create the sweep directory and write the resolved ``sweep.yaml`` into it."""
    root = Path(spec.output.dir)
    name = f"{spec.name}-{datetime.now():%Y%m%d-%H%M%S}"
    sweep_dir, suffix = root / name, 1
    while sweep_dir.exists():
        sweep_dir, suffix = root / f"{name}-{suffix}", suffix + 1
    sweep_dir.mkdir(parents=True)
    (sweep_dir / SWEEP_FILE).write_text(spec.to_yaml())
    return sweep_dir


def experiment_dir(sweep_dir: Path) -> Path:
    """Tune's experiment directory inside the sweep directory."""
    return sweep_dir / TUNE_DIR / sweep_dir.name


def sweep_user_modules(spec: SweepSpec) -> list[str]:
    """The user code the trials name (algorithm.name, output.callbacks), which every trial must import."""
    configs = [spec.trial_config(values) for values in spec.trial_shapes()]
    return list(dict.fromkeys(path for config in configs for path in user_module_paths(config)))


def check_running_ray(spec: SweepSpec) -> None:
    """On a Ray that fedray did not start (a notebook's, a test session's), check before anything is
    written that the trials can import the user code: fedray cannot set that Ray's job runtime_env."""
    if ray.is_initialized():
        check_ray_imports(sweep_user_modules(spec))


def connect_ray(address: str | None, spec: SweepSpec, verbose: bool) -> tuple[bool, str | None]:
    """Connect to ``address``, or start a local Ray with room for at least one trial. Returns whether
    this call started the connection and the Ray dashboard's URL (None when Ray was already up).
    Quiet (not ``verbose``): the trials' output is not copied to this terminal (their errors are in
    ``trials.parquet``) and Ray logs warnings only. The local Ray a run started in this process (a
    notebook's ``run_experiment``) is stopped first: it would copy the trials' output here, and it
    is sized for that run."""
    if is_local_ray_of_a_run():
        shutdown_ray()
    if ray.is_initialized():
        return False, None
    output = {"log_to_driver": verbose, "logging_level": logging.INFO if verbose else logging.WARNING}
    address = address or os.environ.get("RAY_ADDRESS")  # set for a submitted job's entrypoint
    # Tune creates the trial actors without a runtime_env of ours: they inherit the job's, so user code
    # named by the trials (algorithm.name, output.callbacks) is shipped with the job (fedray.plugins).
    runtime_env = job_runtime_env(sweep_user_modules(spec))
    if address:
        context = ray.init(address=address, runtime_env=runtime_env, **output)
    else:
        largest_trial = max(trial_cpus(spec.trial_config(values), spec) for values in spec.trial_shapes())
        # address="local": never join another Ray that happens to run on this machine
        context = ray.init(address="local", num_cpus=max(os.cpu_count() or 1, math.ceil(largest_trial)), runtime_env=runtime_env, **output)
    url = context.dashboard_url or None
    return True, (url if url is None or "://" in url else f"http://{url}")


def _trial_dirname(trial) -> str:
    return trial.trial_id


def make_search(spec: SweepSpec) -> tuple[Any, int | None]:
    """The search algorithm and the ``TuneConfig.max_concurrent_trials`` that goes with it."""
    if spec.search.type == "optuna":
        from ray.tune.search.optuna import OptunaSearch

        return OptunaSearch(seed=spec.search.seed), spec.max_concurrent_trials
    from ray.tune.search import BasicVariantGenerator

    # Tune ignores TuneConfig.max_concurrent_trials for a BasicVariantGenerator: it takes the limit itself
    return BasicVariantGenerator(random_state=spec.search.seed, max_concurrent=spec.max_concurrent_trials or 0), None


def make_tune_config(spec: SweepSpec, scheduler: tune.schedulers.TrialScheduler) -> tune.TuneConfig:
    search, max_concurrent = make_search(spec)
    return tune.TuneConfig(
        metric=spec.metric,
        mode=spec.mode,
        scheduler=scheduler,
        search_alg=search,
        num_samples=spec.num_samples,
        max_concurrent_trials=max_concurrent,
        trial_dirname_creator=_trial_dirname,
        reuse_actors=spec.reuse_workers,  # a trial process stays warm for the next trial (fedray.tune.pool)
    )


def make_run_config(spec: SweepSpec, sweep_dir: Path, scheduler: tune.schedulers.TrialScheduler, verbose: bool) -> tune.RunConfig:
    results = SweepResults(sweep_dir, spec)
    callbacks = [results, SchedulerState(scheduler), TuneStateRecorder(sweep_dir, experiment_dir(sweep_dir))]
    # Tune's result.json/progress.csv, which its experiment analysis reads; not its TensorBoard logger
    # (see _tune_environment)
    callbacks += [CSVLoggerCallback(), JsonLoggerCallback()]
    if not verbose:
        callbacks.append(SweepProgress(results, spec.num_trials))
    return tune.RunConfig(
        name=sweep_dir.name,
        storage_path=str((sweep_dir / TUNE_DIR).resolve()),
        failure_config=tune.FailureConfig(max_failures=spec.max_failures),
        checkpoint_config=tune.CheckpointConfig(num_to_keep=None),  # tiny files; no forced snapshots
        callbacks=callbacks,
        verbose=2 if verbose else 0,
    )


def _trainable(spec: SweepSpec, sweep_dir: Path):
    return tune.with_resources(tune.with_parameters(run_trial, spec=spec, sweep_dir=str(sweep_dir.resolve())), trial_resources(spec))


@contextmanager
def _tune_environment(verbose: bool) -> Iterator[None]:
    """Tune's switches that are environment variables, set while a sweep runs in this process:
    no automatic TensorBoard logger (its event files hold no fedray metrics and its console hint
    names the wrong directory: each trial writes its own, see ``tensorboard_hint``), and, when
    quiet, Tune's older output engine, whose verbosity 0 prints nothing (the newer one always
    prints a configuration box), and none of the tracebacks Tune logs for a trial that fails by
    raising out of the trainable or by dying (a trial process or one of its workers killed: Ray's
    ``ActorDiedError``, 20 lines). A trial that fails deterministically (diverged, its config, the
    user's code) reports its error as a result instead (fedray.tune.trainable); any other failure is
    the errored trial's one-line ``error`` in the table ``fedray tune`` prints and in ``trials.parquet``,
    its whole trace in its ``error.txt`` under ``tune/``, and Tune still retries it (``max_failures``)."""
    quiet = {"RAY_AIR_NEW_OUTPUT": "0", "TUNE_PRINT_ALL_TRIAL_ERRORS": "0"}
    settings = {"TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1", **({} if verbose else quiet)}
    previous = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _fit(tuner: tune.Tuner, sweep_dir: Path, verbose: bool) -> SweepOutcome:
    with _tune_environment(verbose):
        tuner.fit()
    record_tune_state(sweep_dir, experiment_dir(sweep_dir))
    # Tune returns normally after Ctrl+C too: the writer's statuses tell an interrupted sweep apart
    trials_file = sweep_dir / TRIALS_FILE
    statuses = pd.read_parquet(trials_file, columns=["status"])["status"] if trials_file.is_file() else pd.Series([], dtype=str)
    num_errors = int((statuses == ERROR).sum())
    num_unfinished = int(statuses.isin([PENDING, RUNNING]).sum())
    status = "failed" if num_unfinished or statuses.empty or num_errors == len(statuses) else "finished"
    set_meta_status(sweep_dir, status)
    return SweepOutcome(sweep_dir=sweep_dir, status=status, num_errors=num_errors, num_unfinished=num_unfinished)


def _connect_and_fit(
    sweep_dir: Path, spec: SweepSpec, address: str | None, verbose: bool, make_tuner: Callable[[], tune.Tuner]
) -> SweepOutcome:
    """Connect to Ray, build the Tuner and fit it; anything that escapes (a failed connection or
    restore, an exception in Tune) leaves ``meta.json`` saying "failed", never "running"."""
    started_ray = False
    try:
        started_ray, dashboard_url = connect_ray(address, spec, verbose)
        set_meta_status(sweep_dir, "running", dashboard_url)
        return _fit(make_tuner(), sweep_dir, verbose)
    except BaseException:
        set_meta_status(sweep_dir, "failed")
        raise
    finally:
        if started_ray:
            ray.shutdown()


def run_sweep(spec: SweepSpec, address: str | None = None, verbose: bool = False) -> SweepOutcome:
    """Run the sweep ``spec`` (already validated by :func:`fedray.tune.spec.load_sweep`)."""
    check_running_ray(spec)
    sweep_dir = new_sweep_dir(spec)
    write_meta(sweep_dir, spec, datetime.now().astimezone().isoformat(timespec="seconds"), None, "running")

    def make_tuner() -> tune.Tuner:
        scheduler = make_scheduler(spec)
        return tune.Tuner(
            _trainable(spec, sweep_dir),
            param_space=spec.param_space(),
            tune_config=make_tune_config(spec, scheduler),
            run_config=make_run_config(spec, sweep_dir, scheduler, verbose),
        )

    return _connect_and_fit(sweep_dir, spec, address, verbose, make_tuner)


def resume_sweep(sweep_dir: str | Path, address: str | None = None, verbose: bool = False, trust_tune_state: bool = False) -> SweepOutcome:
    """Continue the sweep in ``sweep_dir`` without re-running its finished trials. Refuses a folder
    whose Tune state fedray did not record (:mod:`fedray.tune.trust`) unless ``trust_tune_state``.
    Tune keeps the search, scheduler and run config in ``tune/``; only the trainable is given again."""
    sweep_dir = Path(sweep_dir).resolve()
    if not (sweep_dir / META_FILE).is_file() or not (sweep_dir / SWEEP_FILE).is_file():
        raise ConfigError(None, f"{sweep_dir} is not a fedray sweep directory (it needs {META_FILE} and {SWEEP_FILE})", within=None)
    experiment = experiment_dir(sweep_dir)
    if not (experiment / "tuner.pkl").is_file():
        raise ConfigError(
            None, f"{sweep_dir} is not a resumable fedray sweep (it needs {TUNE_DIR}/{sweep_dir.name}/tuner.pkl)", within=None
        )
    if not trust_tune_state:
        verify_tune_state(sweep_dir, experiment)
    spec = load_sweep(sweep_dir / SWEEP_FILE)
    check_running_ray(spec)

    def make_tuner() -> tune.Tuner:
        return tune.Tuner.restore(str(experiment), _trainable(spec, sweep_dir), resume_unfinished=True, resume_errored=True)

    return _connect_and_fit(sweep_dir, spec, address, verbose, make_tuner)
