"""The interface every fedray model exposes, so algorithms never edit a model.

A model is three named parts, and state-dict keys start with the part's name, so an algorithm can
select parameters by prefix (FedCoSR's shared ``encoder.`` vs personal ``classifier.``):

- ``encoder``: input ``[B, C, H, W]`` → features ``[B, feature_dim]`` (:meth:`encode`);
- ``projector``: optional head, features → ``[B, projection_dim]`` (:meth:`project`);
- ``classifier``: features → logits ``[B, num_classes]`` (:meth:`classify`).

:meth:`forward_with_taps` also returns intermediate feature maps (the model's ``tap_names``), for
multi-level losses such as FedRCL's.
"""

from __future__ import annotations

import functools
import logging

import torch
from torch import nn


class FedModel(nn.Module):
    """Base class: subclasses set ``encoder``, ``classifier``, ``feature_dim`` and ``tap_names``,
    and implement :meth:`encode_with_taps`."""

    encoder: nn.Module
    classifier: nn.Module
    projector: nn.Module | None
    feature_dim: int
    tap_names: tuple[str, ...]
    # State-dict keys of parameters that stay at the values they were built with (model.freeze, an
    # adapted model's base weights): left out of the flat layout (fedray.models.weights), so no
    # algorithm broadcasts, uploads or aggregates them. An attribute, so that deep copies keep it.
    frozen_keys: frozenset[str] = frozenset()

    def encode_with_taps(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Features ``[B, feature_dim]`` and the intermediate maps named by ``tap_names``, in order
        (each ``[B, C_i, H_i, W_i]`` or ``[B, D_i]``)."""
        raise NotImplementedError

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return self.encode_with_taps(x)[0]

    def classify(self, features: torch.Tensor) -> torch.Tensor:
        return self.classifier(features)

    def project(self, features: torch.Tensor) -> torch.Tensor:
        if self.projector is None:
            raise RuntimeError(f"{type(self).__name__} has no projection head; set model.projection_dim")
        return self.projector(features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classify(self.encode(x))

    def forward_with_taps(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """``(logits, features, taps)`` in one pass."""
        features, taps = self.encode_with_taps(x)
        return self.classify(features), features, taps


@functools.cache
def warn_once(message: str) -> None:
    """Log ``message`` once per process: every model fedray builds (the server's, each worker's, the
    checks') reads the same files, and what they lack is one fact, said once."""
    logging.getLogger("fedray.models").warning(message)
