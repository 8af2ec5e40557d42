"""Flat-vector views of a model's floating-point state, for fast per-client weight loading and
aggregation.

The flat layout is the model's ``state_dict()`` order restricted to floating-point entries
(parameters and float buffers such as BatchNorm running statistics; integer buffers such as
``num_batches_tracked`` are left out), each entry flattened and concatenated. Two models of the same
architecture therefore share one layout, so algorithms can average, subtract or ship weights as one
``float32`` tensor. ``prefixes`` restricts every helper to the keys that start with any of them,
e.g. ``("encoder.",)`` for FedCoSR's shared layers.

Two kinds of entries are left out, so that every algorithm handles only what clients train, without
knowing why:

- the model's ``frozen_keys`` (``model.freeze``, and the base weights under ``model.adapters``, set by
  :func:`fedray.models.build_model`): their values come from files and are the same on the server and
  every worker, so they are never broadcast, uploaded, compressed, noised or aggregated. The
  attribute, not ``requires_grad``, is the criterion: algorithms turn ``requires_grad`` off on copies
  of a model (teachers, BYOL targets) whose layout must stay the model's;
- a second name of a tensor already in the layout (tied weights: a language model's output layer is
  its input embedding), which would otherwise be averaged twice and written back twice.

Neither exists in a built-in model, so their layout is every floating-point entry.
"""

from __future__ import annotations

import torch
from torch import nn


def _entries(model: nn.Module, prefixes: tuple[str, ...] | None) -> list[tuple[str, torch.Tensor]]:
    frozen: frozenset[str] = getattr(model, "frozen_keys", frozenset())
    seen: set[int] = set()  # ids of the tensors already in the layout (keep_vars: a tied tensor is one object)
    entries = []
    for key, value in model.state_dict(keep_vars=True).items():
        if not value.is_floating_point() or key in frozen or id(value) in seen:
            continue
        seen.add(id(value))
        if prefixes is None or key.startswith(prefixes):
            entries.append((key, value.detach()))
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
    linear loss terms ``Σ_p ⟨d_p, p − a_p⟩``. A frozen parameter has no slice: it gets zeros, so its
    term is 0 (it takes no gradient and no step anyway)."""
    offsets: dict[str, int] = {}
    offset = 0
    for key, value in _entries(model, None):
        offsets[key] = offset
        offset += value.numel()
    if flat.dim() != 1 or flat.numel() != offset:
        raise ValueError(f"flat vector must be 1-D with {offset} elements, got shape {tuple(flat.shape)}")
    return [
        flat[offsets[name] : offsets[name] + p.numel()].view_as(p) if name in offsets else flat.new_zeros(p.shape)
        for name, p in model.named_parameters()
    ]


def parameter_counts(model: nn.Module) -> dict[str, int]:
    """``parameters_total``: the model's parameters (a tied tensor once); ``parameters_uploaded``: those
    in the flat layout, which clients train and upload (all of them, less ``model.freeze`` and, under
    ``model.adapters``, everything but the adapters and a classification head). Float buffers (BatchNorm
    statistics) travel with the layout but are not parameters, so neither count has them."""
    names = {name for name, _ in model.named_parameters()}
    return {
        "parameters_total": sum(p.numel() for p in model.parameters()),
        "parameters_uploaded": sum(value.numel() for key, value in _entries(model, None) if key in names),
    }
