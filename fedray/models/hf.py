"""Hugging Face ``transformers`` models: ``model.name: hf:<directory>`` (docs/guide/your_model.md).

The directory is one written by ``save_pretrained`` (``config.json`` and the weights); fedray reads it
with ``local_files_only=True`` and never the network. What the run learns picks the head:

- ``data.task: language_modeling``: ``AutoModelForCausalLM``, token ids ``[B, T]`` → logits
  ``[B, T, V]``; its vocabulary ``V`` must be the data's (``DatasetInfo.num_classes``);
- any other task: ``AutoModelForSequenceClassification`` with ``num_labels`` = the data's output size,
  token ids ``[B, T]`` → ``[B, C]``. The head is new when the directory holds another one (a causal
  LM's, or one for another label count), so it is trained. Padding (``config.pad_token_id``, else
  fedray's pad id 0) is masked out of the attention.

The model is wrapped like a user's module (:class:`~fedray.models.wrap.WrappedModule`): the
classifier is the head (a causal LM's output layer, a classifier's last ``nn.Linear``, or the
submodule ``model.classifier`` names), the encoder is the rest of the model, which with the head
replaced by ``nn.Identity`` returns the head's input (``[B, T, H]`` hidden states, ``[B, H]`` pooled
features). ``model.kwargs`` overrides keys of ``config.json`` (``hidden_dropout_prob: 0.0``).

``model.adapters.method: lora`` adds low-rank adapters with ``peft.get_peft_model`` (Hu et al., ICLR
2022): the base weights are frozen (:attr:`FedModel.frozen_keys`), so only the adapters, and a
classification head, are trained, broadcast and uploaded.

``transformers`` and ``peft`` are imported here, only when such a model is built: ``import fedray``
stays fast.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from fedray.config import ConfigError
from fedray.config.loader import short_repr
from fedray.models.base import warn_once
from fedray.config.schema import HF_PREFIX
from fedray.models.wrap import WrappedModule, last_linear_name

if TYPE_CHECKING:
    from fedray.config.schema import ModelConfig
    from fedray.data.base import DatasetInfo

#: The task whose model scores every position with the vocabulary (a causal LM); every other task gets a
#: sequence classifier.
LANGUAGE_MODELING = "language_modeling"


class HFModel(WrappedModule):
    """A ``transformers`` model split into encoder and head (see the module docstring). It is called
    with ``input_ids`` (and an attention mask that hides ``pad_token_id``, when that is set) and its
    output's ``logits`` are what the module returns."""

    def __init__(self, module: nn.Module, classifier_name: str, pad_token_id: int | None) -> None:
        super().__init__(module, classifier_name)
        self.pad_token_id = pad_token_id

    def _module_output(self, x: torch.Tensor) -> torch.Tensor:
        mask = None if self.pad_token_id is None else (x != self.pad_token_id).long()
        return self.encoder(input_ids=x, attention_mask=mask).logits


def hf_directory(name: str) -> Path:
    """The ``save_pretrained`` directory ``hf:<directory>`` names; :class:`ConfigError` unless it holds a
    ``config.json`` (transformers would otherwise take the path for a Hub repository id)."""
    directory = Path(name.removeprefix(HF_PREFIX)).expanduser()
    if not (directory / "config.json").is_file():
        raise ConfigError("model.name", f"{name}: {directory} is not a directory written by save_pretrained (it has no config.json)")
    return directory


def _import(package: str) -> ModuleType:
    try:
        return importlib.import_module(package)
    except ImportError:
        raise ConfigError("model.name", f"hf: models need {package}, which is not installed (pip install 'fedray[hf]')") from None


def build_hf_model(cfg: ModelConfig, info: DatasetInfo, task: str) -> tuple[HFModel, set[str] | None]:
    """The :class:`HFModel` of ``cfg.name`` for ``info`` and ``task`` (``data.task``), with its adapters,
    and the state-dict keys whose values came from the directory (``None`` for a shapes-only build
    under ``torch.device("meta")``, which reads no weights)."""
    directory = hf_directory(cfg.name)
    transformers = _import("transformers")
    if info.modality != "tokens":
        raise ConfigError("model.name", f"{cfg.name} takes token ids, not {info.describe()}")
    causal = task == LANGUAGE_MODELING
    auto = transformers.AutoModelForCausalLM if causal else transformers.AutoModelForSequenceClassification
    with _quiet(transformers):
        try:
            config = transformers.AutoConfig.from_pretrained(directory, local_files_only=True, **cfg.kwargs)
        except Exception as error:  # a config.json transformers cannot read
            raise ConfigError("model.name", f"{cfg.name}: {short_repr(error, 300)}") from None
        _check_sizes(cfg.name, config, info, causal)
        if not causal:
            config.num_labels = info.num_classes
            if config.pad_token_id is None:
                from fedray.data.formats import PAD_ID  # fedray's own token data pads with it

                config.pad_token_id = PAD_ID
        module, fresh = _load(auto, directory, config, cfg.name, causal)
        head = cfg.classifier or (_output_layer_name(module, cfg.name) if causal else last_linear_name(module))
        unexpected = sorted(key for key in fresh or () if causal or not key.startswith(head + "."))  # a classifier's head is new
        if unexpected:
            warn_once(f"{cfg.name}: not in the directory, so randomly initialised: {', '.join(unexpected)}")
        loaded_ids = None if fresh is None else {id(value) for key, value in module.state_dict(keep_vars=True).items() if key not in fresh}
        try:
            model = HFModel(module, head, None if causal else config.pad_token_id)
        except ValueError as error:
            raise ConfigError("model.name" if cfg.classifier is None else "model.classifier", str(error)) from None
        if cfg.adapters.method == "lora":
            model.encoder = _with_lora(model.encoder, cfg)
    state = model.state_dict(keep_vars=True)
    if cfg.adapters.method != "none":
        model.frozen_keys = frozenset(key for key, value in state.items() if isinstance(value, nn.Parameter) and not value.requires_grad)
    loaded = None if loaded_ids is None else {key for key, value in state.items() if id(value) in loaded_ids}
    return model, loaded


