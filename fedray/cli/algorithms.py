"""``fedray algorithms [NAME ...] [--format text|yaml] [--matrix]``: list the algorithms ``algorithm.name``
can name, each with the tasks it serves (``data.task``, from its requirements), its ``algorithm.*``
keys, their defaults and what they mean; with ``--matrix``, which feature works with which of them
(:mod:`fedray.runtime.support`, docs/support_matrix.md).

The keys and defaults are read from each algorithm's pydantic ``Params`` model, the same model that
validates a config, so the listing cannot drift from what ``fedray run`` accepts. Built-ins and
names installed in the ``fedray.algorithms`` entry-point group are listed by default; a
``package.module:ClassName`` reference may be named explicitly. Nothing here starts Ray.
"""

from __future__ import annotations

import argparse
import re
import sys
import typing
from typing import Any

import yaml

from fedray.config import ConfigError

#: The end of a docstring's first sentence: a full stop followed by a space or the end, but not the
#: abbreviations the algorithms' docstrings use ("et al.", "Eq.", "e.g.", "i.e.").
_SENTENCE_END = re.compile(r"(?<!\bal)(?<!\bEq)(?<!\be\.g)(?<!\bi\.e)\.(?=\s|$)")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "algorithms",
        help="list the algorithms with their algorithm.* keys and defaults",
        description=(
            "List every algorithm algorithm.name can name (built-ins and installed entry points), with the paper "
            "it implements and its algorithm.* keys, defaults and meanings, read from its Params model."
        ),
    )
    parser.add_argument(
        "names", nargs="*", metavar="NAME", help="only these algorithms (a built-in name, an entry point or package.module:ClassName)"
    )
    parser.add_argument(
        "--format",
        choices=("text", "yaml"),
        default="text",
        help="text (default): a readable listing; yaml: each algorithm's section with its defaults, ready to paste into a run config",
    )
    parser.add_argument(
        "--matrix",
        action="store_true",
        help="which feature (task, systems model, async, compression, DP, robust rules, attackers, personalised evaluation, "
        "client state on S3) works with which algorithm, as the checks before Ray decide it: a table, then the reasons "
        "(with NAME: that algorithm's cells, one a line)",
    )
    parser.set_defaults(handler=algorithms_command)


def algorithms_command(args: argparse.Namespace) -> int:
    """Print the listing; an unknown name is a :class:`~fedray.config.ConfigError` (exit code 2)."""
    from fedray.algorithms import ALGORITHMS, get_algorithm_class  # imports torch, not Ray

    names = list(args.names) or list(ALGORITHMS)
    classes = {name: get_algorithm_class(name) for name in names}
    if args.matrix:
        from fedray.runtime.support import cells_text, matrix_text, support_matrix

        if args.format != "text":
            raise ConfigError("--matrix", "prints text only; leave out --format", within=None)
        matrix = support_matrix(names)
        sys.stdout.write(cells_text(matrix) if args.names else matrix_text(matrix))
        return 0
    if args.format == "yaml":
        sys.stdout.write(algorithms_yaml(classes))
    else:
        sys.stdout.write(algorithms_text(classes))
    return 0


def algorithm_summary(cls: type) -> str:
    """The first sentence of the algorithm's module docstring (its paper and idea), or of the class's."""
    module = sys.modules.get(cls.__module__)
    for doc in (getattr(module, "__doc__", None), cls.__doc__):
        paragraph = " ".join((doc or "").strip().split("\n\n")[0].split())
        if paragraph:
            match = _SENTENCE_END.search(paragraph)
            return paragraph[: match.end()] if match else paragraph
    return ""


def parameter_rows(params_model: type) -> list[tuple[str, Any, str]]:
    """``(key, default, meaning)`` for every field of a pydantic ``Params`` model; the meaning is the
    field's description plus its allowed values when the type is a ``Literal``. A field without a
    default gets the default ``"(required)"``."""
    from pydantic_core import PydanticUndefined

    rows = []
    for key, field in params_model.model_fields.items():
        if field.default is not PydanticUndefined:
            default = field.default
        elif field.default_factory is not None:
            default = field.default_factory()
        else:
            default = "(required)"
        meaning = field.description or ""
        choices = _literal_choices(field.annotation)
        if choices:
            meaning = f"{meaning} [{' | '.join(map(str, choices))}]".strip()
        rows.append((key, default, meaning))
    return rows


def _literal_choices(annotation: Any) -> tuple[Any, ...]:
    """The values of a ``Literal[...]`` annotation (also inside ``Optional``/unions); empty otherwise."""
    if typing.get_origin(annotation) is typing.Literal:
        return typing.get_args(annotation)
    return tuple(choice for argument in typing.get_args(annotation) for choice in _literal_choices(argument))


def format_value(value: Any) -> str:
    """A default as it would be written after ``--set key=`` (YAML flow style: ``null``, ``[a, b]``, ``.inf``)."""
    if isinstance(value, str) and value == "(required)":
        return value
    if hasattr(value, "model_dump"):
        value = value.model_dump(mode="json")
    text = yaml.safe_dump(value, default_flow_style=True, allow_unicode=True).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


def algorithms_text(classes: dict[str, type]) -> str:
    """The readable listing: a heading line per algorithm, the tasks (``data.task``) it serves, then one
    line per ``algorithm.*`` key."""
    from fedray.algorithms.requirements import supported_tasks

    lines = []
    for name, cls in classes.items():
        lines.append(f"{name}  ({cls.__module__}:{cls.__name__})")
        summary = algorithm_summary(cls)
        if summary:
            lines.append(f"  {summary}")
        lines.append(f"  tasks: {', '.join(supported_tasks(cls)) or 'none of the built-in ones'}")
        rows = parameter_rows(cls.Params)
        if not rows:
            lines.append("  (no algorithm.* keys)")
        width = max((len(f"algorithm.{key}") for key, _, _ in rows), default=0)
        value_width = max((len(format_value(default)) for _, default, _ in rows), default=0)
        for key, default, meaning in rows:
            line = f"  {f'algorithm.{key}':<{width}}  {format_value(default):<{value_width}}  {meaning}"
            lines.append(line.rstrip())
        lines.append("")
    return "\n".join(lines)


def algorithms_yaml(classes: dict[str, type]) -> str:
    """One YAML document per algorithm: its ``algorithm:`` section with every key at its default."""
    documents = []
    for name, cls in classes.items():
        section: dict[str, Any] = {"name": name}
        for key, default, _ in parameter_rows(cls.Params):
            section[key] = default.model_dump(mode="json") if hasattr(default, "model_dump") else default
        documents.append(yaml.safe_dump({"algorithm": section}, sort_keys=False, allow_unicode=True))
    return "---\n".join(documents)
