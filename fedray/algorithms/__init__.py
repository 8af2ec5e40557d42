"""Federated algorithms and the registry that finds them by ``algorithm.name``.

``algorithm.name`` is one of

- a built-in name (``fedavg``, ``fedprox``, ...): each module of this package that defines an
  :class:`Algorithm` subclass with a ``name`` registers it, so adding a built-in is adding a file;
- a name registered by an installed package in the ``fedray.algorithms`` entry-point group
  (``[project.entry-points."fedray.algorithms"] fedavgm = "mylab.fedavgm:FedAvgM"``);
- a reference to user code, ``package.module:ClassName`` (e.g. ``mylab.fedavgm:FedAvgM``), imported
  from the current directory or ``sys.path``; the runtime ships its module to the Ray workers.

:func:`validate_algorithm_params` checks the ``algorithm.*`` keys of a config against the
algorithm's ``Params`` model. This package depends on :mod:`fedray.config`, never the reverse.

Shared pieces live in their own modules: :mod:`.base` (the interface), :mod:`.local` (the local SGD
loop), and the loss / prototype modules the contrastive algorithms share.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import os
import pkgutil
import sys
from functools import cache, lru_cache

from pydantic import ValidationError

from fedray.algorithms.base import (
    Algorithm,
    AlgorithmParams,
    ClientContext,
    ClientUpdate,
    RoundResults,
)
from fedray.config import AlgorithmConfig, ConfigError, RunConfig
from fedray.config.loader import validation_config_error
from fedray.config.references import import_reference, is_reference

ENTRY_POINT_GROUP = "fedray.algorithms"


@cache
def _builtins() -> dict[str, type[Algorithm]]:
    found: dict[str, type[Algorithm]] = {}
    for module_info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{module_info.name}")
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, Algorithm) and value.name and value.__module__ == module.__name__:
                found[value.name] = value
    return found


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    """Names installed packages register in the ``fedray.algorithms`` entry-point group. Reading them
    scans every installed distribution (a third of a small run's time), so it is done once per state
    of the import path: ``sys.path`` and the modification time of each of its folders, which an
    install or uninstall (a ``*.dist-info`` added or removed) changes."""
    return dict(_read_entry_points(_import_path_state()))


def _import_path_state() -> tuple[tuple[str, int | None], ...]:
    state = []
    for entry in sys.path:
        try:
            state.append((entry, os.stat(entry or ".").st_mtime_ns))
        except OSError:
            state.append((entry, None))
    return tuple(state)


@lru_cache(maxsize=8)
def _read_entry_points(import_path_state: tuple[tuple[str, int | None], ...]) -> dict[str, importlib.metadata.EntryPoint]:
    return {entry_point.name: entry_point for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


class _AlgorithmNames:
    """Lazy view of the registered names, built-in and installed (``"fedavg" in ALGORITHMS``)."""

    def __contains__(self, name: object) -> bool:
        return name in _builtins() or name in _entry_points()

    def __iter__(self):
        return iter(sorted(set(_builtins()) | set(_entry_points())))


ALGORITHMS = _AlgorithmNames()


def _checked(value: object, source: str) -> type[Algorithm]:
    if not (isinstance(value, type) and issubclass(value, Algorithm)):
        raise ConfigError("algorithm.name", f"{source} is not a subclass of fedray.Algorithm (got {value!r})")
    builtin = _builtins().get(value.name)
    if builtin is not None and builtin is not value:
        raise ConfigError(
            "algorithm.name",
            f"{source} declares name = {value.name!r}, which is a built-in "
            f"algorithm; give it a name of its own (built-ins: {', '.join(sorted(_builtins()))})",
        )
    if value.client_update is Algorithm.client_update:
        raise ConfigError(
            "algorithm.name",
            f"{source} does not define client_update(self, ctx, broadcast), which every algorithm must (docs/writing_an_algorithm.md)",
        )
    if inspect.isabstract(value):
        raise ConfigError(
            "algorithm.name",
            f"{source} leaves the abstract method(s) {', '.join(sorted(value.__abstractmethods__))} undefined, so it cannot be built",
        )
    return value


def get_algorithm_class(name: str) -> type[Algorithm]:
    """The :class:`Algorithm` subclass ``algorithm.name`` names (see the module docstring); raises
    :class:`ConfigError` naming the key for an unknown name, a module that cannot be imported, an
    object that is not an ``Algorithm`` or a plug-in that takes a built-in's name."""
    installed = _entry_points()
    if name in _builtins():
        if name in installed:
            raise ConfigError(
                "algorithm.name",
                f"the installed entry point {installed[name].value!r} "
                f"(group {ENTRY_POINT_GROUP}) registers {name!r}, which is a built-in algorithm; rename it",
            )
        return _builtins()[name]
    if is_reference(name):
        return _checked(import_reference(name, "algorithm.name"), repr(name))
    if name in installed:
        try:
            loaded = installed[name].load()
        except Exception as error:
            raise ConfigError(
                "algorithm.name", f"cannot load entry point {name} = {installed[name].value!r} ({type(error).__name__}: {error})"
            ) from None
        return _checked(loaded, f"entry point {name} = {installed[name].value!r}")
    raise ConfigError("algorithm.name", f"unknown algorithm {name!r} (allowed: {', '.join(ALGORITHMS)}, or package.module:ClassName)")


def algorithm_label(name: str) -> str:
    """A short name for file names: the algorithm's ``name``, or its class name for a plug-in without one."""
    cls = get_algorithm_class(name)
    return cls.name or cls.__name__.lower()


def validate_algorithm_params(config: RunConfig) -> RunConfig:
    """``config`` with ``algorithm.*`` checked against the named algorithm's ``Params`` model and its
    defaults filled in; raises :class:`ConfigError` naming the key and what is allowed."""
    algorithm = config.algorithm
    params_model = get_algorithm_class(algorithm.name).Params
    try:
        params = params_model.model_validate(dict(algorithm.model_extra or {}))
    except ValidationError as error:
        raise validation_config_error(error, params_model, prefix="algorithm.") from None
    return config.model_copy(update={"algorithm": AlgorithmConfig(name=algorithm.name, **params.model_dump(mode="json"))})


__all__ = [
    "ALGORITHMS",
    "ENTRY_POINT_GROUP",
    "Algorithm",
    "AlgorithmParams",
    "ClientContext",
    "ClientUpdate",
    "RoundResults",
    "algorithm_label",
    "get_algorithm_class",
    "validate_algorithm_params",
]
