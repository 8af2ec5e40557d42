"""Run a sweep, or resume an interrupted one, with Ray Tune.

``run_sweep`` creates ``<output.dir>/<name>-<YYYYmmdd-HHMMSS>/`` (the sweep directory: ``sweep.yaml``,
``meta.json``, ``trials.parquet``, ``rounds.parquet``, ``trials/<trial_id>/``, ``tune/``), connects to
Ray (or starts a local Ray big enough for one trial) and runs a ``tune.Tuner`` whose trials are
:func:`fedray.tune.trainable.run_trial`. ``resume_sweep`` restores the Tuner from ``tune/``: finished
trials are kept as they are, unfinished and errored ones continue from their last checkpoint.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd
import ray
from ray import tune

from fedray.config import ConfigError
from fedray.plugins import check_ray_imports, job_runtime_env, user_module_paths
from fedray.tune.results import ERROR, PENDING, RUNNING, TRIALS_FILE, SweepResults, set_meta_status, write_meta
from fedray.tune.spec import SWEEP_FILE, SweepSpec, load_sweep, max_rounds, trial_cpus
from fedray.tune.trainable import run_trial, trial_resources

TUNE_DIR = "tune"


@dataclass
class SweepOutcome:
    sweep_dir: Path
    status: str  # meta.json's final status: "finished", or "failed" (interrupted, or every trial failed)
    num_errors: int  # trials that failed past max_failures
    num_unfinished: int  # trials left PENDING/RUNNING by an interruption (continue with resume_sweep)


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


def connect_ray(address: str | None, spec: SweepSpec) -> tuple[bool, str | None]:
    """Connect to ``address``, or start a local Ray with room for at least one trial. Returns whether
    this call started the connection and the Ray dashboard's URL (None when Ray was already up)."""
    configs = [spec.trial_config(values) for values in spec.trial_shapes()]
    # Tune creates the trial actors without a runtime_env of ours: they inherit the job's, so user code
    # named by the trials (algorithm.name, output.callbacks) is shipped with the job (fedray.plugins).
    user_modules = list(dict.fromkeys(path for config in configs for path in user_module_paths(config)))
    if ray.is_initialized():
        check_ray_imports(user_modules)
        return False, None
    address = address or os.environ.get("RAY_ADDRESS")  # set for a submitted job's entrypoint
    runtime_env = job_runtime_env(user_modules)
    if address:
        context = ray.init(address=address, runtime_env=runtime_env)
    else:
        largest_trial = max(trial_cpus(config, spec) for config in configs)
        # address="local": never join another Ray that happens to run on this machine
        context = ray.init(address="local", num_cpus=max(os.cpu_count() or 1, math.ceil(largest_trial)), runtime_env=runtime_env)
    url = context.dashboard_url or None
    return True, (url if url is None or "://" in url else f"http://{url}")


def _trial_dirname(trial) -> str:
    return trial.trial_id


def make_scheduler(spec: SweepSpec) -> tune.schedulers.TrialScheduler:
    if spec.scheduler.type == "fifo":
        return tune.schedulers.FIFOScheduler()
    return tune.schedulers.ASHAScheduler(
        time_attr="round",  # the engine's round, which survives restores (Tune's iteration count restarts)
        max_t=max_rounds(spec),
        grace_period=spec.scheduler.grace_period,
        reduction_factor=spec.scheduler.reduction_factor,
    )


def make_search(spec: SweepSpec) -> tuple[Any, int | None]:
    """The search algorithm and the ``TuneConfig.max_concurrent_trials`` that goes with it."""
    if spec.search.type == "optuna":
        from ray.tune.search.optuna import OptunaSearch

        return OptunaSearch(seed=spec.search.seed), spec.max_concurrent_trials
    from ray.tune.search import BasicVariantGenerator

    # Tune ignores TuneConfig.max_concurrent_trials for a BasicVariantGenerator: it takes the limit itself
    return BasicVariantGenerator(random_state=spec.search.seed, max_concurrent=spec.max_concurrent_trials or 0), None


