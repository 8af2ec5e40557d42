"""Your own model in fedray: two ways to write one (docs/guide/your_model.md).

1. ``DigitsNet``: any ``torch.nn.Module`` that maps a batch to logits. fedray calls it with the keyword
   arguments its ``__init__`` names among ``num_classes``, ``in_channels`` / ``channels`` and
   ``image_size`` (plus ``model.kwargs``), and wraps it: its last ``nn.Linear`` (``head``) becomes
   the classifier, everything before it the encoder. Run it from this directory (the one that holds
   my_model.py)::

       fedray run ../my_model_digits.yaml
       fedray run ../my_model_digits.yaml --set algorithm.name=fedbn --set data.client_test_fraction=0.25 \\
           --set eval.personalized=true          # DigitsNet has BatchNorm, so FedBN accepts it

2. ``TappedDigitsNet``: a :class:`fedray.FedModel` subclass, used as is, for full control; it names its
   intermediate feature maps (``tap_names``), which FedRCL's multi-level loss needs::

       fedray run ../my_model_digits.yaml --set model.name=my_model:TappedDigitsNet --set algorithm.name=fedrcl
"""

from __future__ import annotations

import torch
from torch import nn

import fedray


class DigitsNet(nn.Module):
    """conv(C→w)-BN-ReLU → conv(w→2w)-BN-ReLU-maxpool2 → flatten → fc(→hidden)-ReLU → head(→classes)."""

    def __init__(self, in_channels: int, image_size: int, num_classes: int, width: int = 16, hidden: int = 64) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, kernel_size=3, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.Conv2d(width, 2 * width, kernel_size=3, padding=1),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(2 * width * (image_size // 2) ** 2, hidden),
            nn.ReLU(),
        )
        self.head = nn.Linear(hidden, num_classes)  # the last nn.Linear: fedray's classifier

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class TappedDigitsNet(fedray.FedModel):
    """The same network as a FedModel: ``encoder`` / ``classifier`` named by hand, and two taps."""

    tap_names = ("conv2", "hidden")

    def __init__(self, in_channels: int, image_size: int, num_classes: int, width: int = 16, hidden: int = 64) -> None:
        super().__init__()
        self.feature_dim = hidden
        self.encoder = nn.ModuleDict(
            {
                "conv": nn.Sequential(
                    nn.Conv2d(in_channels, width, kernel_size=3, padding=1),
                    nn.BatchNorm2d(width),
                    nn.ReLU(),
                    nn.Conv2d(width, 2 * width, kernel_size=3, padding=1),
                    nn.BatchNorm2d(2 * width),
                    nn.ReLU(),
                    nn.MaxPool2d(2),
                ),
                "fc": nn.Sequential(nn.Flatten(), nn.Linear(2 * width * (image_size // 2) ** 2, hidden), nn.ReLU()),
            }
        )
        self.projector = None  # model.projection_dim replaces it with fedray's projection head
        self.classifier = nn.Linear(hidden, num_classes)

    def encode_with_taps(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        conv = self.encoder["conv"](x)
        features = self.encoder["fc"](conv)
        return features, [conv, features]
