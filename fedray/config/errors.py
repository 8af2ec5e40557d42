"""The error of a bad input found before a run starts (a config key, a command-line option, a file).
Its own module, below everything that raises it: :mod:`fedray.config.loader` (which re-exports it),
:mod:`fedray.config.references` and the schema's validators, so that none of them imports another
only for it."""

from __future__ import annotations

from typing import Iterable


class ConfigError(ValueError):
    """A bad input, found before the run starts: ``fedray`` prints it and exits with code 2.

    - ``key``: what the problem line names first: a config key (``data.alpha``), a command-line
      option (``--top``, ``--set data.alpha``) or a file (``c.yaml``); None when ``message`` says it all.
    - ``message``: what is wrong and what is allowed.
    - ``within``: the input that holds ``key``, named in the header line ``invalid {within}:``:
      ``"config"`` (the run config), ``"sweep file tune.yaml"``...; None where the problem line
      stands alone (a data file, a command-line option, an unreadable config file).
    - ``more``: further ``(key, message)`` problems of the same input, one line each (a pydantic
      validation error lists every field it refuses).

    ``str(error)`` is what ``fedray`` prints after ``fedray:``::

        invalid config:
          data.alpha: Input should be greater than 0 (got -1)
    """

    def __init__(
        self, key: str | None, message: str, *, within: str | None = "config", more: Iterable[tuple[str | None, str]] = ()
    ) -> None:
        super().__init__(key, message)
        self.key, self.message, self.within, self.more = key, message, within, tuple(more)

    @property
    def detail(self) -> str:
        """The problem line(s) without the header (what a sweep records for a trial refused on its config)."""
        return "\n  ".join(message if key is None else f"{key}: {message}" for key, message in ((self.key, self.message), *self.more))

    def __str__(self) -> str:
        return self.detail if self.within is None else f"invalid {self.within}:\n  {self.detail}"
