"""MkDocs hook (``hooks:`` in mkdocs.yml): render the reStructuredText roles of fedray's docstrings
(``:class:`~fedray.config.RunConfig` ``, ``:func:`run_experiment` ``) as code spans in the API
reference, instead of printing them literally. ``~`` keeps the last component of the name, as Sphinx
does. Pages are Markdown and contain no roles; the rewrite applies to every Markdown conversion,
mkdocstrings' docstrings included."""

from __future__ import annotations

import re
from typing import Any

from markdown import Extension, Markdown
from markdown.preprocessors import Preprocessor

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj|const):`(~?)([^`<]+?)(?:\s*<[^>`]+>)?`")


def rewrite_roles(text: str) -> str:
    """``text`` with each ``:role:`target` `` replaced by `` `target` `` (`` `last` `` for ``~a.b.last``)."""

    def code(match: re.Match[str]) -> str:
        short, target = match.groups()
        return f"`{target.rsplit('.', 1)[-1] if short else target}`"

    return ROLE.sub(code, text)


class _RolesPreprocessor(Preprocessor):
    def run(self, lines: list[str]) -> list[str]:
        return rewrite_roles("\n".join(lines)).split("\n")


class RstRolesExtension(Extension):
    """A Markdown extension running :func:`rewrite_roles` before any other processing."""

    def extendMarkdown(self, md: Markdown) -> None:  # noqa: N802 (Markdown's API)
        md.preprocessors.register(_RolesPreprocessor(md), "fedray_rst_roles", 40)


def on_config(config: Any) -> Any:
    config.markdown_extensions.append(RstRolesExtension())
    return config
