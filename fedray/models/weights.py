"""Flat-vector views of a model's floating-point state, for fast per-client weight loading and
aggregation.

The flat layout is the model's ``state_dict()`` order restricted to floating-point entries
(parameters and float buffers such as BatchNorm running statistics; integer buffers such as
``num_batches_tracked`` are left out), each entry flattened and concatenated. Two models of the same
architecture therefore share one layout, so algorithms can average, subtract or ship weights as one
``float32`` tensor. ``prefixes`` restricts every helper to the keys that start with any of them,
e.g. ``("encoder.",)`` for FedCoSR's shared layers.
"""

from __future__ import annotations

import torch
from torch import nn


def _entries(model: nn.Module, prefixes: tuple[str, ...] | None) -> list[tuple[str, torch.Tensor]]:
    entries = [
        (key, value)
        for key, value in model.state_dict().items()
        if value.is_floating_point() and (prefixes is None or key.startswith(prefixes))
    ]
    if not entries:
        raise ValueError(
            f"{type(model).__name__} has no floating-point state-dict entries"
            + ("" if prefixes is None else f" starting with any of {prefixes}")
        )
    return entries


def state_keys(model: nn.Module, prefixes: tuple[str, ...] | None = None) -> list[str]:
    """The keys of the flat layout: floating-point ``state_dict()`` entries, in order."""
    return [key for key, _ in _entries(model, prefixes)]


def num_flat_weights(model: nn.Module, prefixes: tuple[str, ...] | None = None) -> int:
    """Length of the flat vector of :func:`get_flat_weights`."""
    return sum(value.numel() for _, value in _entries(model, prefixes))


def get_flat_weights(model: nn.Module, prefixes: tuple[str, ...] | None = None) -> torch.Tensor:
    """A detached 1-D ``float32`` copy of the selected entries, on the model's device."""
    with torch.no_grad():
        return torch.cat([value.reshape(-1).float() for _, value in _entries(model, prefixes)])


def set_flat_weights(model: nn.Module, flat: torch.Tensor, prefixes: tuple[str, ...] | None = None) -> None:
    """Copy ``flat`` (the layout of :func:`get_flat_weights`) into the model in place: no tensor of
    the model is re-allocated, so optimizers and references to its parameters stay valid."""
    entries = _entries(model, prefixes)
    expected = sum(value.numel() for _, value in entries)
    if flat.dim() != 1 or flat.numel() != expected:
        raise ValueError(f"flat weights must be 1-D with {expected} elements, got shape {tuple(flat.shape)}")
    flat = flat.to(entries[0][1].device)
    offset = 0
    with torch.no_grad():
        for _, value in entries:
            value.copy_(flat[offset : offset + value.numel()].view_as(value))
            offset += value.numel()


def parameter_mask(model: nn.Module) -> torch.Tensor:
    """A CPU ``bool`` vector over the flat layout: True at the entries of ``named_parameters()``,
    False at float buffers (BatchNorm running statistics). Server optimizers, control variates and
    FedDyn's state are defined on parameters only."""
    names = {name for name, _ in model.named_parameters()}
    return torch.cat([torch.full((value.numel(),), key in names, dtype=torch.bool, device="cpu") for key, value in _entries(model, None)])


def parameter_views(model: nn.Module, flat: torch.Tensor) -> list[torch.Tensor]:
    """Views of ``flat`` (the full flat layout) shaped like ``model.parameters()``, in that order:
    per-parameter slices of a flat vector (a direction, or the weights a round started from), for
    linear loss terms ``Σ_p ⟨d_p, p − a_p⟩``."""
    offsets: dict[str, int] = {}
    offset = 0
    for key, value in _entries(model, None):
        offsets[key] = offset
        offset += value.numel()
    if flat.dim() != 1 or flat.numel() != offset:
        raise ValueError(f"flat vector must be 1-D with {offset} elements, got shape {tuple(flat.shape)}")
    return [flat[offsets[name] : offsets[name] + p.numel()].view_as(p) for name, p in model.named_parameters()]
