"""Side concerns of a run (metrics files, TensorBoard, plots, checkpoints, progress) as callbacks,
so the round loop in :mod:`fedray.runtime.experiment` stays a loop.

Users add their own with ``output.callbacks: [mylab.loggers:MyLogger]``: each entry is a
:class:`Callback` subclass, built without arguments in the driver (it reads its settings from
``run.config`` or the environment), or a built-in name of :data:`BUILTIN_CALLBACKS`. A user's callback
only observes the run: one that raises is reported and switched off, and the run goes on
(:class:`fedray.runtime.user_code.IsolatedCallback`).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedray.config import ConfigError, RunConfig, import_reference, is_reference

if TYPE_CHECKING:  # torch-free at run time, so readers of run files (the dashboard) import fedray.tracking cheaply
    from fedray.data import FederatedDataset

#: Short names for the callbacks fedray ships (``output.callbacks: [mlflow]``).
BUILTIN_CALLBACKS = {"mlflow": "fedray.tracking.mlflow:MLflowLogger"}


@dataclass
class RunContext:
    """What callbacks may read about the run in progress."""

    config: RunConfig
    run_dir: Path
    data: FederatedDataset
    server: Any  # the run's RoundEngine, or the RemoteServer in front of the Ray server actor (same methods)
    start_round: int  # rounds already done (0, or the checkpoint's round when resuming)
    history: list[dict[str, Any]] = field(default_factory=list)  # round rows of this run so far


class Callback:
    """Hooks the driver calls around the round loop; every hook does nothing by default.

    ``on_round_end`` receives the round's row (``round``, ``train_loss``, ``test_accuracy`` on
    evaluated rounds, ``seconds``, the algorithm's diagnostics: a row of ``metrics.parquet``) and one
    row per client of the round: copies of its own, so a callback that edits them changes no record.
    """

    def on_run_start(self, run: RunContext) -> None:
        pass

    def on_round_end(self, run: RunContext, row: dict[str, Any], client_rows: list[dict[str, Any]]) -> None:
        pass

    def on_run_end(self, run: RunContext) -> None:
        pass


def callback_class(reference: str, key: str = "output.callbacks") -> type[Callback]:
    """The :class:`Callback` subclass an ``output.callbacks`` entry names; :class:`ConfigError` otherwise."""
    target = BUILTIN_CALLBACKS.get(reference, reference)
    if not is_reference(target):
        raise ConfigError(key, f"unknown callback {reference!r} (allowed: {', '.join(BUILTIN_CALLBACKS)}, or package.module:ClassName)")
    value = import_reference(target, key)
    if not (isinstance(value, type) and issubclass(value, Callback)):
        raise ConfigError(key, f"{reference!r} is not a subclass of fedray.Callback (got {value!r})")
    try:
        inspect.signature(value).bind()
    except TypeError as error:
        raise ConfigError(
            key,
            f"{reference!r} cannot be built without arguments ({error}); a callback reads its settings from run.config or the environment",
        ) from None
    return value


def config_callback_classes(config: RunConfig) -> list[type[Callback]]:
    """The classes of ``output.callbacks``, imported and checked (before Ray starts)."""
    return [callback_class(reference, f"output.callbacks.{i}") for i, reference in enumerate(config.output.callbacks)]
