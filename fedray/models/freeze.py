"""``model.freeze``: parameters kept at their starting values (docs/guide/your_model.md).

A frozen parameter gets ``requires_grad`` off, so no optimiser moves it, and its key goes into the
model's :attr:`~fedray.models.base.FedModel.frozen_keys`, so it leaves the flat layout that every
algorithm broadcasts, uploads, compresses, noises and aggregates (:mod:`fedray.models.weights`).
Nothing ever sends it, so it must already be the same on the server and on every worker: each of
them builds its model itself, and only weights read from a file (``model.init``, an ``hf:``
directory) are the same everywhere. A frozen parameter that no file supplied is refused.

A prefix matches whole name parts: ``encoder.layer1`` freezes ``encoder.layer1.0.conv1.weight``, not
``encoder.layer10.…``. BatchNorm running statistics under a frozen prefix are buffers, not
parameters: training mode still updates them, so they stay in the layout and are averaged as usual.
"""

from __future__ import annotations

from fedray.config import ConfigError
from fedray.models.base import FedModel


def _matches(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix if prefix.endswith(".") else prefix + ".")


def freeze_parameters(model: FedModel, prefixes: list[str], loaded: set[str] | None) -> None:
    """Freeze the parameters of ``model`` whose names start with one of ``prefixes`` and check that
    every frozen parameter (these and those :mod:`fedray.models.hf` froze for adapters) was read from a
    file: ``loaded`` holds the state-dict keys that were (``None``: a shapes-only build, nothing to
    check). Raises :class:`ConfigError` naming ``model.freeze`` with one line."""
    named = list(model.named_parameters(remove_duplicate=False))  # a tied weight under each of its names
    frozen = {id(p) for name, p in named if any(_matches(name, prefix) for prefix in prefixes)}
    unmatched = [prefix for prefix in prefixes if not any(_matches(name, prefix) for name, _ in named)]
    if unmatched:
        raise ConfigError(
            "model.freeze",
            f"{unmatched[0]!r} matches no parameter of {type(model).__name__} ({_nearest([name for name, _ in named], unmatched[0])})",
        )
    state = model.state_dict(keep_vars=True)
    for p in (p for _, p in named if id(p) in frozen):
        p.requires_grad_(False)
    model.frozen_keys = model.frozen_keys | {key for key, value in state.items() if id(value) in frozen}
    if loaded is None or not model.frozen_keys:
        return
    loaded_ids = {id(value) for key, value in state.items() if key in loaded}
    random = [key for key in model.frozen_keys if id(state[key]) not in loaded_ids]
    if random and not loaded:
        raise ConfigError(
            "model.freeze",
            "frozen parameters are never sent, so every worker must build them equal: load them from a file with "
            "model.init (or use an hf: model)",
        )
    if random:
        raise ConfigError(
            "model.freeze",
            f"{_some(sorted(random))} would keep a random initialisation that differs between workers: no file "
            "(model.init, the hf: directory) supplied them; freeze only loaded parameters",
        )


def _nearest(names: list[str], prefix: str, limit: int = 8) -> str:
    """What ``prefix`` could have named: the parts one level below the longest start of it that some
    parameter name has (``encoder.layer`` → ``encoder.conv1, encoder.layer1, …``)."""
    parts = prefix.rstrip(".").split(".")
    depth = next((k for k in range(len(parts) - 1, 0, -1) if any(_matches(name, ".".join(parts[:k])) for name in names)), 0)
    base = ".".join(parts[:depth])
    below = [name.split(".")[: depth + 1] for name in names if not base or _matches(name, base)]
    children = list(dict.fromkeys(".".join(part) for part in below if len(part) > depth))
    return f"{'its parameters' if not base else 'the parameters under ' + base} are in {_some(children, limit)}"


def _some(items: list[str], limit: int = 3) -> str:
    return ", ".join(items[:limit]) + (f" and {len(items) - limit} more" if len(items) > limit else "")
