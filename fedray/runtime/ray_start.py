"""Ray for a run: check the address, join a cluster or start a local instance sized for the run, and
stop it quickly at the end.

A run starts or joins Ray only after every check that needs no Ray has passed (the schema, the
algorithm's keys, the data, the run directory, a resume's checkpoint): a bad input then fails in the
seconds those checks take, without a Ray start (~4 s on 2 cores, and its processes competing with the
checks for the cores) or its shutdown (``benchmarks/config_errors.py``).
"""

from __future__ import annotations

import logging
import math
import os
import re
import signal
import socket
import threading
import time
from typing import Any

import ray

from fedray.config import ConfigError, RunConfig
from fedray.config.schema import ResourcesConfig
from fedray.runtime.errors import RunError, first_line
from fedray.runtime.processes import usable_cores

logger = logging.getLogger(__name__)
CONNECT_TIMEOUT_S = 5.0  # to reach a cluster's address before handing it to ray.init, which waits minutes
MAX_LOCAL_OVERSUBSCRIPTION = 4  # a local run may reserve at most this many logical CPUs per real one
# Ray kills a worker process that idles longer than this (its default is 1 s). The ones it boots for a
# new local Ray must live until the driver has put the dataset and created the actors.
IDLE_WORKER_LIFETIME_MS = 60_000
# The module of the server and worker actors (fedray.runtime.server, not imported here: it needs torch).
ACTOR_MODULE = "fedray.runtime.server"
_HOST_PORT = re.compile(r"^(?:ray://)?(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")
_run_node: Any = None  # Ray's node object of the local instance ensure_ray started for a run (None: none)


def check_address(address: str | None) -> None:
    """Refuse a malformed ``--address`` before anything starts (exit 2); ``auto``, ``HOST:PORT``
    (the cluster's GCS) and ``ray://HOST:PORT`` (Ray Client) are accepted."""
    if address is None or address == "auto":
        return
    match = _HOST_PORT.match(address)
    if match is None or not 0 < int(match.group(2)) < 65536:
        raise ConfigError(
            f"--address {address[:100]!r}",
            "expected auto, HOST:PORT (the head node's GCS, e.g. 10.0.0.1:6379) or ray://HOST:PORT (Ray Client, e.g. ray://10.0.0.1:10001)",
            within=None,
        )


def starts_local_ray(address: str | None) -> bool:
    """Whether a run given ``address`` starts its own local Ray (not a cluster's, not one already up)."""
    return not (address or os.environ.get("RAY_ADDRESS") or ray.is_initialized())


def uses_ray(resources: ResourcesConfig, address: str | None) -> bool:
    """Whether a run's workers are Ray actors (``resources.backend``): ``auto`` means Ray unless the
    run has one worker and no Ray address (``--address`` or ``$RAY_ADDRESS``), where the local pool
    gives the same results without Ray's start-up (benchmarks/w1_overhead.py). An explicit ``local``
    with an address is refused: the run would silently ignore the cluster."""
    address = address or os.environ.get("RAY_ADDRESS")
    if resources.backend == "local" and address:
        raise ConfigError(
            "resources.backend",
            f"local runs without Ray, but a Ray address is given ({address}); "
            "set resources.backend=ray (or auto) to use that cluster, or drop the address",
        )
    if resources.backend == "auto":
        return bool(address) or resources.num_workers > 1
    return resources.backend == "ray"


def check_gpu_available(resources: ResourcesConfig) -> None:
    """Refuse GPU workers on a machine without a GPU (a local Ray would wait for a GPU that never
    comes; a local pool would train on the CPU while the config says GPU)."""
    if resources.gpus_per_worker > 0:
        import torch

        if torch.cuda.device_count() == 0:
            raise ConfigError(
                "resources.gpus_per_worker",
                f"{resources.gpus_per_worker} but this machine has no "
                "GPU that torch can use; set resources.gpus_per_worker=0, or run on a cluster with GPUs (--address)",
            )


def check_local_resources(config: RunConfig) -> None:
    """For a run that will start its own local Ray: refuse GPU workers on a machine without a GPU
    (:func:`check_gpu_available`) and CPU reservations far beyond the machine's cores (Ray would
    create that many logical CPUs and as many worker processes); warn when the workers oversubscribe
    the cores."""
    resources = config.resources
    check_gpu_available(resources)
    cores = usable_cores()
    needed = resources.reserved_cpus
    if needed > MAX_LOCAL_OVERSUBSCRIPTION * cores:
        raise ConfigError(
            "resources.num_workers",
            f"{resources.num_workers} worker(s) × {resources.cpus_per_worker} CPU "
            f"(+ {resources.server_cpus} for the server) need {needed:g} CPUs, but this machine has {cores}; a local run "
            f"may reserve at most {MAX_LOCAL_OVERSUBSCRIPTION}× its cores (use --address for a cluster)",
        )
    if needed > cores:
        logger.warning(
            "resources: %g CPUs reserved on a machine with %d cores; the workers will share cores and each round "
            "will be slower than with fewer workers",
            needed,
            cores,
        )


