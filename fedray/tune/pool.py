"""The warm pool of a trial process: its server and worker actors, kept for the next trial.

With ``reuse_workers`` (the default) Tune reuses a finished trial's process for the next trial with the
same resource request (``TuneConfig.reuse_actors``): the process keeps its placement group, so the
resources stay reserved, and it keeps the torch it imported. This module keeps, in that process, the
server actor and its workers (in bundles of that same group) and the dataset they hold, and resets them
for the next trial (:meth:`fedray.runtime.server.Server.reset`: new config, run directory, algorithm,
model, optimizer and client state store, the workers' initial RNG): the trial's results are those of a
standalone run of its config. The dataset is loaded and put in the object store again only when the
next trial's ``data`` or ``seed`` differ.

Isolation: the pool is kept only when a trial ends normally or is stopped by Tune (``SystemExit``,
raised by ``tune.report`` between rounds while the actors are idle); any other exception kills it, so
the next trial never gets a half-reset pool. A trial that crashes ends its process (Tune does not
reuse a failed trial's actor) and with it the actors that process created; other trials' processes and
pools are their own.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import ray
from ray.util.placement_group import PlacementGroup

from fedray.config import RunConfig
from fedray.plugins import user_module_paths
from fedray.runtime.experiment import WarmServer, _release, prepare_data
from fedray.tune.spec import dataset_key


@dataclass
class _Pool:
    key: str  # what the actors were started for: placement group, resources, user code
    data_key: str  # the dataset they hold (see dataset_key)
    warm: WarmServer


_kept: _Pool | None = None  # this trial process's pool, between trials


def pool_key(config: RunConfig, group: PlacementGroup) -> str:
    """Trials with the same key can run on the same server and workers."""
    return json.dumps([group.id.hex(), config.resources.model_dump(mode="json"), user_module_paths(config)])


@contextmanager
def warm_server(config: RunConfig, group: PlacementGroup) -> Iterator[WarmServer]:
    """The warm server for a trial with ``config`` in ``group`` (to pass to ``run_experiment``): the
    kept one when it has the same :func:`pool_key`, with its dataset when the :func:`dataset_key` is
    the same too; otherwise a new one, the kept one killed. See the module docstring for when it is
    kept after the trial."""
    global _kept
    key = pool_key(config, group)
    if _kept is not None and _kept.key != key:
        discard_pool()
    if _kept is None or _kept.data_key != dataset_key(config):
        data = prepare_data(config)
        server = None if _kept is None else _kept.warm.server
        _kept = _Pool(key, dataset_key(config), WarmServer(data, ray.put(data), server))
    try:
        yield _kept.warm
    except SystemExit:  # Tune stopped the trial at a report: the actors are idle between rounds
        raise
    except BaseException:
        discard_pool()
        raise


def discard_pool() -> None:
    """Kill this process's kept server and workers, if any."""
    global _kept
    if _kept is not None and _kept.warm.server is not None:
        _release(_kept.warm.server, [], None)
    _kept = None
