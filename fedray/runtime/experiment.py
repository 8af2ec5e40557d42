"""The driver: validate, load data, reserve resources, start the server, loop over rounds.

Everything that can fail on bad input (config, data directory, client counts) fails before Ray
starts. The driver holds no model-sized state between rounds: the server actor does.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import ray
from ray.util.placement_group import NODE_ID_LABEL_KEY, PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from fedray.cluster.placement import WorkerPlacement
from fedray.algorithms import get_algorithm_class
from fedray.config import ConfigError, RunConfig, load_config, save_config
from fedray.data import FederatedDataset, build_federated_dataset
from fedray.runtime.checkpoint import list_checkpoints, load_latest_checkpoint, save_checkpoint
from fedray.runtime.server import Server
from fedray.runtime.state_store import ClientStateError, ClientStateStore, client_state_location, nodes_missing_location
from fedray.runtime.worker import build_algorithm
from fedray.tracking import (
    Callback,
    MetricsParquet,
    Plots,
    ProgressBar,
    RunContext,
    TensorBoardLogger,
)
from fedray.tracking.sync import StorageSync, is_uri, staging_root

logger = logging.getLogger(__name__)
CONFIG_FILE = "config.yaml"
SUMMARY_FILE = "summary.json"


@dataclass
class RunSummary:
    run_dir: str
    rounds: int
    final_test_accuracy: float | None
    best_test_accuracy: float | None
    best_round: int | None
    seconds: float
    ray_startup_seconds: float
    final_metrics: dict[str, Any]


class Checkpointer(Callback):
    """Writes a checkpoint every ``checkpoint.every`` rounds and after the last round."""

    def on_round_end(self, run: RunContext, row: dict[str, Any], client_rows: list[dict[str, Any]]) -> None:
        round = row["round"]
        if round % run.config.checkpoint.every == 0 or round == run.config.train.rounds:
            contents = ray.get(run.server.checkpoint_state.remote())
            save_checkpoint(run.run_dir, round, {**contents, "config": run.config.to_dict()}, run.config.checkpoint.keep)
            ray.get(run.server.checkpoint_written.remote())


def default_callbacks(config: RunConfig, progress: bool) -> list[Callback]:
    callbacks: list[Callback] = [MetricsParquet(), Checkpointer(), WorkerPlacement()]
    if config.output.tensorboard:
        callbacks.append(TensorBoardLogger())
    if config.output.plots:
        callbacks.append(Plots())
    if progress:
        callbacks.append(ProgressBar())
    return callbacks


def new_run_dir(config: RunConfig) -> Path:
    name = config.output.name or f"{config.algorithm.name}-{config.data.name}-{datetime.now():%Y%m%d-%H%M%S}"
    root = staging_root(config.output) if is_uri(config.output.dir) else Path(config.output.dir)
    run_dir = root / name
    suffix = 1
    while run_dir.exists() and config.output.name is None:
        run_dir = root / f"{name}-{suffix}"
        suffix += 1
    return run_dir


def prepare_data(config: RunConfig) -> FederatedDataset:
    """Load and partition the data and build the algorithm once, so that impossible client counts
    and the algorithm's own checks (which need the dataset, e.g. its model's taps) fail as config
    errors before Ray starts."""
    data = build_federated_dataset(config.data, config.seed)
    if (data.clients.sizes == 0).any():
        empty = int((data.clients.sizes == 0).sum())
        raise ConfigError(f"invalid config:\n  data.num_clients: {empty} of {data.num_clients} clients got no training samples; use fewer clients or another partition")
    try:
        build_algorithm(config, data)
    except ConfigError:
        raise
    except ValueError as error:
        raise ConfigError(f"invalid config:\n  {error}") from None
    return data


def ensure_ray(address: str | None, config: RunConfig) -> float:
    """Connect to ``address`` (or ``$RAY_ADDRESS``, set inside a Ray job) or start a local Ray sized
    for the run; returns the seconds it took.

    A local Ray starts without Ray's dashboard and job server; Ray >= 2.59 protects a local Ray's
    ports with token authentication by default (``RAY_AUTH_MODE``; see cluster/README.md).
    """
    if ray.is_initialized():
        return 0.0
    started = time.perf_counter()
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=True)
    else:
        resources = config.resources
        needed = resources.num_workers * resources.cpus_per_worker + resources.server_cpus
        ray.init(
            address="local",  # a new instance: without it Ray joins a `ray start` cluster found in /tmp/ray
            num_cpus=max(os.cpu_count() or 1, int(np.ceil(needed))),
            include_dashboard=False,
            dashboard_host="127.0.0.1",
            log_to_driver=True,
        )
    return time.perf_counter() - started


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
    """The client state location of an algorithm with per-client state (None for the others), after
    checking that it opens: a bad URI fails as a config error, before Ray starts."""
    if not get_algorithm_class(config.algorithm.name).keeps_client_state:
        return None
    location = client_state_location(config.output, run_dir)
    try:
        ClientStateStore(location)
    except (ClientStateError, OSError) as error:
        raise ConfigError(f"invalid config:\n  {_state_key(config)}: {error}") from None
    return location


def require_shared_client_state(config: RunConfig, location: str) -> None:
    """On a multi-node cluster every node must read what the driver writes at the client state
    location; otherwise fail before the first round instead of when a client moves to another node."""
    key = _state_key(config)
    try:
        missing = nodes_missing_location(location)
    except (ClientStateError, OSError) as error:
        raise ConfigError(f"invalid config:\n  {key}: {error}") from None
    if missing:
        raise ConfigError(
            f"invalid config:\n  {key}: {config.algorithm.name} keeps per-client state in {location}, which is node-local: "
            f"node(s) {', '.join(missing)} cannot read a file written there. On a multi-node cluster set "
            "output.client_state_dir (or output.dir) to storage every node reaches: a path every node mounts at "
            "the same place, or an object-store URI such as s3://BUCKET/fedray-state"
        )


def reserve_resources(config: RunConfig) -> tuple[PlacementGroup, int]:
    """A placement group with the server's bundle (if it reserves CPUs) and one bundle per worker;
    returns it and the index of the first worker bundle (DESIGN.md principle 8).

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
        raise RuntimeError(
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
    config: RunConfig,
    *,
    run_dir: str | Path | None = None,
    resume: bool = False,
    address: str | None = None,
    callbacks: list[Callback] | None = None,
    extra_callbacks: list[Callback] = (),
    progress: bool = True,
    placement: tuple[PlacementGroup, int] | None = None,
    fault: dict[str, int] | None = None,
) -> RunSummary:
    """Run (or, with ``resume``, continue) one federated simulation.

    ``placement`` lets a caller that already holds a placement group (a Ray Tune trial) pass it with
    the index of the first worker bundle; otherwise one is reserved here. ``fault`` injects a worker
    crash for tests: ``{"worker": i, "round": r}`` kills worker ``i`` after its first client of round ``r``.
    """
    started = time.perf_counter()
    config = with_absolute_state_dir(config)
    storage_sync = StorageSync(config.output.dir) if is_uri(config.output.dir) else None
    data = prepare_data(config)
    run_dir = Path(run_dir) if run_dir is not None else new_run_dir(config)
    checkpoint = load_latest_checkpoint(run_dir) if resume else None
    state_location = open_client_state_location(config, run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    save_config(config, run_dir / CONFIG_FILE)
    ray_startup_seconds = ensure_ray(address, config)
    if state_location is not None:
        require_shared_client_state(config, state_location)

    group, first_worker_bundle = placement if placement is not None else reserve_resources(config)
    server_options: dict[str, Any] = {"num_cpus": config.resources.server_cpus, "max_concurrency": 1}
    server_options["scheduling_strategy"] = server_scheduling(group, first_worker_bundle)
    data_ref = ray.put(data)
    server = ray.remote(Server).options(**server_options).remote(
        config.to_dict(), [data_ref], str(run_dir.resolve()), group, first_worker_bundle, fault
    )
    start_round = 0
    if checkpoint is not None:
        ray.get(server.load_checkpoint_state.remote(checkpoint))
        start_round = int(checkpoint["round"])
        logger.info("resuming %s from round %d", run_dir, start_round)

    run = RunContext(config=config, run_dir=run_dir, data=data, server=server, start_round=start_round)
    callbacks = (default_callbacks(config, progress) if callbacks is None else callbacks) + list(extra_callbacks)
    if storage_sync is not None:
        callbacks.append(storage_sync)
    try:
        for callback in callbacks:
            callback.on_run_start(run)
        for round in range(start_round + 1, config.train.rounds + 1):
            result = ray.get(server.run_round.remote(round))
            run.history.append(result["round"])
            for callback in callbacks:
                callback.on_round_end(run, result["round"], result["clients"])
        for callback in callbacks:
            callback.on_run_end(run)
    finally:
        for worker in ray.get(server.worker_handles.remote()):
            ray.kill(worker)
        ray.kill(server)
        if placement is None:
            remove_placement_group(group)

    summary = summarize(run, time.perf_counter() - started, ray_startup_seconds)
    (run_dir / SUMMARY_FILE).write_text(json.dumps(asdict(summary), indent=2))
    if storage_sync is not None:
        storage_sync.sync(run_dir)
    return summary


def summarize(run: RunContext, seconds: float, ray_startup_seconds: float) -> RunSummary:
    evaluated = [row for row in run.history if row.get("test_accuracy") is not None]
    best = max(evaluated, key=lambda row: row["test_accuracy"], default=None)
    final = run.history[-1] if run.history else {}
    return RunSummary(
        run_dir=str(run.run_dir),
        rounds=int(final.get("round", 0)),
        final_test_accuracy=final.get("test_accuracy"),
        best_test_accuracy=None if best is None else best["test_accuracy"],
        best_round=None if best is None else best["round"],
        seconds=seconds,
        ray_startup_seconds=ray_startup_seconds,
        final_metrics=final,
    )


def resume_experiment(run_dir: str | Path, **kwargs: Any) -> RunSummary:
    """Continue the run in ``run_dir`` from its latest checkpoint (from round 1 if it has none)."""
    run_dir = Path(run_dir)
    if not (run_dir / CONFIG_FILE).is_file():
        raise ConfigError(f"{run_dir} is not a fedray run directory (no {CONFIG_FILE})")
    config = load_config(run_dir / CONFIG_FILE)
    if list_checkpoints(run_dir) and (run_dir / SUMMARY_FILE).is_file():
        done = json.loads((run_dir / SUMMARY_FILE).read_text())
        if done.get("rounds") == config.train.rounds:
            raise ConfigError(f"{run_dir} already finished all {config.train.rounds} rounds")
    return run_experiment(config, run_dir=run_dir, resume=True, **kwargs)
