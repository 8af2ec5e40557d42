"""What every model must do with the data, checked on one small batch before a run starts
(:func:`fedray.runtime.experiment.prepare_data`): built-in models pass by construction, a user's
model (``model.name: package.module:Name`` or ``torchvision:NAME``) is refused with the shape it gave.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from fedray.models.base import FedModel
from fedray.models.wrap import WrappedModule

if TYPE_CHECKING:
    from fedray.data.base import DatasetInfo


def example_batch(info: DatasetInfo, batch_size: int = 2) -> torch.Tensor:
    """A deterministic batch of model inputs (as :meth:`DatasetInfo.normalize` returns them) whose
    samples differ from each other, so that comparing two computations on it means something; it
    draws nothing from any RNG."""
    batch = info.dummy_input(batch_size)
    if batch.is_floating_point():
        return torch.linspace(-1.0, 1.0, batch.numel()).view_as(batch)
    return (torch.arange(batch.numel()) % max(int(info.vocab_size or 1), 1)).view_as(batch)


@torch.no_grad()
def check_model_output(model: FedModel, info: DatasetInfo, name: str, per_position: bool = False) -> None:
    """Raise ``ValueError`` (a message about model ``name``) unless ``model``, in eval mode, maps a
    batch of ``info``'s inputs to features ``[B, feature_dim]`` and logits ``[B, num_classes]`` (with
    ``per_position``, the task's for language modelling: ``[B, T, feature_dim]`` and ``[B, T,
    num_classes]``, one vector per token) and, for a :class:`~fedray.models.wrap.WrappedModule`, unless
    ``classifier(encoder(x))`` equals the wrapped module's own output (its classifier is the last layer
    applied to the features)."""
    x = example_batch(info)
    batch = int(x.shape[0])
    per_sample = (batch, info.seq_len) if per_position else (batch,)
    shown = ", ".join(map(str, per_sample))
    was_training = model.training
    model.eval()
    try:
        try:
            features = model.encode(x)
            logits = model.classify(features)
        except Exception as error:  # whatever the user's forward raises
            # prepare_data reports the first line of this message
            raise ValueError(f"{name} fails on a batch of shape {list(x.shape)}: {type(error).__name__}: {error}") from None
        if not isinstance(logits, torch.Tensor) or tuple(logits.shape) != (*per_sample, info.num_classes):
            seen = list(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
            outputs = "batch × tokens × the vocabulary" if per_position else "batch × the data's classes"
            raise ValueError(
                f"{name} maps a batch of shape {list(x.shape)} to {seen}; fedray needs logits [{shown}, {info.num_classes}] ({outputs})"
            )
        if tuple(features.shape) != (*per_sample, model.feature_dim):
            raise ValueError(
                f"{name}'s features (the classifier's input) have shape {list(features.shape)}, not "
                f"[{shown}, {model.feature_dim}] ({'batch × tokens' if per_position else 'batch'} × feature_dim)"
            )
        if isinstance(model, WrappedModule):
            own = model.forward_unwrapped(x)
            if own.shape != logits.shape or not torch.allclose(own, logits, rtol=1e-4, atol=1e-5):
                raise ValueError(
                    f"{name}: classifier(features) is not the module's output, so {model.classifier_name!r} is not the "
                    "last layer applied to the features (return its logits, no softmax after it); set "
                    "model.classifier to the layer that is, or subclass fedray.FedModel"
                )
    finally:
        model.train(was_training)
