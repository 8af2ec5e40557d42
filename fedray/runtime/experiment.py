"""The driver: validate, load data, reserve resources, start the server, loop over rounds.

Everything that can fail on bad input (config, data directory, client counts) fails before Ray
starts. The driver holds no model-sized state between rounds: the server actor does.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import ray
import torch
from ray.exceptions import RayActorError
from ray.util.placement_group import NODE_ID_LABEL_KEY, PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from fedray.algorithms import Algorithm, algorithm_label, get_algorithm_class
from fedray.algorithms.vectorized import check_vectorizable, vectorized_path
from fedray.algorithms.requirements import is_personalised, requirement_problems
from fedray.algorithms.uploads import config_error
from fedray.cluster.placement import WorkerPlacement
from fedray.models import FedModel, parameter_counts
from fedray.config import ConfigError, RunConfig, save_config, saved_config_path
from fedray.config.privacy import default_delta, population_size
from fedray.data import FederatedDataset, build_federated_dataset
from fedray.layout import RUN_INFO_FILE, SAVED_CONFIG_FILE, STOPPED_FILE, SUMMARY_FILE, list_checkpoints
from fedray.plugins import build_config, load_config, ship_user_modules, validate_plugins
from fedray.runtime.checkpoint import load_latest_checkpoint, save_checkpoint
from fedray.runtime.errors import RunError, RunInterrupted, TrainingDiverged, UserCodeError, first_line, innermost_cause
from fedray.runtime.engine import RoundEngine
from fedray.runtime.pool import LocalPool
from fedray.runtime.resume import ResumeRecord, check_resumable, check_unfinished, config_changes, resume_command
from fedray.runtime.ray_start import check_address, check_gpu_available, check_local_resources, ensure_ray, starts_local_ray, uses_ray
from fedray.runtime.server import RemoteServer, Server, WorkerPoolError, start_worker
from fedray.runtime.upload_path import PrivacyBudgetExhausted, ServerUploadPath
from fedray.runtime.state_store import (
    ClientStateError,
    ClientStateIOError,
    ClientStateStore,
    LocationClaim,
    claim_location,
    client_state_location,
    location_outside_run_dir,
    nodes_missing_location,
)
from fedray.runtime.user_code import user_callbacks
from fedray.runtime.worker import build_algorithm
from fedray.systems import ROW_KEYS as SYSTEM_ROW_KEYS
from fedray.systems.compression import compression_problems, keeps_client_state
from fedray.systems.fedbuff import check_fedbuff
from fedray.tracking import (
    Callback,
    HealthMonitor,
    MetricsParquet,
    Plots,
    ProgressBar,
    RunContext,
    TensorBoardLogger,
)
from fedray.tracking.atomic import DiskFullError
from fedray.tracking.metrics_file import check_metrics_cover
from fedray.tracking.sync import StorageSync, is_uri, staging_root
from fedray.tasks import task_class

logger = logging.getLogger(__name__)
#: The round row's systems-model counts a run's summary sums (:data:`fedray.systems.ROW_KEYS` but the clock).
SYSTEMS_TOTALS = tuple(key for key in SYSTEM_ROW_KEYS if key != "sim_time")


@dataclass
class RunSummary:
    """What :func:`run_experiment` returns (also written to ``summary.json``)."""

    run_dir: str
    rounds: int
    final_test_accuracy: float | None
    best_test_accuracy: float | None
    best_round: int | None  # the round of the best headline metric
    seconds: float
    ray_startup_seconds: float
    first_round_seconds: float | None  # from the call to the end of its first round (None: no round ran)
    final_metrics: dict[str, Any]
    backend: str = "ray"  # where the workers ran: "local" (in the driver process) or "ray"
    headline: str = "test_accuracy"  # the task's headline metric, test_<headline> (test_rmse, test_perplexity...)
    headline_mode: str = "max"  # whether a larger headline is better ("max") or a smaller one ("min")
    final_headline: float | None = None
    best_headline: float | None = None
    #: δ of the run's (ε, δ) guarantee when privacy is on (ε: ``final_metrics["dp_epsilon"]``, the accountant's after the last round)
    dp_delta: float | None = None
    #: the systems model's client counts and bytes summed over the rounds (selected, aggregated, dropped, late,
    #: bytes_down, bytes_up; the simulated time is ``final_metrics["sim_time"]``): empty without the systems model
    systems_totals: dict[str, int] = field(default_factory=dict)


@dataclass
class WarmServer:
    """A server actor and its workers kept alive from one run to the next in the same placement group
    (a Tune trial process's pool, :mod:`fedray.tune.pool`), with the dataset they hold. A run given
    one uses ``data`` as loaded and ``data_ref`` as put, resets ``server`` for its config (or starts
    it and sets it here when None) and leaves it alive: its owner kills it."""

    data: FederatedDataset
    data_ref: ray.ObjectRef
    server: Any = None


class Checkpointer(Callback):
    """Writes a checkpoint every ``checkpoint.every`` rounds and after the last round."""

    def on_round_end(self, run: RunContext, row: dict[str, Any], client_rows: list[dict[str, Any]]) -> None:
        round = row["round"]
        if round % run.config.checkpoint.every == 0 or round == run.config.train.rounds:
            contents = run.server.checkpoint_state()
            save_checkpoint(run.run_dir, round, {**contents, "config": run.config.to_dict()}, run.config.checkpoint.keep)
            run.server.checkpoint_written()


def default_callbacks(config: RunConfig, progress: bool, on_ray: bool = True) -> list[Callback]:
    """``on_ray``: the workers are Ray actors, whose nodes ``workers.json`` records."""
    callbacks: list[Callback] = [MetricsParquet(), Checkpointer(), *([WorkerPlacement()] if on_ray else [])]
    if config.output.tensorboard:
        callbacks.append(TensorBoardLogger())
    if config.output.plots:
        callbacks.append(Plots())
    if progress:
        callbacks.append(ProgressBar())
    callbacks.append(HealthMonitor())  # after the bar, which shows its warnings above itself
    return callbacks + user_callbacks(config)  # output.callbacks, last, each isolated from the run


def new_run_dir(config: RunConfig) -> Path:
    """The directory of a new run: ``output.dir/output.name``, which must not exist yet (a second run
    would mix its checkpoints and metrics with the first's), or ``output.dir/<algorithm>-<dataset>-<time>``
    with a numeric suffix if that exists (a user's ``package.module:Name`` dataset as ``package.module.Name``)."""
    label = algorithm_label(config.algorithm.name)  # a plug-in's `name`, not its module:Class reference
    dataset = config.data.name.replace(":", ".")  # package.module:Name: no ':' in a path (Windows, scp, PATH-like lists)
    name = config.output.name or f"{label}-{dataset}-{datetime.now():%Y%m%d-%H%M%S}"
    root = staging_root(config.output) if is_uri(config.output.dir) else Path(config.output.dir)
    existing = next(path for path in (root, *root.absolute().parents) if path.exists())
    if not existing.is_dir():
        raise ConfigError("output.dir", f"{existing} is a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError("output.dir", f"cannot create or write {root} (no permission on {existing})")
    run_dir = root / name
    if config.output.name is not None and run_dir.exists():
        raise ConfigError(
            "output.name",
            f"the run directory {run_dir} already exists; choose another "
            f"output.name, delete it, or continue it with `fedray run --resume {run_dir}`",
        )
    suffix = 1
    while config.output.name is None and run_dir.exists():  # a named run never takes a suffix, even if
        run_dir = root / f"{name}-{suffix}"  # another run created its directory since the check above
        suffix += 1
    return run_dir


def claim_new_run_dir(config: RunConfig) -> tuple[Path, list[Path]]:
    """Create the directory :func:`new_run_dir` chooses, atomically: of two runs started together
    with the same ``output.dir/output.name`` one gets it and the other is refused as if it had found
    it (an unnamed run takes the next suffix). Returns the run directory and the directories created
    (the run directory first, then its new parents), to remove if the run stops before its first round."""
    while True:
        run_dir = new_run_dir(config)
        new_parents = [directory for directory in run_dir.parents if not directory.exists()]
        try:
            run_dir.parent.mkdir(parents=True, exist_ok=True)
            run_dir.mkdir()
        except FileExistsError:
            continue  # another run took it since new_run_dir looked
        except OSError as error:  # e.g. under /proc, or a read-only mount that os.access did not tell
            raise ConfigError("output.dir", f"cannot create {run_dir} ({error.strerror or error})") from None
        return run_dir, [run_dir, *new_parents]


def prepare_data(config: RunConfig, data: FederatedDataset | None = None) -> FederatedDataset:
    """Load and partition the data and build the algorithm and its model once, so that impossible
    client counts, a model that does not fit the data and the algorithm's own checks (which need the
    dataset, e.g. its model's taps) fail as config errors before Ray starts. ``data``: the dataset of
    ``config.data`` and ``config.seed`` when the caller has it already (a sweep validating many trials
    of one partition). The model must map a batch of the data to logits (a user's model, with its
    ``model.init`` weights) and meet what the algorithm ``requires`` (BatchNorm layers, per-client test
    splits...)."""
    from fedray.models.checks import check_model_output
    from fedray.systems import check_systems

    check_synthetic_size(config)
    if data is None:
        try:
            data = build_federated_dataset(config.data, config.seed)
        except ConfigError:
            raise
        except ValueError as error:  # e.g. a test split that leaves fewer samples than classes
            raise ConfigError("data", first_line(error)) from None
    if config.data.partition == "shards":
        task = task_class(config.data.task)
        if task.class_labels:
            groups, what = data.info.num_classes, "classes"
        else:  # the groups the partition skews over (a regression's target deciles)
            labels = task.partition_labels(data.train.y)
            groups, what = (0 if labels is None else len(np.unique(labels))), f"label groups (data.task={config.data.task})"
        if config.data.classes_per_client > groups:
            raise ConfigError(
                "data.classes_per_client", f"{config.data.classes_per_client} is more than the {groups} {what} of {config.data.name}"
            )
    if (data.clients.sizes == 0).any():
        empty = int((data.clients.sizes == 0).sum())
        raise ConfigError(
            "data.num_clients", f"{empty} of {data.num_clients} clients got no training samples; use fewer clients or another partition"
        )
    try:
        algorithm = build_algorithm(config, data)
    except ConfigError:
        raise
    except ValueError as error:
        raise ConfigError(None, first_line(error)) from None
    try:
        model = algorithm.build_model(algorithm.model_key(None))
        check_model_output(model, data.info, config.model.name, per_position=not algorithm.task.per_sample_outputs)
    except ConfigError:  # names its own key (model.init, model.classifier)
        raise
    except ValueError as error:
        raise ConfigError("model.name", f"{first_line(error)} (data.name={config.data.name} has {data.info.describe()})") from None
    check_algorithm(algorithm, model)
    check_vectorizable(config, algorithm, model)  # train.vectorize=on: the real model, also one the meta device cannot build
    check_systems(config, data, algorithm, model)  # device and trace files, an impossible deadline
    if config.privacy.enabled:
        ServerUploadPath(config, algorithm)  # a noise multiplier calibrated from privacy.target_epsilon that adaptive clipping cannot use
    return data


def check_algorithm(algorithm: Algorithm, model: FedModel) -> None:
    """One :class:`ConfigError` listing every problem of ``algorithm`` with its config and built
    ``model``, so that a config with several is refused once: its unmet requirements and the uploads
    privacy/robust cannot handle (:func:`fedray.algorithms.requirements.requirement_problems`), and what
    ``systems.compression`` (:func:`fedray.systems.compression.compression_problems`) and ``train.mode:
    async`` (:func:`fedray.systems.fedbuff.check_fedbuff`) need of its uploads."""
    problems = requirement_problems(algorithm, model) + compression_problems(algorithm.config, algorithm)
    try:
        check_fedbuff(algorithm.config, algorithm)
    except ConfigError as error:
        problems.append((error.key, error.message))
    if problems:
        raise config_error(problems)


def check_synthetic_size(config: RunConfig) -> None:
    """Refuse a synthetic dataset that would not fit in half of the machine's memory (it is
    generated in float32 before being stored as uint8)."""
    if config.data.name != "synthetic":
        return
    spec = config.data.synthetic
    needed = max(spec.num_train, spec.num_test) * spec.channels * spec.image_size**2 * 5  # float32 + uint8
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if needed > memory // 2:
        raise ConfigError(
            "data.synthetic",
            f"{spec.num_train:,} + {spec.num_test:,} images of "
            f"{spec.channels}×{spec.image_size}×{spec.image_size} need about {needed / 1e9:.1f} GB to generate; "
            f"this machine has {memory / 1e9:.1f} GB",
        )


def with_absolute_state_dir(config: RunConfig) -> RunConfig:
    """``config`` with a relative local ``output.client_state_dir`` made absolute (workers resolve
    paths in their own working directory)."""
    state_dir = config.output.client_state_dir
    if state_dir is None or is_uri(state_dir) or Path(state_dir).is_absolute():
        return config
    config = config.model_copy(deep=True)
    config.output.client_state_dir = str(Path(state_dir).absolute())
    return config


def _state_key(config: RunConfig) -> str:
    return "output.client_state_dir" if config.output.client_state_dir is not None else "output.dir"


def open_client_state_location(config: RunConfig, run_dir: Path) -> str | None:
    """The client state location of a run with per-client state (the algorithm's, or error-feedback
    residuals; None for the others), after checking that it opens: a bad URI fails as a config error,
    before Ray starts."""
    if not keeps_client_state(config, get_algorithm_class(config.algorithm.name)):
        return None
    location = client_state_location(config.output, run_dir)
    try:
        ClientStateStore(location)
    except (ClientStateError, OSError) as error:
        raise ConfigError(_state_key(config), str(error)) from None
    return location


def claim_client_state_location(config: RunConfig, location: str | None, run_dir: Path, resuming: bool) -> LocationClaim | None:
    """The run's claim on its client state location when that lies outside the run directory (None
    otherwise: the run directory is the run's own); a location holding another run's state fails
    as a config error, before Ray starts (:func:`~fedray.runtime.state_store.claim_location`)."""
    if location is None or not location_outside_run_dir(config.output):
        return None
    try:
        return claim_location(location, run_dir, resuming)
    except (ClientStateError, OSError) as error:
        raise ConfigError(_state_key(config), str(error)) from None


def require_shared_client_state(config: RunConfig, location: str) -> None:
    """On a multi-node cluster every node must read what the driver writes at the client state
    location; otherwise fail before the first round instead of when a client moves to another node."""
    key = _state_key(config)
    try:
        missing = nodes_missing_location(location)
    except (ClientStateError, OSError) as error:
        raise ConfigError(key, str(error)) from None
    if missing:
        raise ConfigError(
            key,
            f"{config.algorithm.name} keeps per-client state in {location}, which is node-local: "
            f"node(s) {', '.join(missing)} cannot read a file written there. On a multi-node cluster set "
            "output.client_state_dir (or output.dir) to storage every node reaches: a path every node mounts at "
            "the same place, or an object-store URI such as s3://BUCKET/fedray-state",
        )


def reserve_resources(config: RunConfig) -> tuple[PlacementGroup, int]:
    """A placement group with the server's bundle (if it reserves CPUs) and one bundle per worker;
    returns it and the index of the first worker bundle (docs/architecture.md, principle 8).

    The worker bundles follow ``resources.placement_strategy``; the server's bundle is pinned to the
    driver's node (see :func:`server_scheduling`)."""
    resources = config.resources
    worker_bundle = {"CPU": resources.cpus_per_worker}
    if resources.gpus_per_worker > 0:
        worker_bundle["GPU"] = resources.gpus_per_worker
    server_bundles = [{"CPU": resources.server_cpus}] if resources.server_cpus > 0 else []
    on_driver_node = {NODE_ID_LABEL_KEY: ray.get_runtime_context().get_node_id()}
    group = placement_group(
        server_bundles + [dict(worker_bundle) for _ in range(resources.num_workers)],
        strategy=resources.placement_strategy,
        bundle_label_selector=[on_driver_node for _ in server_bundles] + [{} for _ in range(resources.num_workers)],
    )
    try:
        ray.get(group.ready(), timeout=120)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(group)
        raise RunError(
            f"could not reserve {resources.num_workers} worker(s) × {worker_bundle} within 120 s; "
            f"the cluster has {ray.cluster_resources()}. Lower resources.num_workers / cpus_per_worker / gpus_per_worker."
        ) from None
    return group, len(server_bundles)


def server_scheduling(group: PlacementGroup, first_worker_bundle: int) -> Any:
    """Where the server actor runs: in the group's bundle 0 when the group has a server bundle
    (``first_worker_bundle > 0``: :func:`reserve_resources` pins it to the driver's node, a Tune
    trial's driver runs in it), else (it reserves no resources) on the driver's node.

    So the server shares the driver's node: a lost worker node costs only the workers on it, which the
    server replaces (``resources.max_worker_restarts``) in their bundles, which Ray reschedules onto
    the surviving nodes where they fit.
    """
    if first_worker_bundle > 0:
        return PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0)
    return NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)


def run_experiment(
    config: RunConfig | Mapping[str, Any],
    *,
    run_dir: str | Path | None = None,
    resume: bool = False,
    address: str | None = None,
    callbacks: list[Callback] | None = None,
    extra_callbacks: list[Callback] = (),
    progress: bool = True,
    placement: tuple[PlacementGroup, int] | None = None,
    warm: WarmServer | None = None,
) -> RunSummary:
    """Run (or, with ``resume``, continue) one federated simulation.

    The workers run where ``resources.backend`` says (:func:`~fedray.runtime.ray_start.uses_ray`): in
    this process on a :class:`LocalPool`, or as Ray actors next to a server actor. ``placement`` lets a
    caller that already holds a placement group (a Ray Tune trial) pass it with the index of the first
    worker bundle; otherwise one is reserved here. ``warm``: a server (and dataset) kept by such a
    caller from its previous run with the same resources in that group, see :class:`WarmServer`. Both
    imply Ray. ``config`` may be a plain mapping of sections, validated as :func:`fedray.build_config` does.
    """
    started = time.perf_counter()
    if isinstance(config, Mapping):  # a notebook's dict: validated, a bad key is a ConfigError naming it
        config = build_config(dict(config))
    elif not isinstance(config, RunConfig):
        raise TypeError(
            f"run_experiment takes a RunConfig or a mapping of config sections, not a {type(config).__name__}; "
            "fedray.load_config(path) reads a YAML file"
        )
    config = with_absolute_state_dir(validate_plugins(config))
    check_address(address)
    on_ray = placement is not None or warm is not None or uses_ray(config.resources, address)
    storage_sync = StorageSync(config.output.dir) if is_uri(config.output.dir) else None
    data = prepare_data(config, None if warm is None else warm.data)
    # built before the run directory exists: a user callback whose __init__ raises leaves nothing behind
    callbacks = (default_callbacks(config, progress, on_ray) if callbacks is None else callbacks) + list(extra_callbacks)
    if run_dir is None:
        run_dir, created_dirs = claim_new_run_dir(config)
    else:
        run_dir = Path(run_dir)
        created_dirs = [d for d in (run_dir, *run_dir.parents) if not d.exists()]  # run dir first, then new parents
    created = bool(created_dirs)  # removed again if the run stops before its first round
    try:
        checkpoint = load_latest_checkpoint(run_dir) if resume else None
        if checkpoint is not None:
            check_metrics_cover(run_dir, int(checkpoint["round"]))
        state_location = open_client_state_location(config, run_dir)  # a bad URI fails here, before Ray
        state_claim = claim_client_state_location(config, state_location, run_dir, resume)
        if not on_ray:
            check_gpu_available(config.resources)
        elif starts_local_ray(address):
            check_local_resources(config)
        ray_startup_seconds = ensure_ray(address, config) if on_ray else 0.0
        if state_location is not None and on_ray:
            require_shared_client_state(config, state_location)
        group, first_worker_bundle = placement if placement is not None else reserve_resources(config) if on_ray else (None, 0)
    except BaseException:
        if created:
            _remove_created(created_dirs)
        raise
    run_dir.mkdir(parents=True, exist_ok=True)
    save_config(config, run_dir / SAVED_CONFIG_FILE)
    write_run_info(config, run_dir, data)
    (run_dir / STOPPED_FILE).unlink(missing_ok=True)  # started again: no longer stopped
    start_round = int(checkpoint["round"]) if checkpoint is not None else 0
    run = RunContext(config=config, run_dir=run_dir, data=data, server=None, start_round=start_round)
    if storage_sync is not None:
        callbacks.append(storage_sync)
    actor: Any = None  # the server actor (Ray backend)
    workers: list[Any] = []
    first_round_seconds: float | None = None
    budget_spent: BaseException | None = None  # privacy.target_epsilon would be passed by the next round
    try:
        if state_claim is not None:
            state_claim.record()
        if on_ray:
            actor, workers = start_server(config, data, str(run_dir.resolve()), group, first_worker_bundle, warm)
            run.server = RemoteServer(actor)
        else:
            local_dir = str(run_dir.resolve())
            run.server = RoundEngine(config, data, local_dir, LocalPool(config, data, local_dir))
        if checkpoint is not None:
            run.server.load_checkpoint_state(checkpoint)
            logger.info("resuming %s from round %d", run_dir, start_round)
        for callback in callbacks:
            callback.on_run_start(run)
        for round in range(start_round + 1, config.train.rounds + 1):
            try:
                result = run.server.run_round(round)
            except PrivacyBudgetExhausted as error:  # a planned end: the rounds so far are the run's, kept as a finished run's
                budget_spent = innermost_cause(error)
                break
            if first_round_seconds is None:
                first_round_seconds = time.perf_counter() - started
            check_round(config, result["round"])
            run.history.append(result["round"])
            for callback in callbacks:  # each gets its own copies: one that edits them changes no record
                callback.on_round_end(run, dict(result["round"]), [dict(client) for client in result["clients"]])
        for callback in callbacks:
            callback.on_run_end(run)
    except KeyboardInterrupt:
        write_stopped(run)
        raise RunInterrupted(f"interrupted; {_resume_hint(run, created)}") from None
    except UserCodeError as error:  # raised in a worker or the server actor: Ray wraps it
        raise innermost_cause(error).with_hint(_resume_hint(run, created)) from None
    except WorkerPoolError as error:  # raised in the server actor: Ray wraps it, the message is its cause's
        raise RunError(f"{first_line(getattr(error, 'cause', error))}; {_resume_hint(run, created)}") from None
    except RayActorError as error:  # the server actor itself (its node, or the process) died
        raise RunError(f"the server actor died ({first_line(error)}); {_resume_hint(run, created)}") from None
    except DiskFullError as error:
        raise RunError(f"{error}; free some space, then {_resume_hint(run, created)}") from None
    except ClientStateIOError as error:  # raised in a worker (Ray wraps it): the state location failed mid-run
        raise RunError(f"{innermost_cause(error)}; once it works again, {_resume_hint(run, created)}") from None
    finally:
        if on_ray and warm is None:
            _release(actor, workers, group if placement is None else None)
        # else the warm pool's server and workers outlive the run (fedray.tune.pool releases them)
        removed = created and not run.history and not list_checkpoints(run_dir)
        if removed:
            if state_claim is not None:
                state_claim.release()
            _remove_created(created_dirs)  # failed before its first round: nothing to keep

    if removed:  # only a privacy budget that round 1 would already pass ends a new run here with no round
        raise PrivacyBudgetExhausted(f"{budget_spent}; it stopped before its first round, so nothing was kept")
    summary = summarize(run, time.perf_counter() - started, ray_startup_seconds, first_round_seconds, "ray" if on_ray else "local")
    (run_dir / SUMMARY_FILE).write_text(json.dumps(asdict(summary), indent=2))
    if storage_sync is not None:
        storage_sync.sync(run_dir)
    if budget_spent is not None:
        raise budget_spent
    return summary


def start_server(
    config: RunConfig,
    data: FederatedDataset,
    run_dir: str,
    group: PlacementGroup,
    first_worker_bundle: int,
    warm: WarmServer | None,
) -> tuple[Any, list[Any]]:
    """The server actor of a run on Ray and the worker actors started for it (none when ``warm``
    has a server, which is reset for this run instead and keeps its workers)."""
    data_ref = ray.put(data) if warm is None else warm.data_ref  # the only copy: the server and every worker read it
    if warm is not None and warm.server is not None:
        ray.get(warm.server.reset.remote(config.to_dict(), [data_ref], run_dir))
        return warm.server, []
    server_options: dict[str, Any] = {"num_cpus": config.resources.server_cpus, "max_concurrency": 1}
    server_options["scheduling_strategy"] = server_scheduling(group, first_worker_bundle)
    runtime_env = ship_user_modules(config)  # user code named by the config; the server's replacement workers inherit it
    if runtime_env is not None:
        server_options["runtime_env"] = runtime_env
    # The workers boot (import torch, take their copy of the data) while the server does.
    workers = [
        start_worker(config, i, data_ref, run_dir, group, first_worker_bundle, runtime_env) for i in range(config.resources.num_workers)
    ]
    actor = ray.remote(Server).options(**server_options).remote(config.to_dict(), [data_ref], run_dir, group, first_worker_bundle, workers)
    if warm is not None:
        warm.server = actor
    return actor, workers


def write_run_info(config: RunConfig, run_dir: Path, data: FederatedDataset) -> None:
    """``run_info.json``, for readers that must not import the algorithms (the dashboard marks
    personalised rows beside global ones): the algorithm's label; whether its results are personalised
    (each client's own model on its held-out split); the task, its headline metric and direction; the
    model's parameters and those clients train and upload (fewer under ``model.freeze`` or
    ``model.adapters``); how workers train a cohort (``"vectorized"`` or ``"loop: <reason>"``); and, for
    a table, the columns read as inputs, targets and client ids."""
    algorithm = build_algorithm(config, data)
    task = algorithm.task
    try:
        with torch.device("meta"):  # shapes only: no memory, no draw from the global RNG
            model = algorithm.build_model(algorithm.model_key(None))
    except Exception:  # noqa: BLE001 - a model whose loading needs real tensors (prepare_data built it once already)
        with torch.random.fork_rng():
            model = algorithm.build_model(algorithm.model_key(None))
    info = {
        "algorithm": algorithm_label(config.algorithm.name),
        "evaluation": "personalised" if is_personalised(type(algorithm)) else "global",
        "task": config.data.task,
        "headline": f"test_{task.headline}",
        "headline_mode": task.mode,
        **parameter_counts(model),
        "training": vectorized_path(config, algorithm, model),
        **({"columns": {role: list(names) for role, names in data.info.columns.items()}} if data.info.columns else {}),
    }
    (run_dir / RUN_INFO_FILE).write_text(json.dumps(info, indent=2))
    if config.train.vectorize != "off":  # auto says once which path the run took
        logger.info("train.vectorize=%s: clients train %s", config.train.vectorize, info["training"])


def check_round(config: RunConfig, row: dict[str, Any]) -> None:
    """Stop a run whose every client update of a round was non-finite: the model is no longer being
    trained, and carrying on would end "successfully" with an untrained model."""
    if row["clients"] > 0 and row["excluded_updates"] >= row["clients"]:
        raise TrainingDiverged(
            f"round {row['round']}: all {row['clients']} client updates were non-finite (NaN/inf) and excluded, so "
            f"training diverged; start again with a lower train.lr (now {config.train.lr:g}), a train.grad_clip, "
            "or a smaller algorithm weight",
            row["round"],
        )


def write_stopped(run: RunContext) -> None:
    """``stopped.json``: the user stopped the run (Ctrl-C, SIGTERM) after its last round, so readers such as
    the dashboard show it as stopped rather than crashed. Removed with the run directory when nothing was kept."""
    last_round = run.history[-1]["round"] if run.history else run.start_round
    stopped = {"round": last_round, "stopped_at": datetime.now().astimezone().isoformat(timespec="seconds")}
    try:
        (run.run_dir / STOPPED_FILE).write_text(json.dumps(stopped, indent=2))
    except OSError:  # a full or gone disk must not hide the interruption itself
        pass


def _resume_hint(run: RunContext, created: bool) -> str:
    """What the user can do with the run directory after a failure."""
    if created and not run.history and not list_checkpoints(run.run_dir):
        return "it stopped before its first round, so nothing was kept"
    checkpoints = list_checkpoints(run.run_dir)
    since = f"its checkpoint of round {checkpoints[-1][0]}" if checkpoints else "round 1"
    return f"continue it from {since} with `{resume_command(run.run_dir)}`"


def _remove_created(directories: list[Path]) -> None:
    """Remove the run directory and the parents this run created, unless another run has put
    something in a parent since."""
    shutil.rmtree(directories[0], ignore_errors=True)
    for parent in directories[1:]:
        try:
            parent.rmdir()
        except OSError:
            break


def _release(server: Any, workers: list[Any], group: PlacementGroup | None) -> None:
    """Kill the run's actors and remove its placement group: the workers the driver started and the
    server's replacements for those that died (a dead server's replacements are gone with it: Ray
    ends the actors an actor created when it dies)."""
    if server is not None:
        try:
            workers = [*workers, *RemoteServer(server).worker_handles(timeout=60)]
        except (RayActorError, ray.exceptions.GetTimeoutError):
            pass
    for worker in dict.fromkeys(workers):
        ray.kill(worker)
    if server is not None:
        ray.kill(server)
    if group is not None:
        remove_placement_group(group)


def summarize(run: RunContext, seconds: float, ray_startup_seconds: float, first_round_seconds: float | None, backend: str) -> RunSummary:
    task = task_class(run.config.data.task)
    headline = f"test_{task.headline}"
    final = run.history[-1] if run.history else {}

    def best_of(metric: str, mode: str) -> dict[str, Any] | None:
        evaluated = [row for row in run.history if row.get(metric) is not None]
        return (max if mode == "max" else min)(evaluated, key=lambda row: row[metric], default=None)

    best_accuracy, best = best_of("test_accuracy", "max"), best_of(headline, task.mode)
    return RunSummary(
        run_dir=str(run.run_dir),
        rounds=int(final.get("round", 0)),
        final_test_accuracy=final.get("test_accuracy"),
        best_test_accuracy=None if best_accuracy is None else best_accuracy["test_accuracy"],
        best_round=None if best is None else best["round"],
        headline=headline,
        headline_mode=task.mode,
        final_headline=final.get(headline),
        best_headline=None if best is None else best[headline],
        seconds=seconds,
        ray_startup_seconds=ray_startup_seconds,
        first_round_seconds=first_round_seconds,
        final_metrics=final,
        backend=backend,
        dp_delta=privacy_delta(run.config),
        systems_totals={key: sum(int(row.get(key) or 0) for row in run.history) for key in SYSTEMS_TOTALS if key in final},
    )


def privacy_delta(config: RunConfig) -> float | None:
    """δ of the run's privacy guarantee (the accountant's: ``privacy.delta`` or its default); None when privacy is off."""
    if not config.privacy.enabled:
        return None
    return config.privacy.delta if config.privacy.delta is not None else default_delta(population_size(config))


def resume_experiment(run_dir: str | Path, **kwargs: Any) -> RunSummary:
    """Continue the run in ``run_dir`` from its latest checkpoint (from round 1 if it has none).

    Its ``config.yaml`` may differ from the checkpoint's config only in keys that extend the run or
    change how it is run or logged; other changes are refused and the allowed ones recorded in
    ``resumes.json`` (:mod:`fedray.runtime.resume`)."""
    run_dir = Path(run_dir)
    config = load_config(saved_config_path(run_dir))
    check_unfinished(run_dir, config.train.rounds)
    checkpoint = load_latest_checkpoint(run_dir)
    if checkpoint is not None and "config" in checkpoint:
        changes = config_changes(checkpoint["config"], with_absolute_state_dir(config).to_dict())
        check_resumable(changes, run_dir, int(checkpoint["round"]))
        if changes:
            kwargs["extra_callbacks"] = [*kwargs.get("extra_callbacks", ()), ResumeRecord(changes)]
    return run_experiment(config, run_dir=run_dir, resume=True, **kwargs)
