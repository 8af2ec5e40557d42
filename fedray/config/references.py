"""User code named in a config as ``package.module:Name`` (``algorithm.name``, ``output.callbacks``).

Importing a reference is the only thing this module does; what the object must be (an ``Algorithm``
subclass, a ``Callback`` subclass) is checked by the package that uses it. Every failure is a
:class:`~fedray.config.errors.ConfigError` naming the config key, so it fails before Ray starts.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from fedray.config.errors import ConfigError


def is_reference(name: str) -> bool:
    """``True`` for ``package.module:Name`` (a reference to user code), ``False`` for a plain name."""
    return ":" in name


def import_reference(reference: str, key: str) -> Any:
    """The object ``Name`` of module ``package.module``.

    The current directory is searched after ``sys.path`` (as ``python -m`` does), so a user's own
    module next to their config imports without ``PYTHONPATH``.
    """
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise ConfigError(key, f"expected 'package.module:ClassName' (got {reference!r})")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.append(cwd)
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # ImportError, or the user's module raising while it is imported
        raise ConfigError(
            key,
            f"cannot import module {module_name!r} of {reference!r} "
            f"({type(error).__name__}: {error}); it must be importable from the current directory or sys.path",
        ) from None
    value: Any = module
    for part in attribute.split("."):
        if not hasattr(value, part):
            raise ConfigError(key, f"module {module_name!r} has no {attribute!r} (got {reference!r})")
        value = getattr(value, part)
    return value
