"""The Ray side of a run: the worker actors (:class:`RayPool`), the server actor that runs the
:class:`~fedray.runtime.engine.RoundEngine` next to them (:class:`Server`), and the driver's handle on
it (:class:`RemoteServer`).

The server actor is a thin shell: the round logic is the engine's, the same as with
``resources.backend: local``. What Ray adds is here: workers in placement-group bundles (fractional
GPUs, docs/architecture.md principle 8), the broadcast put in the object store once a round
(principle 2), and the replacement of a worker that dies, whose clients are re-run and give the same
partial because everything is seeded per client (principle 7).

The warnings of fedray's loggers in the server actor (a worker replaced, a round that aggregated
nobody, excluded updates, ...) travel back with each call's result and are logged again in the
driver (:class:`RelayedWarnings`): there they reach what the driver's ``fedray`` logger reaches, a
sweep trial's ``log.txt`` included, instead of the actor's stderr.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, ObjectLostError, RayActorError, RayError
from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from fedray.config import RunConfig
from fedray.runtime.engine import RoundEngine
from fedray.runtime.worker import ClientWorker

logger = logging.getLogger(__name__)


class WorkerPoolError(RuntimeError):
    """Workers kept dying past ``resources.max_worker_restarts``."""


def start_worker(
    config: RunConfig,
    index: int,
    data: ray.ObjectRef,
    run_dir: str,
    placement_group: PlacementGroup | None,
    first_worker_bundle: int,
    runtime_env: dict[str, Any] | None = None,
) -> Any:
    """Start client worker ``index`` in its bundle of ``placement_group``; returns its actor handle.
    ``runtime_env`` is for a caller whose own environment the worker would not inherit (the driver's,
    when the config names user modules)."""
    resources = config.resources
    options: dict[str, Any] = {"num_cpus": resources.cpus_per_worker, "num_gpus": resources.gpus_per_worker}
    if placement_group is not None:
        options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
            placement_group, placement_group_bundle_index=first_worker_bundle + index
        )
    if runtime_env is not None:
        options["runtime_env"] = runtime_env
    return ray.remote(ClientWorker).options(**options).remote(config.to_dict(), data, run_dir, resources.gpus_per_worker > 0)


class RayPool:
    """Worker actors, one per worker bundle of the run's placement group (``resources.backend: ray``);
    see :class:`fedray.runtime.pool.WorkerPool`."""

    def __init__(
        self,
        config: RunConfig,
        data_ref: ray.ObjectRef,
        run_dir: str,
        placement_group: PlacementGroup | None,
        first_worker_bundle: int,
        workers: list[Any],
    ) -> None:
        self.config = config
        self.data_ref = data_ref
        self.run_dir = run_dir
        self.placement_group = placement_group
        self.first_worker_bundle = first_worker_bundle
        self.workers = list(workers)
        self.restarts = 0

    @property
    def size(self) -> int:
        return len(self.workers)

    def share(self, value: Any) -> ray.ObjectRef:
        return ray.put(value)

    def reset(self, config: RunConfig, data_ref: ray.ObjectRef, run_dir: str) -> None:
        """Make every worker that of a new run (``ClientWorker.reset``); ``config`` must have the same
        ``resources`` as the one the workers were started with."""
        self.config, self.data_ref, self.run_dir, self.restarts = config, data_ref, run_dir, 0
        ray.get([worker.reset.remote(config.to_dict(), data_ref, run_dir) for worker in self.workers])

    def call_each(self, method: str, args_by_worker: list[tuple[Any, ...] | None]) -> list[Any]:
        """As :meth:`WorkerPool.call_each`, all workers at once. A worker that dies is replaced in its
        bundle (it inherits this actor's ``runtime_env``) and its call re-run. A result lost with its
        node after the worker finished (``ObjectLostError``, as ``ray.wait`` saw it ready on a node that
        then died) counts as the worker dying."""

        def call(index: int) -> ray.ObjectRef:
            return getattr(self.workers[index], method).remote(*args_by_worker[index])

        pending = {i: call(i) for i, args in enumerate(args_by_worker) if args is not None}
        results: list[Any] = [None] * len(args_by_worker)
        while pending:
            by_ref = {ref: i for i, ref in pending.items()}
            [ready], _ = ray.wait(list(by_ref), num_returns=1)
            index = by_ref[ready]
            del pending[index]
            try:
                results[index] = ray.get(ready)
            except (RayActorError, ObjectLostError) as error:
                self.restarts += 1
                if self.restarts > self.config.resources.max_worker_restarts:
                    raise WorkerPoolError(
                        f"worker {index} died and resources.max_worker_restarts="
                        f"{self.config.resources.max_worker_restarts} is used up: {error}"
                    ) from error
                logger.warning("worker %d died (%s); replacing it and re-running its clients", index, type(error).__name__)
                ray.kill(self.workers[index])  # a no-op for a dead actor; stops one whose node lost only the result
                self.workers[index] = start_worker(
                    self.config, index, self.data_ref, self.run_dir, self.placement_group, self.first_worker_bundle
                )
                pending[index] = call(index)
        return results

    def handles(self) -> list[Any]:
        return list(self.workers)


#: A warning as it crosses from the server actor to the driver: (logger name, level, message).
WarningLine = tuple[str, int, str]


class RelayedWarnings(logging.Handler):
    """In the server actor: holds the warnings of the ``fedray`` loggers until the next call returns
    them (:meth:`drain`); the actor prints none itself. In the driver, :func:`relay` logs them again."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[WarningLine] = []
        logging.getLogger("fedray").addHandler(self)
        logging.getLogger("fedray").propagate = False  # the driver shows them, once

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.name, record.levelno, record.getMessage()))

    def drain(self) -> list[WarningLine]:
        lines, self.lines = self.lines, []
        return lines


