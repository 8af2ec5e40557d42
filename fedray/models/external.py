"""Models from outside fedray, and starting weights for any model (docs/guide/your_model.md).

``model.name: package.module:Name`` names the user's ``nn.Module`` class or a function that returns
one, imported like ``algorithm.name`` (from the current directory or ``sys.path``; the runtime ships
its module to the Ray workers). It is called with keyword arguments only:

- those of the dataset that its signature names (:func:`dataset_arguments`): ``num_classes`` and
  ``input_shape`` always; ``in_channels`` / ``channels`` and ``image_size`` for images;
  ``vocab_size`` and ``seq_len`` for tokens; ``num_features`` for feature vectors. A ``**kwargs``
  catch-all receives none of them;
- every key of ``model.kwargs``, which win over the dataset's.

What it returns is used as is when it is a :class:`~fedray.models.base.FedModel` (full control:
taps, a custom split); any other ``nn.Module`` that maps a batch to logits is wrapped by
:class:`~fedray.models.wrap.WrappedModule` (its classifier: the last ``nn.Linear``, or
``model.classifier``).

``model.name: torchvision:NAME`` builds ``torchvision.models.get_model(NAME, weights=None,
num_classes=..., **model.kwargs)``: untrained, never a download (load weights with ``model.init``).
torchvision's models take 3-channel images; a 1-channel image is repeated to 3 channels in front of
the model (no parameters), other channel counts are refused.

``model.init: path.pt``: a ``state_dict`` saved with ``torch.save``, loaded with
``weights_only=True`` into every model fedray builds (so the server's initial model, and each
Hetero-SSFL client's, start from it). Its keys are either the built model's (``encoder.…``,
``classifier.…``) or, for a wrapped module, the module's own (``fc.weight``); ``projector.`` entries
may be missing (the projection head fedray adds keeps its random initialisation). The file must be
readable at the same (absolute) path on every node that builds models. ``model.init_strict: false``
loads only the entries whose names and shapes match (a backbone trained elsewhere, e.g. torchvision's
ImageNet weights saved to a file, under a head sized for this data) and lists every other one in one
warning; a file that matches nothing is still an error.

Every failure is a :class:`~fedray.config.ConfigError` naming the key, raised while
:func:`fedray.runtime.experiment.prepare_data` builds the model, before Ray starts.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Callable

import torch
from torch import nn

from fedray.config import ConfigError
from fedray.config.loader import short_repr
from fedray.config.references import import_reference
from fedray.config.schema import HF_PREFIX, TORCHVISION_PREFIX
from fedray.models.base import FedModel, warn_once
from fedray.models.wrap import WrappedModule

if TYPE_CHECKING:
    from fedray.config.schema import ModelConfig
    from fedray.data.base import DatasetInfo

logger = logging.getLogger(__name__)


def model_factory(name: str) -> Callable[..., Any]:
    """The class or function ``model.name`` names (torchvision's builder function for
    ``torchvision:NAME``, fedray's :func:`~fedray.models.hf.build_hf_model` for ``hf:<directory>``, once
    the directory is found to hold a saved model); raises :class:`ConfigError` naming ``model.name``."""
    if name.startswith(HF_PREFIX):
        from fedray.models.hf import build_hf_model, hf_directory  # the hf module imports this one

        hf_directory(name)
        return build_hf_model
    if name.startswith(TORCHVISION_PREFIX):
        architecture = name.removeprefix(TORCHVISION_PREFIX)
        try:
            import torchvision.models
        except ImportError:
            raise ConfigError("model.name", f"{name} needs torchvision, which is not installed (pip install torchvision)") from None
        if architecture not in torchvision.models.list_models(module=torchvision.models):
            raise ConfigError(
                "model.name",
                f"{architecture!r} is not a torchvision classification model (e.g. resnet18, mobilenet_v3_small; "
                "torchvision.models.list_models(module=torchvision.models) lists them)",
            )
        return torchvision.models.get_model_builder(architecture)
    factory = import_reference(name, "model.name")
    if not callable(factory):
        raise ConfigError("model.name", f"{name} is a {type(factory).__name__}, not an nn.Module class or a function returning one")
    return factory


def dataset_arguments(info: DatasetInfo) -> dict[str, Any]:
    """Every keyword argument the dataset offers a user's model (see the module docstring)."""
    arguments: dict[str, Any] = {"num_classes": info.num_classes, "input_shape": info.input_shape}
    if info.modality == "image":
        arguments.update(in_channels=info.channels, channels=info.channels, image_size=info.image_size)
    elif info.modality == "tokens":
        arguments.update(vocab_size=info.vocab_size, seq_len=info.seq_len)
    else:
        arguments.update(num_features=info.num_features)
    return arguments


def _named_parameters(factory: Callable[..., Any]) -> set[str]:
    """The parameter names ``factory`` takes by keyword (none when its signature cannot be read)."""
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return set()
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {parameter.name for parameter in parameters if parameter.kind in keyword}


