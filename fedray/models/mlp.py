"""``mlp``: a multilayer perceptron for feature vectors (tabular data), or flattened images."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from fedray.models.base import FedModel


class MLPEncoder(nn.Module):
    """flatten-fc(D→w)-ReLU-fc(w→w)-ReLU."""

    def __init__(self, input_dim: int, width: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(input_dim, width)
        self.fc2 = nn.Linear(width, width)

    def forward_with_taps(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        h1 = F.relu(self.fc1(x.flatten(1)))
        features = F.relu(self.fc2(h1))
        return features, [h1, features]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_with_taps(x)[0]


class MLP(FedModel):
    """``mlp``: two hidden layers of ``model.width`` units (ReLU) and a linear classifier.

    Input: float ``[B, D]`` features or ``[B, C, H, W]`` images (flattened). ``feature_dim`` is the
    width. Taps: ``fc1`` and ``fc2`` (the features), each ``[B, width]``.
    """

    tap_names = ("fc1", "fc2")

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, width: int) -> None:
        super().__init__()
        self.feature_dim = width
        self.encoder = MLPEncoder(math.prod(input_shape), width)
        self.projector = None
        self.classifier = nn.Linear(width, num_classes)

    def encode_with_taps(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        return self.encoder.forward_with_taps(x)