def relay(lines: list[WarningLine]) -> None:
    """Log the server actor's warnings in this process, each on the logger that wrote it."""
    for name, level, message in lines:
        logging.getLogger(name).log(level, "%s", message)


class Server:
    """The server actor: a :class:`RoundEngine` on a :class:`RayPool`. ``workers``: the pool's actors,
    one per worker bundle, started by the driver (with :func:`start_worker`) so that they boot while
    this actor does."""

    def __init__(
        self,
        config: dict[str, Any],
        data_ref: list[ray.ObjectRef],
        run_dir: str,
        placement_group: PlacementGroup | None,
        first_worker_bundle: int,
        workers: list[Any],
    ) -> None:
        # data_ref is a list, so that Ray passes the reference on instead of the data
        self.warnings = RelayedWarnings()  # first: the engine's own start may warn
        run_config = RunConfig.model_validate(config)
        self.pool = RayPool(run_config, data_ref[0], run_dir, placement_group, first_worker_bundle, workers)
        self.engine = RoundEngine(run_config, ray.get(data_ref[0]), run_dir, self.pool)

    def reset(self, config: dict[str, Any], data_ref: list[ray.ObjectRef], run_dir: str) -> None:
        """Make this server and its workers those of a new run, exactly as if they had just been
        started for it (a Tune trial reusing the warm pool of the previous trial). ``config`` must
        have the same ``resources`` as the one the workers were started with."""
        run_config = RunConfig.model_validate(config)
        self.pool.reset(run_config, data_ref[0], run_dir)
        self.engine = RoundEngine(run_config, ray.get(data_ref[0]), run_dir, self.pool)

    # Each call returns its value and the warnings held since the previous call (those of __init__
    # and reset travel with the run's first call).
    def run_round(self, round: int) -> tuple[dict[str, Any], list[WarningLine]]:
        return self.engine.run_round(round), self.warnings.drain()

    def checkpoint_state(self) -> tuple[dict[str, Any], list[WarningLine]]:
        return self.engine.checkpoint_state(), self.warnings.drain()

    def checkpoint_written(self) -> tuple[None, list[WarningLine]]:
        return self.engine.checkpoint_written(), self.warnings.drain()

    def load_checkpoint_state(self, state: dict[str, Any]) -> tuple[None, list[WarningLine]]:
        return self.engine.load_checkpoint_state(state), self.warnings.drain()

    def worker_handles(self) -> tuple[list[Any], list[WarningLine]]:
        return self.engine.worker_handles(), self.warnings.drain()

    def held_warnings(self) -> list[WarningLine]:
        """The warnings of a call that raised instead of returning them."""
        return self.warnings.drain()


class RemoteServer:
    """The driver's handle on the server actor, with the :class:`RoundEngine` methods a run calls
    (so the driver and callbacks use either the same way)."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    def _call(self, method: str, *args: Any, timeout: float | None = None) -> Any:
        try:
            value, warnings = ray.get(getattr(self.actor, method).remote(*args), timeout=timeout)
        except (RayActorError, GetTimeoutError):  # the actor is gone (its warnings with it), or does not answer
            raise
        except Exception:  # the call raised: its warnings (a worker replaced, ...) come before the error
            with contextlib.suppress(RayError):  # never in place of the error itself
                relay(ray.get(self.actor.held_warnings.remote(), timeout=60))
            raise
        relay(warnings)
        return value

    def run_round(self, round: int) -> dict[str, Any]:
        return self._call("run_round", round)

    def checkpoint_state(self) -> dict[str, Any]:
        return self._call("checkpoint_state")

    def checkpoint_written(self) -> None:
        self._call("checkpoint_written")

    def load_checkpoint_state(self, state: dict[str, Any]) -> None:
        self._call("load_checkpoint_state", state)

    def worker_handles(self, timeout: float | None = None) -> list[Any]:
        return self._call("worker_handles", timeout=timeout)