def build_external_model(cfg: ModelConfig, info: DatasetInfo) -> FedModel:
    """The FedModel of a ``torchvision:NAME`` or ``package.module:Name`` model for ``info`` (without
    the projection head and ``model.init``, which :func:`fedray.models.build_model` adds)."""
    factory = model_factory(cfg.name)
    grey_to_rgb = False
    if cfg.name.startswith(TORCHVISION_PREFIX):
        if info.modality != "image" or info.channels not in (1, 3):
            raise ConfigError("model.name", f"torchvision models take 3-channel (or 1-channel, repeated) images, not {info.describe()}")
        if "weights" in cfg.kwargs:
            raise ConfigError(
                "model.kwargs",
                "weights: fedray builds torchvision models untrained (no download); load a state_dict with model.init "
                "(model.init_strict: false for a head of another size)",
            )
        arguments = {"num_classes": info.num_classes, **cfg.kwargs, "weights": None}
        grey_to_rgb = info.channels == 1
    else:
        accepted = _named_parameters(factory)
        arguments = {key: value for key, value in dataset_arguments(info).items() if key in accepted} | cfg.kwargs
    try:
        module = factory(**arguments)
    except Exception as error:  # the user's constructor: any failure is a bad model config
        call = f"{cfg.name}({', '.join(arguments)})"
        raise ConfigError("model.name", f"{call} raised {short_repr(error, 300)}") from None
    if not isinstance(module, nn.Module):
        raise ConfigError("model.name", f"{cfg.name} returned a {type(module).__name__}, not a torch.nn.Module")
    if isinstance(module, FedModel):
        if cfg.classifier is not None:
            raise ConfigError("model.classifier", f"{cfg.name} builds a fedray.FedModel, which names its own classifier")
        return module
    try:
        return WrappedModule(module, cfg.classifier, grey_to_rgb=grey_to_rgb)
    except ValueError as error:
        raise ConfigError("model.name" if cfg.classifier is None else "model.classifier", str(error)) from None


def load_initial_weights(model: FedModel, path: str, strict: bool = True) -> set[str] | None:
    """Load the ``model.init`` state dict at ``path`` into ``model`` (see the module docstring) and
    return the keys (``model.state_dict()``'s names) it loaded. Raises :class:`ConfigError` naming
    ``model.init`` for a missing or unreadable file and, when ``strict``, for missing, unexpected or
    differently shaped entries (else only when no entry fits). A shapes-only model (built under
    ``torch.device("meta")``) holds no weights and is left as it is (``None``: nothing was read)."""
    expected = model.state_dict()
    if any(value.is_meta for value in expected.values()):
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ConfigError("model.init", f"no file {path}") from None
    except Exception as error:  # pickle errors, or an object weights_only refuses to load
        raise ConfigError("model.init", f"cannot load {path} with torch.load(weights_only=True): {short_repr(error, 300)}") from None
    if not isinstance(state, Mapping) or not all(isinstance(value, torch.Tensor) for value in state.values()):
        raise ConfigError("model.init", f"{path} holds a {type(state).__name__}, not a state_dict (a mapping of names to tensors)")
    candidates = [dict(state)]
    if isinstance(model, WrappedModule):
        candidates.append(model.keyed_as_wrapped(dict(state)))  # saved from the user's own module
    state = max(candidates, key=lambda candidate: len(candidate.keys() & expected.keys()))
    missing = [key for key in expected if key not in state and not key.startswith("projector.")]
    unexpected = [key for key in state if key not in expected]
    mismatched = [
        f"{key} {list(state[key].shape)} vs {list(expected[key].shape)}"
        for key in state
        if key in expected and state[key].shape != expected[key].shape
    ]
    fitting = {key: value for key, value in state.items() if key in expected and value.shape == expected[key].shape}
    if strict:
        problems = [
            f"{label} {_some(keys)}" for label, keys in (("missing", missing), ("unexpected", unexpected), ("shape of", mismatched)) if keys
        ]
        if problems:
            raise ConfigError(
                "model.init",
                f"{path} does not fit model {type(model).__name__}: " + "; ".join(problems) + " (model.init_strict: false loads what fits)",
            )
    elif not fitting:
        raise ConfigError(
            "model.init",
            f"{path} matches no entry of model {type(model).__name__} by name and shape (its keys: {_some(list(state))}; "
            f"the model's: {_some(list(expected))})",
        )
    else:
        skipped = [
            f"{label}: {', '.join(keys)}"
            for label, keys in (("not in the file", missing), ("not in the model", unexpected), ("other shape", mismatched))
            if keys
        ]
        if skipped:
            warn_once(f"model.init {path}: loaded {len(fitting)} of the model's {len(expected)} entries; skipped " + "; ".join(skipped))
    model.load_state_dict(fitting, strict=False)
    return set(fitting)


def _some(items: list[str], limit: int = 3) -> str:
    return ", ".join(items[:limit]) + (f" and {len(items) - limit} more" if len(items) > limit else "")
