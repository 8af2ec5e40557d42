"""``char_lstm``: a small sequence model for token sequences (LEAF's Shakespeare model, smaller).

The label of a sequence is predicted from the LSTM's output at its last position: for next-token
prediction (``pystdlib_chars``) the label is the token that follows the sequence, a classification
over the vocabulary as in LEAF Shakespeare; for text classification it is the class. Sequences are
left-padded with id 0, so the last position is always a real token.

For ``data.task: language_modeling`` (``per_position``) every position is predicted: the features
are the LSTM's outputs ``[B, T, width]`` and the logits ``[B, T, V]``, the next token at each position.
"""

from __future__ import annotations

import torch
from torch import nn

from fedray.models.base import FedModel

EMBEDDING_DIM = 8  # LEAF Shakespeare's character embedding size


class CharLSTMEncoder(nn.Module):
    """embedding(V→8)-LSTM(8→w)-LSTM(w→w), the last position's hidden state."""

    def __init__(self, vocab_size: int, width: int, per_position: bool = False) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, EMBEDDING_DIM)
        self.lstm = nn.LSTM(EMBEDDING_DIM, width, num_layers=2, batch_first=True)
        self.per_position = per_position

    def forward_with_taps(self, tokens: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        embedded = self.embedding(tokens)
        outputs, _ = self.lstm(embedded)
        features = outputs if self.per_position else outputs[:, -1]
        return features, [embedded.mean(dim=1), features]

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.forward_with_taps(tokens)[0]


class CharLSTM(FedModel):
    """``char_lstm``: 8-d token embedding, a 2-layer LSTM of ``model.width`` units and a linear
    classifier on the last position. Input: int64 token ids ``[B, T]``. ``feature_dim`` is the width.

    Taps: ``embedding`` (the mean embedding over positions, ``[B, 8]``) and ``lstm`` (the features,
    ``[B, width]``).
    """

    tap_names = ("embedding", "lstm")

    def __init__(self, vocab_size: int, num_classes: int, width: int, per_position: bool = False) -> None:
        super().__init__()
        self.feature_dim = width
        self.encoder = CharLSTMEncoder(vocab_size, width, per_position)
        self.projector = None
        self.classifier = nn.Linear(width, num_classes)

    def encode_with_taps(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        return self.encoder.forward_with_taps(x)
