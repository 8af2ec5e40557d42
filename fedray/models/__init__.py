"""Model factory and weight helpers.

:func:`build_model` maps ``model.name`` to an architecture sized for the dataset:

=============  ===================================================  =========================
name           architecture                                         feature_dim
=============  ===================================================  =========================
``cnn_small``  :class:`~fedray.models.cnn.SmallCNN` (benchmark CNN)  64
``cnn_cifar``  :class:`~fedray.models.cnn.CifarCNN` (FedCoSR)        512
``resnet8``    :func:`~fedray.models.resnet.resnet8` (FedSKC)        256
``resnet10``   :func:`~fedray.models.resnet.resnet10` (FedSC)        512
``resnet18``   :func:`~fedray.models.resnet.resnet18` (FedRCL)       512
=============  ===================================================  =========================

``model.width`` applies to the CNNs only and ``model.norm`` to the ResNets only (the CNNs have no
normalisation layers). ``model.projection_dim`` adds :func:`projection_head` as ``projector``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from fedray.models.base import FedModel
from fedray.models.cnn import CifarCNN, SmallCNN
from fedray.models.resnet import ResNet, resnet8, resnet10, resnet18
from fedray.models.weights import get_flat_weights, num_flat_weights, set_flat_weights, state_keys

if TYPE_CHECKING:
    from fedray.config.schema import ModelConfig
    from fedray.data.base import DatasetInfo

_BUILDERS: dict[str, Callable[[ModelConfig, DatasetInfo], FedModel]] = {
    "cnn_small": lambda cfg, info: SmallCNN(
        info.channels, info.image_size, info.num_classes, cfg.width
    ),
    "cnn_cifar": lambda cfg, info: CifarCNN(
        info.channels, info.image_size, info.num_classes, cfg.width
    ),
    "resnet8": lambda cfg, info: resnet8(info.channels, info.num_classes, cfg.norm),
    "resnet10": lambda cfg, info: resnet10(info.channels, info.num_classes, cfg.norm),
    "resnet18": lambda cfg, info: resnet18(info.channels, info.num_classes, cfg.norm),
}

MODEL_NAMES: tuple[str, ...] = tuple(_BUILDERS)


def projection_head(feature_dim: int, projection_dim: int) -> nn.Sequential:
    """The 2-layer MLP head of MOON (Li et al., 2021): Linear(d, d) → ReLU → Linear(d, p).

    FedSC, FedSKC and FedRCL use no head (neither their papers nor their official code has one);
    Hetero-SSFL's BYOL projector/predictor (:mod:`fedray.algorithms.ssl`) belongs to that algorithm.
    """
    return nn.Sequential(
        nn.Linear(feature_dim, feature_dim), nn.ReLU(), nn.Linear(feature_dim, projection_dim)
    )


def build_model(cfg: ModelConfig, info: DatasetInfo) -> FedModel:
    """The model named by ``cfg.name`` for ``info``'s channels, image size and class count, with a
    :func:`projection_head` as ``projector`` when ``cfg.projection_dim`` is set."""
    try:
        builder = _BUILDERS[cfg.name]
    except KeyError:
        raise ValueError(f"unknown model {cfg.name!r}; choose one of {MODEL_NAMES}") from None
    model = builder(cfg, info)
    if cfg.projection_dim is not None:
        model.projector = projection_head(model.feature_dim, cfg.projection_dim)
    return model


def forward_flops(model: FedModel, info: DatasetInfo) -> int:
    """FLOPs of ``model``'s forward pass (features and logits) on one ``info``-shaped image, as
    counted by PyTorch's ``FlopCounterMode``: a client's compute per sample, for load balancing."""
    image = torch.zeros(1, info.channels, info.image_size, info.image_size)
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        model.eval()(image)
    return counter.get_total_flops()


__all__ = [
    "MODEL_NAMES",
    "CifarCNN",
    "FedModel",
    "ResNet",
    "SmallCNN",
    "build_model",
    "forward_flops",
    "get_flat_weights",
    "num_flat_weights",
    "projection_head",
    "resnet10",
    "resnet18",
    "resnet8",
    "set_flat_weights",
    "state_keys",
]
