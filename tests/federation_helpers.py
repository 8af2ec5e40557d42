"""Comparisons of algorithms on :class:`fedray.testing.Federation`."""

from __future__ import annotations

import torch

from fedray.testing import Federation


def assert_same_round_as(tmp_path, overrides: list[str], reference: list[str], clients: tuple[int, ...] = (0, 2, 5)) -> None:
    """One round of ``overrides`` gives bit-identical global weights to one of ``reference``."""
    first, second = Federation(tmp_path / "first", overrides), Federation(tmp_path / "second", reference)
    first.run_round(1, list(clients))
    second.run_round(1, list(clients))
    assert torch.equal(first.state["weights"], second.state["weights"])
