"""Load a run config from YAML plus ``--set key=value`` overrides, and validate it.

Everything the schema can check is checked here without data or Ray, so a bad config fails in
milliseconds with exit code 2 (see :mod:`fedray.cli.main`). The algorithm's own keys and the user
code a config names are checked one layer up, by :mod:`fedray.plugins`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import yaml
from pydantic import BaseModel, ValidationError

from fedray.config.schema import RunConfig


class ConfigError(ValueError):
    """An invalid configuration; the message names the key and what is allowed."""


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping with the safe loader (no Python object construction)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        loaded = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections, got {type(loaded).__name__}")
    return loaded


def apply_overrides(raw: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Apply ``section.key=value`` overrides; values are parsed as YAML (``0.1``, ``true``, ``[1,2]``),
    except that only ``true``/``false`` are booleans (``off`` stays the word)."""
    for override in overrides:
        key, sep, text = override.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {override!r}: expected KEY=VALUE, e.g. --set data.alpha=0.1")
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError:
            value = text
        if isinstance(value, bool) and text.strip().lower() not in ("true", "false"):
            value = text  # YAML 1.1 reads on/off/yes/no as booleans; on the command line they are words
        set_key(raw, key.strip(), value, source="--set ")
    return raw


def set_key(raw: dict[str, Any], key: str, value: Any, source: str) -> None:
    """Set dotted ``key`` (``section.key``) in a raw config mapping, creating sections on the way;
    ``source`` prefixes the error (``"--set "``, ``"space: "``)."""
    node = raw
    parts = key.split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{source}{key}: {part!r} is a value, not a section")
        node = child
    node[parts[-1]] = value


def _allowed_keys(model: type[BaseModel], loc: tuple) -> list[str]:
    """The keys a section accepts, for 'unknown key' messages."""
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        annotation = getattr(field, "annotation", None)
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return sorted(model.model_fields)


def format_validation_error(error: ValidationError, model: type[BaseModel], prefix: str = "") -> str:
    lines = []
    for item in error.errors():
        loc = tuple(item["loc"])
        key = prefix + ".".join(str(part) for part in loc)
        if item["type"] == "extra_forbidden":
            allowed = ", ".join(_allowed_keys(model, loc))
            lines.append(f"{key}: unknown key (allowed: {allowed})")
        elif not loc:
            lines.append(str(item["msg"]).removeprefix("Value error, "))
        else:
            message = str(item["msg"]).removeprefix("Value error, ")
            lines.append(f"{key}: {message} (got {item.get('input')!r})")
    return "invalid config:\n  " + "\n  ".join(lines)


def validate_config(raw: dict[str, Any]) -> RunConfig:
    """Validate a raw mapping into a :class:`RunConfig`: every section and key of the schema.

    The algorithm's own ``algorithm.*`` keys are checked by
    :func:`fedray.algorithms.validate_algorithm_params` (this package does not know the algorithms);
    :func:`fedray.plugins.load_config` does both, and so do ``fedray run`` / ``tune`` / ``submit``.
    """
    try:
        return RunConfig.model_validate(raw)
    except ValidationError as error:
        raise ConfigError(format_validation_error(error, RunConfig)) from None


def load_config(path: str | Path | None = None, overrides: Iterable[str] = ()) -> RunConfig:
    """Read ``path`` (or start from the defaults), apply overrides, validate the schema (see
    :func:`validate_config`; :func:`fedray.plugins.load_config` also checks the algorithm's keys)."""
    raw = read_yaml(path) if path is not None else {}
    return validate_config(apply_overrides(raw, overrides))


def save_config(config: RunConfig, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))
