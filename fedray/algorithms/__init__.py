"""Federated algorithms. Each is one module defining an :class:`Algorithm` subclass with a ``name``;
modules are discovered automatically, so adding an algorithm is adding a file.

Shared pieces live in their own modules: :mod:`.base` (the interface), :mod:`.local` (the local SGD
loop), and the loss / prototype modules the contrastive algorithms share.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from fedray.algorithms.base import (
    Algorithm,
    AlgorithmParams,
    ClientContext,
    ClientUpdate,
    RoundResults,
)


@cache
def _registry() -> dict[str, type[Algorithm]]:
    found: dict[str, type[Algorithm]] = {}
    for module_info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{module_info.name}")
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, Algorithm) and value.name and value.__module__ == module.__name__:
                found[value.name] = value
    return found


class _AlgorithmNames:
    """Lazy view of the registered names (``"fedavg" in ALGORITHMS``)."""

    def __contains__(self, name: object) -> bool:
        return name in _registry()

    def __iter__(self):
        return iter(sorted(_registry()))


ALGORITHMS = _AlgorithmNames()


def get_algorithm_class(name: str) -> type[Algorithm]:
    try:
        return _registry()[name]
    except KeyError:
        raise KeyError(f"unknown algorithm {name!r} (allowed: {', '.join(ALGORITHMS)})") from None


__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "AlgorithmParams",
    "ClientContext",
    "ClientUpdate",
    "RoundResults",
    "get_algorithm_class",
]
