"""Worker pools: the :class:`~fedray.runtime.worker.ClientWorker` objects a round runs on, behind one
small interface, so that :class:`~fedray.runtime.engine.RoundEngine` never knows where they live.

- :class:`~fedray.runtime.server.RayPool`: one Ray actor per worker, each in its placement-group bundle (fractional GPUs,
  docs/architecture.md principles 1 and 8); a worker that dies is replaced and its work re-run.
- :class:`LocalPool`: the same worker objects in this process, called one after another. No Ray, so a
  run starts at once and ``breakpoint()`` inside ``client_update`` stops in the caller's terminal.

Both give the same partial results for the same work, so a run's metrics do not depend on the pool:
:class:`LocalPool` copies what goes in and comes out of a worker (as Ray's serialisation does) and
gives each worker its own torch RNG, starting where a new process's starts (as each actor has its own).
"""

from __future__ import annotations

import copy
from typing import Any, Protocol

import torch

from fedray.config import RunConfig
from fedray.data import FederatedDataset
from fedray.runtime.worker import ClientWorker

#: The seed of torch's default generator in a new process (``torch.initial_seed()`` before any seeding).
NEW_PROCESS_TORCH_SEED = 67280421310721


class WorkerPool(Protocol):
    """What the round engine needs from its workers."""

    restarts: int  # workers replaced so far in this run (cumulative; saved in checkpoints)

    @property
    def size(self) -> int: ...

    def share(self, value: Any) -> Any:
        """``value`` in the form a worker call takes it: put in Ray's object store once (a round's
        broadcast is sent to every worker, docs/architecture.md principle 2), or the value itself."""
        ...

    def call_each(self, method: str, args_by_worker: list[tuple[Any, ...] | None]) -> list[Any]:
        """``ClientWorker.<method>(*args_by_worker[i])`` on every worker ``i`` whose arguments are not
        None; the results in worker order (None where there was no call)."""
        ...

    def handles(self) -> list[Any]:
        """The workers: actor handles (Ray) or the worker objects (local)."""
        ...


class LocalPool:
    """``resources.num_workers`` :class:`ClientWorker` objects in this process (``resources.backend:
    local``). Calls run one after another in worker order; a failure is raised, not retried."""

    def __init__(self, config: RunConfig, data: FederatedDataset, run_dir: str) -> None:
        self.restarts = 0
        use_gpu = config.resources.gpus_per_worker > 0
        # the GPU's generator too (dropout on the GPU draws from it): each actor has its own
        self.devices = [torch.cuda.current_device()] if use_gpu and torch.cuda.is_available() else []
        self.workers: list[ClientWorker] = []
        self.rng_states: list[list[torch.Tensor]] = []  # per worker: the CPU generator's state, then each GPU's
        for _ in range(config.resources.num_workers):
            with torch.random.fork_rng(devices=self.devices):
                torch.manual_seed(NEW_PROCESS_TORCH_SEED)  # the worker's RNG starts where an actor's would
                self.workers.append(ClientWorker(config.to_dict(), data, run_dir, use_gpu))
                self.rng_states.append(self._rng_state())

    @property
    def size(self) -> int:
        return len(self.workers)

    def share(self, value: Any) -> Any:
        return value

    def call_each(self, method: str, args_by_worker: list[tuple[Any, ...] | None]) -> list[Any]:
        results: list[Any] = [None] * len(args_by_worker)
        for index, args in enumerate(args_by_worker):
            if args is not None:
                results[index] = self._call(index, method, args)
        return results

    def _call(self, index: int, method: str, args: tuple[Any, ...]) -> Any:
        """One worker call with that worker's RNG, on copies: an algorithm that edits the broadcast in
        place, or a result that shares memory with a worker's model, cannot reach the server's state."""
        with torch.random.fork_rng(devices=self.devices):
            cpu_state, *gpu_states = self.rng_states[index]
            torch.random.set_rng_state(cpu_state)
            for device, state in zip(self.devices, gpu_states):
                torch.cuda.set_rng_state(state, device)
            result = getattr(self.workers[index], method)(*copy.deepcopy(args))
            self.rng_states[index] = self._rng_state()
        return copy.deepcopy(result)

    def _rng_state(self) -> list[torch.Tensor]:
        return [torch.random.get_rng_state(), *(torch.cuda.get_rng_state(device) for device in self.devices)]

    def handles(self) -> list[Any]:
        return list(self.workers)