def make_tune_config(spec: SweepSpec) -> tune.TuneConfig:
    search, max_concurrent = make_search(spec)
    return tune.TuneConfig(
        metric=spec.metric,
        mode=spec.mode,
        scheduler=make_scheduler(spec),
        search_alg=search,
        num_samples=spec.num_samples,
        max_concurrent_trials=max_concurrent,
        trial_dirname_creator=_trial_dirname,
    )


def make_run_config(spec: SweepSpec, sweep_dir: Path) -> tune.RunConfig:
    return tune.RunConfig(
        name=sweep_dir.name,
        storage_path=str((sweep_dir / TUNE_DIR).resolve()),
        failure_config=tune.FailureConfig(max_failures=spec.max_failures),
        checkpoint_config=tune.CheckpointConfig(num_to_keep=None),  # tiny files; no forced snapshots
        callbacks=[SweepResults(sweep_dir, spec)],
        verbose=1,
    )


def _trainable(spec: SweepSpec, sweep_dir: Path):
    return tune.with_resources(
        tune.with_parameters(run_trial, spec=spec, sweep_dir=str(sweep_dir.resolve())), trial_resources(spec)
    )


def _fit(tuner: tune.Tuner, sweep_dir: Path, started_ray: bool) -> SweepOutcome:
    try:
        tuner.fit()
    except BaseException:
        set_meta_status(sweep_dir, "failed")
        raise
    finally:
        if started_ray:
            ray.shutdown()
    # Tune returns normally after Ctrl+C too: the writer's statuses tell an interrupted sweep apart
    trials_file = sweep_dir / TRIALS_FILE
    statuses = pd.read_parquet(trials_file, columns=["status"])["status"] if trials_file.is_file() else pd.Series([], dtype=str)
    num_errors = int((statuses == ERROR).sum())
    num_unfinished = int(statuses.isin([PENDING, RUNNING]).sum())
    status = "failed" if num_unfinished or statuses.empty or num_errors == len(statuses) else "finished"
    set_meta_status(sweep_dir, status)
    return SweepOutcome(sweep_dir=sweep_dir, status=status, num_errors=num_errors, num_unfinished=num_unfinished)


def run_sweep(spec: SweepSpec, address: str | None = None) -> SweepOutcome:
    """Run the sweep ``spec`` (already validated by :func:`fedray.tune.spec.load_sweep`)."""
    started_ray, dashboard_url = connect_ray(address, spec)
    sweep_dir = new_sweep_dir(spec)
    write_meta(sweep_dir, spec, datetime.now().astimezone().isoformat(timespec="seconds"), dashboard_url, "running")
    tuner = tune.Tuner(
        _trainable(spec, sweep_dir),
        param_space=spec.param_space(),
        tune_config=make_tune_config(spec),
        run_config=make_run_config(spec, sweep_dir),
    )
    return _fit(tuner, sweep_dir, started_ray)


def resume_sweep(sweep_dir: str | Path, address: str | None = None) -> SweepOutcome:
    """Continue the sweep in ``sweep_dir`` without re-running its finished trials."""
    sweep_dir = Path(sweep_dir).resolve()
    experiment = sweep_dir / TUNE_DIR / sweep_dir.name
    if not (sweep_dir / SWEEP_FILE).is_file() or not tune.Tuner.can_restore(str(experiment)):
        raise ConfigError(f"{sweep_dir} is not a resumable fedray sweep (it needs {SWEEP_FILE} and {TUNE_DIR}/{sweep_dir.name}/)")
    spec = load_sweep(sweep_dir / SWEEP_FILE)
    started_ray, dashboard_url = connect_ray(address, spec)
    set_meta_status(sweep_dir, "running", dashboard_url)
    # Tune keeps the search, scheduler and run config in tune/; only the trainable is given again
    tuner = tune.Tuner.restore(str(experiment), _trainable(spec, sweep_dir), resume_unfinished=True, resume_errored=True)
    return _fit(tuner, sweep_dir, started_ray)
