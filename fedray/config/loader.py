"""Load a run config from YAML plus ``--set key=value`` overrides, and validate it.

Everything the schema can check is checked here without data or Ray, so a bad config fails in
milliseconds with exit code 2 (see :mod:`fedray.cli.main`). The algorithm's own keys and the user
code a config names are checked one layer up, by :mod:`fedray.plugins`.
"""

from __future__ import annotations

import reprlib
import typing
from pathlib import Path
from typing import Any, Iterable

import yaml
from pydantic import BaseModel, ValidationError

from fedray.config.errors import ConfigError
from fedray.config.schema import RunConfig
from fedray.layout import SAVED_CONFIG_FILE


MAX_CONFIG_BYTES = 1024 * 1024  # a config is a few kB; anything this big is a mistake or an attack
MAX_CONFIG_DEPTH = 32  # the deepest real config (a sweep's space of algorithm lists) is ~6 levels
MAX_CONFIG_NODES = 100_000  # values counted with YAML aliases expanded (an alias "bomb" is far larger)


class _StrictSafeLoader(yaml.SafeLoader):
    """PyYAML's safe loader (no Python object construction) that refuses duplicate mapping keys,
    which the plain loader resolves silently by keeping the last one."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        self.flatten_mapping(node)
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, typing.Hashable):
                continue  # the plain loader reports an unhashable key itself
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {short_repr(key)}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def short_repr(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters, so an error never prints a huge value."""
    shortener = reprlib.Repr()
    shortener.maxstring = shortener.maxother = shortener.maxlong = limit
    text = shortener.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def parse_yaml(text: str, source: str) -> Any:
    """Parse YAML ``text`` safely and check its size (:data:`MAX_CONFIG_DEPTH`,
    :data:`MAX_CONFIG_NODES`); ``source`` (a file name, ``--set key``) starts every error."""
    try:
        depth = 0
        for event in yaml.parse(text, Loader=_StrictSafeLoader):  # the parser is not recursive; the composer is
            depth += isinstance(event, yaml.CollectionStartEvent) - isinstance(event, yaml.CollectionEndEvent)
            if depth > MAX_CONFIG_DEPTH:
                raise ConfigError(source, f"nested deeper than {MAX_CONFIG_DEPTH} levels", within=None)
        loaded = yaml.load(text, Loader=_StrictSafeLoader)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = error.problem or error.context or "unreadable"
        raise ConfigError(source, f"not valid YAML{where}: {short_repr(problem, 200)[1:-1]}", within=None) from None
    except yaml.YAMLError as error:
        raise ConfigError(source, f"not valid YAML: {short_repr(str(error), 200)[1:-1]}", within=None) from None
    check_config_shape(loaded, source)
    return loaded


def check_config_shape(value: Any, source: str) -> None:
    """Refuse a value nested deeper than :data:`MAX_CONFIG_DEPTH` or holding more than
    :data:`MAX_CONFIG_NODES` values once YAML aliases are expanded (walked without recursion, and
    stopped at the limit, so a "billion laughs" document is refused in microseconds)."""
    stack, count = [(value, 1)], 0
    while stack:
        node, depth = stack.pop()
        count += 1
        if depth > MAX_CONFIG_DEPTH:
            raise ConfigError(source, f"nested deeper than {MAX_CONFIG_DEPTH} levels", within=None)
        if count > MAX_CONFIG_NODES:
            raise ConfigError(source, f"more than {MAX_CONFIG_NODES:,} values (YAML aliases expanded)", within=None)
        if isinstance(node, dict):
            stack.extend((child, depth + 1) for pair in node.items() for child in pair)
        elif isinstance(node, (list, tuple)):
            stack.extend((child, depth + 1) for child in node)


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping with the safe loader (no Python object construction), refusing files
    over :data:`MAX_CONFIG_BYTES`, text that is not UTF-8, duplicate keys and too-deep nesting."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(None, f"config file not found: {path}", within=None)
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise ConfigError(str(path), f"{path.stat().st_size:,} bytes; a config may have at most {MAX_CONFIG_BYTES:,}", within=None)
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(str(path), f"not UTF-8 text (byte {error.start}: {error.reason})", within=None) from None
    except OSError as error:
        raise ConfigError(str(path), f"cannot read: {error.strerror}", within=None) from None
    loaded = parse_yaml(text, str(path))
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(str(path), f"the top level must be a mapping of sections, got {type(loaded).__name__}", within=None)
    return loaded


