"""Small convolutional networks: the benchmark CNN for digits/MNIST and the classic CIFAR CNN.

Neither network has normalisation layers, so ``model.norm`` does not apply to them (the factory
ignores it). Both take any number of input channels.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fedray.models.base import FedModel


class SmallCNNEncoder(nn.Module):
    """conv(C→w, 3×3, pad 1)-ReLU-conv(w→2w, 3×3, pad 1)-ReLU-maxpool2-flatten
    -fc(2w·(H/2)²→64)-ReLU."""

    def __init__(self, in_channels: int, image_size: int, width: int, feature_dim: int) -> None:
        super().__init__()
        pooled = image_size // 2
        if pooled < 1:
            raise ValueError(f"cnn_small needs image_size >= 2, got {image_size}")
        self.conv1 = nn.Conv2d(in_channels, width, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(width, 2 * width, kernel_size=3, padding=1)
        self.fc = nn.Linear(2 * width * pooled * pooled, feature_dim)

    def forward_with_taps(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        h1 = F.relu(self.conv1(x))
        h2 = F.max_pool2d(F.relu(self.conv2(h1)), 2)
        features = F.relu(self.fc(h2.flatten(1)))
        return features, [h1, h2, features]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_with_taps(x)[0]


class SmallCNN(FedModel):
    """``cnn_small``: the benchmark CNN for 8×8 digits and 28×28 MNIST-like inputs.

    With ``width=16`` on 1×8×8 inputs this is exactly conv(1→16)-ReLU-conv(16→32)-ReLU-maxpool2-
    fc(512→64)-ReLU-fc(64→10) (38,282 parameters for 10 classes). The encoder ends at the 64-d
    post-ReLU feature; the classifier is the last fc.

    Taps: ``conv1`` (after ReLU, ``[B, w, H, W]``), ``conv2`` (after ReLU and the pool,
    ``[B, 2w, H/2, W/2]``), ``fc`` (the 64-d features).
    """

    tap_names = ("conv1", "conv2", "fc")

    def __init__(self, in_channels: int, image_size: int, num_classes: int, width: int = 16) -> None:
        super().__init__()
        self.feature_dim = 64
        self.encoder = SmallCNNEncoder(in_channels, image_size, width, self.feature_dim)
        self.projector = None
        self.classifier = nn.Linear(self.feature_dim, num_classes)

    def encode_with_taps(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        return self.encoder.forward_with_taps(x)


def _valid_conv5_pool(size: int) -> int:
    """Spatial size after an unpadded 5×5 conv and a 2×2 max-pool."""
    return (size - 4) // 2


class CifarCNNEncoder(nn.Module):
    """conv5×5(C→c1)-ReLU-pool2 → conv5×5(c1→c2)-ReLU-pool2 → flatten → fc(c2·s²→k)-ReLU."""

    def __init__(self, in_channels: int, image_size: int, channels: tuple[int, int], feature_dim: int) -> None:
        super().__init__()
        spatial = _valid_conv5_pool(_valid_conv5_pool(image_size))
        if spatial < 1:
            raise ValueError(f"cnn_cifar needs image_size >= 16, got {image_size}")
        c1, c2 = channels
        self.conv_block1 = nn.Sequential(nn.Conv2d(in_channels, c1, kernel_size=5), nn.ReLU(), nn.MaxPool2d(2))
        self.conv_block2 = nn.Sequential(nn.Conv2d(c1, c2, kernel_size=5), nn.ReLU(), nn.MaxPool2d(2))
        self.fc1 = nn.Linear(c2 * spatial * spatial, feature_dim)

    def forward_with_taps(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        h1 = self.conv_block1(x)
        h2 = self.conv_block2(h1)
        features = F.relu(self.fc1(h2.flatten(1)))
        return features, [h1, h2, features]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_with_taps(x)[0]


class CifarCNN(FedModel):
    """``cnn_cifar``: the two-conv CIFAR CNN of McMahan et al. (2017), with the exact layer sizes of
    PFLlib's ``FedAvgCNN``, the model the FedCoSR paper describes (docs/algorithms_personalized.md)::

        conv_block1: Conv2d(C, 2w, 5, padding 0) -> ReLU -> MaxPool2d(2)
        conv_block2: Conv2d(2w, 4w, 5, padding 0) -> ReLU -> MaxPool2d(2)
        fc1:         Linear(4w·5·5 on 32×32 | 4w·4·4 on 28×28, 512) -> ReLU     (the feature)
        classifier:  Linear(512, num_classes)

    ``width`` w is a base width so that the config default (16) gives ``FedAvgCNN``'s 32 and 64 conv
    channels. The encoder (FedCoSR's shared φ) ends at the post-ReLU 512-d fc1 output, as in PFLlib
    (the paper says only "an FC layer with k output features"); the classifier is FedCoSR's
    personal head π.

    Taps: ``conv_block1``, ``conv_block2`` (each after ReLU and pool) and ``fc1`` (the features).
    """

    tap_names = ("conv_block1", "conv_block2", "fc1")

    def __init__(self, in_channels: int, image_size: int, num_classes: int, width: int = 16) -> None:
        super().__init__()
        self.feature_dim = 512  # k = 512: PFLlib's value; the FedCoSR paper does not give k
        self.encoder = CifarCNNEncoder(in_channels, image_size, (2 * width, 4 * width), self.feature_dim)
        self.projector = None
        self.classifier = nn.Linear(self.feature_dim, num_classes)

    def encode_with_taps(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        return self.encoder.forward_with_taps(x)