def local_ray_options(resources: ResourcesConfig) -> dict[str, Any]:
    """``ray.init`` arguments of a new local Ray sized for a run.

    It starts without Ray's dashboard and job server; Ray >= 2.59 protects a local Ray's ports with
    token authentication by default (``RAY_AUTH_MODE``; see cluster/README.md). Its worker processes
    import the server's and workers' module (torch, the algorithms) as they start, before they are
    given an actor. Ray starts min(CPUs, ``worker_maximum_startup_concurrency``) of them when the
    driver connects, so both are raised to one process per worker plus the server's: all of them boot
    during ``ray.init``, none on demand after it, and none is killed for idling
    (``IDLE_WORKER_LIFETIME_MS``) before the actors arrive. The three keys of ``_system_config`` are
    Ray system settings (``ray_config_def.h``), not documented arguments of ``ray.init``.
    """
    processes = resources.num_workers + 1  # the workers' and the server's
    return {
        "address": "local",  # a new instance: without it Ray joins a `ray start` cluster found in /tmp/ray
        "num_cpus": max(os.cpu_count() or 1, math.ceil(resources.reserved_cpus), processes),
        "include_dashboard": False,
        "dashboard_host": "127.0.0.1",
        "log_to_driver": True,
        "_system_config": worker_system_config(processes),
    }


def worker_system_config(processes: int) -> dict[str, Any]:
    """Ray system settings of a local Ray that fedray starts (:func:`local_ray_options`, and the
    service of ``fedray up``): its worker processes import the actors' module as they boot, up to
    ``processes`` of them boot at once, and an idle one lives ``IDLE_WORKER_LIFETIME_MS``."""
    return {
        "preload_python_modules": [ACTOR_MODULE],
        "worker_maximum_startup_concurrency": processes,
        "idle_worker_killing_time_threshold_ms": IDLE_WORKER_LIFETIME_MS,
    }


def _probe(address: str) -> None:
    """Fail in seconds when nothing listens at a ``HOST:PORT`` address (ray.init would retry for minutes)."""
    match = _HOST_PORT.match(address)
    if match is None:  # "auto": ray.init finds (or does not find) the local cluster at once
        return
    host, port = match.group(1).strip("[]"), int(match.group(2))
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as error:
        reason = "timed out" if isinstance(error, TimeoutError) else (error.strerror or type(error).__name__)
        raise RunError(f"cannot reach the Ray cluster at {address} ({reason} within {CONNECT_TIMEOUT_S:g} s); is it running?") from None


def _interrupt_on_sigterm() -> None:
    """Make SIGTERM (``kill``, a batch scheduler's time limit) stop the driver like Ctrl-C, cleanly.
    ``ray.init`` installs a handler that exits at once and Ray's native signal handler then dumps a
    stack; the driver's cleanup (actors, placement group) and resume hint would be skipped."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.default_int_handler)


def ensure_ray(address: str | None, config: RunConfig) -> float:
    """Connect to ``address`` (or ``$RAY_ADDRESS``, set inside a Ray job) or start a local Ray sized
    for the run (:func:`local_ray_options`); returns the seconds the start or connection took."""
    global _run_node
    started = time.perf_counter()
    address = address or os.environ.get("RAY_ADDRESS")
    try:
        if ray.is_initialized():
            return 0.0
        if address:
            _probe(address)
            ray.init(address=address, log_to_driver=True)
        else:
            ray.init(**local_ray_options(config.resources))
            _run_node = ray._private.worker._global_node
    except (ConnectionError, TimeoutError) as error:  # e.g. --address auto with no cluster running
        raise RunError(f"cannot connect to Ray at {address or 'a new local instance'}: {first_line(error)}") from None
    _interrupt_on_sigterm()
    return time.perf_counter() - started


def is_local_ray_of_a_run() -> bool:
    """Whether this process is connected to the local Ray that :func:`ensure_ray` started for a run,
    which a library caller's :func:`~fedray.runtime.run_experiment` leaves up for the next run: sized
    for that run, with every process's output copied to this one."""
    return _run_node is not None and ray.is_initialized() and ray._private.worker._global_node is _run_node


def shutdown_ray() -> None:
    """Stop this driver's Ray: disconnect from a cluster, or stop the local instance it started.

    Ray stops a local instance's daemons one at a time, giving each up to 1 s to exit after SIGTERM.
    Its autoscaler monitor takes all of that second: its SIGTERM handler reports to the GCS, which
    Ray has already stopped. A single-node local instance has nothing for it to save, so it is
    killed first, which makes the shutdown about 1 s shorter. The monitor is found in Ray's private
    process table; without one (another Ray version) Ray's own shutdown does all.
    """
    global _run_node
    if not ray.is_initialized():
        return
    node = getattr(ray._private.worker, "_global_node", None)  # None when connected to a cluster
    processes = getattr(node, "all_processes", {})
    for info in processes.get("monitor", []):
        info.process.kill()
        info.process.wait()
    ray.shutdown()
    _run_node = None