@contextmanager
def _quiet(transformers: ModuleType) -> Iterator[None]:
    """transformers' progress bars and load report, and peft's warnings, on every build on every worker
    say nothing that fedray does not check or say itself (a new head is expected; any other weight the
    directory lacks is logged by :func:`build_hf_model`); errors still show."""
    hf_logging = transformers.utils.logging
    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def _check_sizes(name: str, config: Any, info: DatasetInfo, causal: bool) -> None:
    """The data's token ids, sequence length and (language modelling) vocabulary against the model's,
    so that a mismatch is one line instead of an index error inside the model."""
    vocabulary = int(config.vocab_size)
    if int(info.vocab_size or 0) > vocabulary:
        raise ConfigError(
            "model.name",
            f"{name} has a vocabulary of {vocabulary} tokens, the data {info.vocab_size} (use the model's tokenizer: data.tokenizer)",
        )
    if causal and info.num_classes != vocabulary:
        raise ConfigError(
            "model.name", f"{name} predicts {vocabulary} tokens, the data's language model {info.num_classes} (use the model's tokenizer)"
        )
    positions = getattr(config, "max_position_embeddings", None)
    if positions is not None and info.seq_len > positions:
        raise ConfigError("model.name", f"{name} takes sequences of at most {positions} tokens, the data has {info.seq_len} (data.seq_len)")


def _load(auto: Any, directory: Path, config: Any, name: str, causal: bool) -> tuple[nn.Module, set[str] | None]:
    """The model and the keys the directory did not supply (a new head), or ``None`` under the meta
    device, where only its shapes are built. Weights are float32, as the flat layout is."""
    try:
        if torch.get_default_device().type == "meta":
            return auto.from_config(config), None
        module, loading = auto.from_pretrained(
            directory, config=config, local_files_only=True, ignore_mismatched_sizes=not causal, output_loading_info=True
        )
    except Exception as error:  # an architecture without such a head, unreadable weights
        raise ConfigError("model.name", f"{name}: {short_repr(error, 300)}") from None
    fresh = set(loading["missing_keys"]) | {key if isinstance(key, str) else key[0] for key in loading["mismatched_keys"]}
    return module.float(), fresh


def _output_layer_name(module: nn.Module, name: str) -> str:
    layer = module.get_output_embeddings()
    found = next((child_name for child_name, child in module.named_modules() if child is layer), None) if layer is not None else None
    if not found:
        raise ConfigError("model.name", f"{name} has no output layer (get_output_embeddings()); set model.classifier")
    return found


def _with_lora(encoder: nn.Module, cfg: ModelConfig) -> nn.Module:
    """``encoder`` (the model without its head) with LoRA adapters injected by ``peft``, which turns
    ``requires_grad`` off on every other parameter of it. The head is outside: a classifier's, new for
    this data, is trained; a language model's is its input embedding (tied), frozen with it."""
    peft = _import("peft")
    adapters = cfg.adapters
    lora = peft.LoraConfig(
        r=adapters.rank, lora_alpha=adapters.alpha, lora_dropout=adapters.dropout, target_modules=adapters.target_modules
    )
    try:
        return peft.get_peft_model(encoder, lora).get_base_model()
    except ValueError as error:  # no module matches target_modules, or peft has no default for the architecture
        names = list(dict.fromkeys(key.rsplit(".", 1)[-1] for key, child in encoder.named_modules() if _has_weight_matrix(child)))
        raise ConfigError(
            "model.adapters.target_modules", f"{str(error).splitlines()[0]} (the model's layers include {', '.join(names[:12])})"
        ) from None


def _has_weight_matrix(module: nn.Module) -> bool:
    """A layer that LoRA can adapt: a leaf holding a weight of two or more dimensions."""
    weight = getattr(module, "weight", None)
    return not any(module.children()) and isinstance(weight, torch.Tensor) and weight.dim() >= 2
