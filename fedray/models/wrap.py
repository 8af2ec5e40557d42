"""Any ``torch.nn.Module`` that maps a batch to logits, as a :class:`~fedray.models.base.FedModel`.

The module's classifier (its last ``nn.Linear``, or the submodule ``model.classifier`` names) is taken
out and replaced by ``nn.Identity``, so that

- ``encoder`` = the module itself, which now returns the classifier's input: the features;
- ``classifier`` = the original layer, features → logits;

and every state-dict key starts with ``encoder.`` or ``classifier.`` (``projector.`` when
``model.projection_dim`` adds a head), which is what algorithms that select parameters by prefix
need (FedPer's personal head, FedCoSR's shared encoder, prototype algorithms' features). This split
is the module's own computation only if the classifier is the last thing applied to the features;
:func:`fedray.models.checks.check_model_output` verifies that on a batch before a run starts
(:meth:`WrappedModule.forward_unwrapped`).

A wrapped module has no feature taps (``tap_names = ()``): multi-level losses (FedRCL) need a
:class:`~fedray.models.base.FedModel` subclass that implements ``encode_with_taps``.
"""

from __future__ import annotations

import torch
from torch import nn

from fedray.models.base import FedModel


def last_linear_name(module: nn.Module) -> str:
    """The qualified name of the last ``nn.Linear`` registered in ``module`` (``"fc"``, ``"head.2"``)."""
    names = [name for name, child in module.named_modules() if name and isinstance(child, nn.Linear)]
    if not names:
        raise ValueError(
            f"{type(module).__name__} has no nn.Linear layer to use as the classifier; set model.classifier "
            "to the submodule that maps features to logits, or subclass fedray.FedModel"
        )
    return names[-1]


def classifier_in_features(classifier: nn.Module, name: str) -> int:
    """The feature size a classifier takes: its ``in_features`` (an ``nn.Linear``) or that of the first
    ``nn.Linear`` inside it (a head such as ``Sequential(Dropout, Linear)``)."""
    linear = next((m for m in classifier.modules() if isinstance(m, nn.Linear)), None)
    if linear is None:
        raise ValueError(f"the classifier {name!r} ({type(classifier).__name__}) contains no nn.Linear to take the feature size from")
    return linear.in_features


class WrappedModule(FedModel):
    """``module`` split into ``encoder`` (the module with its classifier replaced by ``nn.Identity``)
    and ``classifier``; see the module docstring.

    ``classifier_name``: the qualified submodule name of the classifier (default: the last
    ``nn.Linear``). ``grey_to_rgb``: repeat a 1-channel image batch to 3 channels before the module
    (torchvision models on greyscale data; no parameters, so the state dict is the module's own).
    """

    tap_names = ()

    def __init__(self, module: nn.Module, classifier_name: str | None = None, grey_to_rgb: bool = False) -> None:
        super().__init__()
        name = last_linear_name(module) if classifier_name is None else classifier_name
        try:
            classifier = module.get_submodule(name) if name else None
        except AttributeError:
            classifier = None
        if classifier is None:
            children = ", ".join(child for child, _ in module.named_children())
            raise ValueError(f"{type(module).__name__} has no submodule {name!r} (its top-level submodules: {children or 'none'})")
        self.feature_dim = classifier_in_features(classifier, name)
        module.set_submodule(name, nn.Identity())
        self.encoder = module
        self.projector = None
        self.classifier = classifier
        self.classifier_name = name
        self.grey_to_rgb = grey_to_rgb

    def _module_input(self, x: torch.Tensor) -> torch.Tensor:
        return x.expand(-1, 3, -1, -1) if self.grey_to_rgb else x

    def _module_output(self, x: torch.Tensor) -> torch.Tensor:
        """What the module returns for ``x``: the features while its classifier is ``nn.Identity``."""
        return self.encoder(self._module_input(x))

    def encode_with_taps(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        return self._module_output(x), []

    @torch.no_grad()
    def forward_unwrapped(self, x: torch.Tensor) -> torch.Tensor:
        """The module's own output, with its classifier back in place: what :meth:`forward` must equal."""
        self.encoder.set_submodule(self.classifier_name, self.classifier)
        try:
            return self._module_output(x)
        finally:
            self.encoder.set_submodule(self.classifier_name, nn.Identity())

    def keyed_as_wrapped(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``state`` (keyed as the unwrapped module's own ``state_dict()``) keyed as this model's:
        the classifier's entries under ``classifier.``, every other entry under ``encoder.``."""
        prefix = self.classifier_name + "."
        return {
            ("classifier." + key.removeprefix(prefix)) if key.startswith(prefix) else ("encoder." + key): value
            for key, value in state.items()
        }
