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
``mlp``        :class:`~fedray.models.mlp.MLP` (features, images)   ``model.width``
``char_lstm``  :class:`~fedray.models.char_lstm.CharLSTM` (tokens)  ``model.width``
=============  ===================================================  =========================

or a model from outside fedray: ``torchvision:NAME`` or the user's ``package.module:Name``, wrapped
into a :class:`FedModel` (:mod:`fedray.models.external`, :mod:`fedray.models.wrap`), or a Hugging Face
model saved with ``save_pretrained``, ``hf:<directory>`` (:mod:`fedray.models.hf`, with LoRA adapters
under ``model.adapters``). ``model.init`` loads starting weights into any of them (``model.init_strict:
false``: those that fit), and ``model.freeze`` keeps parameters at those weights, out of the flat
layout every algorithm exchanges (:mod:`fedray.models.freeze`).

``model.width`` applies to the CNNs only and ``model.norm`` to the ResNets only (the CNNs have no
normalisation layers). ``model.projection_dim`` adds :func:`projection_head` as ``projector``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from fedray.config.references import is_reference
from fedray.config.schema import HF_PREFIX
from fedray.models.base import FedModel
from fedray.models.char_lstm import CharLSTM
from fedray.models.cnn import CifarCNN, SmallCNN
from fedray.models.external import build_external_model, load_initial_weights
from fedray.models.freeze import freeze_parameters
from fedray.models.mlp import MLP
from fedray.models.resnet import ResNet, resnet8, resnet10, resnet18
from fedray.tasks import task_class
from fedray.models.weights import get_flat_weights, num_flat_weights, parameter_counts, set_flat_weights, state_keys

if TYPE_CHECKING:
    from fedray.config.schema import ModelConfig
    from fedray.data.base import DatasetInfo

# Each builder takes the model config, the data's info and whether the task needs one output per token
# (language modelling) rather than per sample.
_BUILDERS: dict[str, Callable[[ModelConfig, DatasetInfo, bool], FedModel]] = {
    "cnn_small": lambda cfg, info, per_position: SmallCNN(info.channels, info.image_size, info.num_classes, cfg.width),
    "cnn_cifar": lambda cfg, info, per_position: CifarCNN(info.channels, info.image_size, info.num_classes, cfg.width),
    "resnet8": lambda cfg, info, per_position: resnet8(info.channels, info.num_classes, cfg.norm),
    "resnet10": lambda cfg, info, per_position: resnet10(info.channels, info.num_classes, cfg.norm),
    "resnet18": lambda cfg, info, per_position: resnet18(info.channels, info.num_classes, cfg.norm),
    "mlp": lambda cfg, info, per_position: MLP(info.input_shape, info.num_classes, cfg.width),
    "char_lstm": lambda cfg, info, per_position: CharLSTM(info.vocab_size, info.num_classes, cfg.width, per_position),
}
# The data modalities (DatasetInfo.modality) each built-in model takes; the others take images only.
_INPUT_MODALITIES = {"mlp": ("features", "image"), "char_lstm": ("tokens",)}

MODEL_NAMES: tuple[str, ...] = tuple(_BUILDERS)


def projection_head(feature_dim: int, projection_dim: int) -> nn.Sequential:
    """The 2-layer MLP head of MOON (Li et al., 2021): Linear(d, d) → ReLU → Linear(d, p).

    FedSC, FedSKC and FedRCL use no head (neither their papers nor their official code has one);
    Hetero-SSFL's BYOL projector/predictor (:mod:`fedray.algorithms.ssl`) belongs to that algorithm.
    """
    return nn.Sequential(nn.Linear(feature_dim, feature_dim), nn.ReLU(), nn.Linear(feature_dim, projection_dim))


def build_model(cfg: ModelConfig, info: DatasetInfo, task: str = "classification") -> FedModel:
    """The model named by ``cfg.name`` for ``info``'s channels, image size and class count (a built-in
    one, ``torchvision:NAME`` / ``package.module:Name``: :mod:`fedray.models.external`, or
    ``hf:<directory>``: :mod:`fedray.models.hf`, whose head ``task``, the run's ``data.task``, picks),
    with a :func:`projection_head` as ``projector`` when ``cfg.projection_dim`` is set, starting from
    the weights in ``cfg.init`` when that is set, its ``cfg.freeze`` parameters frozen."""
    loaded: set[str] | None = set()  # the state-dict keys read from a file: what may be frozen
    if cfg.name.startswith(HF_PREFIX):
        from fedray.models.hf import build_hf_model  # imports transformers only when one is built

        model, loaded = build_hf_model(cfg, info, task)
    elif is_reference(cfg.name):  # torchvision:NAME or package.module:Name
        model = build_external_model(cfg, info)
    else:
        try:
            builder = _BUILDERS[cfg.name]
        except KeyError:
            raise ValueError(f"unknown model {cfg.name!r}; choose one of {MODEL_NAMES}") from None
        modalities = _INPUT_MODALITIES.get(cfg.name, ("image",))
        if info.modality not in modalities:
            raise ValueError(f"{cfg.name} takes {' or '.join(modalities)} input, not {info.modality}")
        model = builder(cfg, info, not task_class(task).per_sample_outputs)
    if cfg.projection_dim is not None:
        model.projector = projection_head(model.feature_dim, cfg.projection_dim)
    if cfg.init is not None:
        from_init = load_initial_weights(model, cfg.init, cfg.init_strict)
        loaded = None if loaded is None or from_init is None else loaded | from_init
    freeze_parameters(model, cfg.freeze, loaded)
    return model


def forward_flops(model: FedModel, info: DatasetInfo) -> int:
    """FLOPs of ``model``'s forward pass (features and logits) on one ``info``-shaped input, as
    counted by PyTorch's ``FlopCounterMode``: a client's compute per sample, for load balancing."""
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        model.eval()(info.dummy_input())
    return counter.get_total_flops()


__all__ = [
    "MODEL_NAMES",
    "CharLSTM",
    "CifarCNN",
    "FedModel",
    "MLP",
    "ResNet",
    "SmallCNN",
    "build_model",
    "forward_flops",
    "get_flat_weights",
    "num_flat_weights",
    "parameter_counts",
    "projection_head",
    "resnet10",
    "resnet18",
    "resnet8",
    "set_flat_weights",
    "state_keys",
]
