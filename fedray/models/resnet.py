"""CIFAR-style ResNets (3×3 stride-1 stem, no max-pool) with BatchNorm or GroupNorm.

The three depths follow the papers' official code:

- ``resnet8``: FedSKC's ``ResNet_cifar(resnet_size=8, scaling=4)``: stem 64,
  three stages of one BasicBlock, widths 64/128/256, strides 1/2/2 → 256-d feature.
- ``resnet10``: FedSC's ``resnet10``: stem 64, four stages of one BasicBlock,
  widths 64/128/256/512, strides 1/2/2/2 → 512-d feature.
- ``resnet18``: FedRCL's ``ResNet18_base``: as ``resnet10`` with two BasicBlocks per stage.
  Hetero-SSFL's ResNet-18 is taken to be the same CIFAR-style variant, as in the FedU/FedEMA code
  its setup follows.

``norm="group"`` uses ``GroupNorm(2, C)`` everywhere, as FedRCL's code does (the paper says only
GroupNorm); ``norm="batch"`` uses ``BatchNorm2d``. The encoder ends with adaptive global average
pooling, so any input size works (32×32, 64×64, and 8×8 without crashing).

Taps (as in FedRCL's code): the stem output and every stage output, each taken **before** the ReLU
that ends it (pre-activation, FedRCL's ``feature_relu: False``); the classification path applies the
ReLU, so tapping does not change the logits. Tap names are ``stem``, ``stage1`` … ``stageN``
(FedRCL's conv1, conv2_x … conv5_x for ``resnet18``).

Convolutions use Kaiming-normal fan-out initialisation, N(0, sqrt(2/(k²·out_ch))), as FedSKC's code;
norm layers start at weight 1, bias 0; the linear layers keep PyTorch's default.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from fedray.models.base import FedModel

NormKind = Literal["batch", "group"]
GROUP_NORM_GROUPS = 2  # FedRCL's code; the paper does not give the group count
STEM_WIDTH = 64  # the stem of FedSC's, FedSKC's and FedRCL's ResNets


def norm_layer(kind: NormKind, channels: int) -> nn.Module:
    """``BatchNorm2d(channels)`` or ``GroupNorm(2, channels)``."""
    if kind == "batch":
        return nn.BatchNorm2d(channels)
    if kind == "group":
        return nn.GroupNorm(GROUP_NORM_GROUPS, channels)
    raise ValueError(f"norm must be 'batch' or 'group', got {kind!r}")


def _conv3x3(in_channels: int, out_channels: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    """conv3×3(stride s)-norm-ReLU-conv3×3-norm plus the shortcut (identity, or
    conv1×1(stride s)-norm when the shape changes). Returns the sum **before** the final ReLU;
    the stage applies it."""

    def __init__(self, in_channels: int, out_channels: int, stride: int, norm: NormKind) -> None:
        super().__init__()
        self.conv1 = _conv3x3(in_channels, out_channels, stride)
        self.norm1 = norm_layer(norm, out_channels)
        self.conv2 = _conv3x3(out_channels, out_channels)
        self.norm2 = norm_layer(norm, out_channels)
        if stride != 1 or in_channels != out_channels:
            self.shortcut: nn.Module = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                norm_layer(norm, out_channels),
            )
        else:
            self.shortcut = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.norm1(self.conv1(x)))
        return self.norm2(self.conv2(out)) + self.shortcut(x)


class ResNetEncoder(nn.Module):
    """Stem conv3×3(C→64)-norm, then one stage of BasicBlocks per entry of ``widths`` (the
    first stage stride 1, the others stride 2), then global average pool and flatten."""

    def __init__(
        self,
        in_channels: int,
        blocks_per_stage: tuple[int, ...],
        widths: tuple[int, ...],
        norm: NormKind,
    ) -> None:
        super().__init__()
        channels = STEM_WIDTH
        self.stem = nn.Sequential(_conv3x3(in_channels, channels), norm_layer(norm, channels))
        stages = []
        for index, (num_blocks, width) in enumerate(zip(blocks_per_stage, widths, strict=True)):
            blocks = []
            for block_index in range(num_blocks):
                stride = 2 if index > 0 and block_index == 0 else 1
                blocks.append(BasicBlock(channels, width, stride, norm))
                channels = width
            stages.append(nn.ModuleList(blocks))
        self.stages = nn.ModuleList(stages)
        self.out_channels = channels
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward_with_taps(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Features ``[B, out_channels]`` and the pre-ReLU stem and stage outputs."""
        pre_activation = self.stem(x)
        taps = [pre_activation]
        h = F.relu(pre_activation)
        for stage in self.stages:
            for block in stage:
                pre_activation = block(h)
                h = F.relu(pre_activation)
            taps.append(pre_activation)
        return F.adaptive_avg_pool2d(h, 1).flatten(1), taps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_with_taps(x)[0]


class ResNet(FedModel):
    """A CIFAR-style ResNet: :class:`ResNetEncoder` and a ``Linear(feature_dim, num_classes)``
    classifier; ``feature_dim`` is the last stage's width. See the module docstring for the
    depths, taps and sources."""

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        blocks_per_stage: tuple[int, ...],
        widths: tuple[int, ...],
        norm: NormKind = "batch",
    ) -> None:
        super().__init__()
        self.encoder = ResNetEncoder(in_channels, blocks_per_stage, widths, norm)
        self.feature_dim = self.encoder.out_channels
        self.projector = None
        self.classifier = nn.Linear(self.feature_dim, num_classes)
        self.tap_names = ("stem",) + tuple(f"stage{i + 1}" for i in range(len(widths)))

    def encode_with_taps(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        return self.encoder.forward_with_taps(x)


def resnet8(in_channels: int, num_classes: int, norm: NormKind = "batch") -> ResNet:
    """FedSKC's ResNet-8 (width ×4): [1, 1, 1] blocks, 64/128/256, 256-d feature."""
    return ResNet(in_channels, num_classes, (1, 1, 1), (64, 128, 256), norm)


def resnet10(in_channels: int, num_classes: int, norm: NormKind = "batch") -> ResNet:
    """FedSC's ResNet-10: [1, 1, 1, 1] blocks, 64/128/256/512, 512-d feature."""
    return ResNet(in_channels, num_classes, (1, 1, 1, 1), (64, 128, 256, 512), norm)


def resnet18(in_channels: int, num_classes: int, norm: NormKind = "batch") -> ResNet:
    """FedRCL's ResNet-18: [2, 2, 2, 2] blocks, 64/128/256/512, 512-d feature, five taps."""
    return ResNet(in_channels, num_classes, (2, 2, 2, 2), (64, 128, 256, 512), norm)