def apply_overrides(raw: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Apply ``section.key=value`` overrides; values are parsed as YAML (``0.1``, ``true``, ``[1,2]``),
    except that only ``true``/``false`` are booleans (``off`` stays the word)."""
    for override in overrides:
        key, sep, text = override.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {short_repr(override)}", "expected KEY=VALUE, e.g. --set data.alpha=0.1", within=None)
        if len(text) > MAX_CONFIG_BYTES:
            raise ConfigError(f"--set {key.strip()}", f"value of {len(text):,} characters; at most {MAX_CONFIG_BYTES:,}", within=None)
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError:
            value = text
        except RecursionError:
            raise ConfigError(f"--set {key.strip()}", f"nested deeper than {MAX_CONFIG_DEPTH} levels", within=None) from None
        check_config_shape(value, f"--set {key.strip()}")
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
            raise ConfigError(f"{source}{key}", f"{part!r} is a value, not a section", within=None)
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


def validation_config_error(error: ValidationError, model: type[BaseModel], prefix: str = "", within: str | None = "config") -> ConfigError:
    """The :class:`ConfigError` of a pydantic ``error`` validating ``model``: one ``(key, message)``
    problem per refused field, keys prefixed with ``prefix`` (``"algorithm."``); a model-level check
    (no field) has no key, its message names the keys."""
    problems: list[tuple[str | None, str]] = []
    for item in error.errors():
        loc = tuple(item["loc"])
        key = prefix + ".".join(str(part) for part in loc)
        key = key if len(key) <= 80 else key[:77] + "..."
        message = str(item["msg"]).removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            problems.append((key, f"unknown key (allowed: {', '.join(_allowed_keys(model, loc))})"))
        elif not loc:
            problems.append((None, message))
        else:
            problems.append((key, f"{message} (got {short_repr(item.get('input'))})"))
    (key, message), *more = problems
    return ConfigError(key, message, within=within, more=more)


def validate_config(raw: dict[str, Any]) -> RunConfig:
    """Validate a raw mapping into a :class:`RunConfig`: every section and key of the schema.

    The algorithm's own ``algorithm.*`` keys are checked by
    :func:`fedray.algorithms.validate_algorithm_params` (this package does not know the algorithms);
    :func:`fedray.plugins.load_config` does both, and so do ``fedray run`` / ``tune`` / ``submit``.
    """
    try:
        return RunConfig.model_validate(raw)
    except ValidationError as error:
        raise validation_config_error(error, RunConfig) from None


def load_config_sections(path: str | Path | None = None, overrides: Iterable[str] = ()) -> RunConfig:
    """Read ``path`` (or start from the defaults), apply overrides and validate the sections of the
    schema only: the algorithm's ``algorithm.*`` keys are neither checked nor filled in. Use
    :func:`fedray.load_config` (:func:`fedray.plugins.load_config`) for a complete run config."""
    raw = read_yaml(path) if path is not None else {}
    return validate_config(apply_overrides(raw, overrides))


def saved_config_path(run_dir: str | Path) -> Path:
    """The config a run saved in ``run_dir`` (:data:`SAVED_CONFIG_FILE`); a :class:`ConfigError`
    if there is none (``run_dir`` is not a fedray run directory)."""
    path = Path(run_dir) / SAVED_CONFIG_FILE
    if not path.is_file():
        raise ConfigError(None, f"{run_dir} is not a fedray run directory (no {SAVED_CONFIG_FILE})", within=None)
    return path


def save_config(config: RunConfig, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))
