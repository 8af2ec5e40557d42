"""The local SGD loop shared by every algorithm's ``client_update``.

An algorithm supplies only its loss; this module owns the optimiser, the learning-rate decay,
gradient clipping and the running means of the loss terms.
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch

from fedray.algorithms.base import ClientContext, Tensor
from fedray.config import TrainConfig

# (x [b, C, H, W] normalised, y [b]) → (total loss, {term name: value} for the metrics)
LossFn = Callable[[Tensor, Tensor], tuple[Tensor, dict[str, Tensor]]]


def make_optimizer(parameters: Iterable[torch.nn.Parameter], train: TrainConfig, lr: float) -> torch.optim.Optimizer:
    """The client optimiser named by ``train.optimizer`` (fresh per client: no state leaks between clients)."""
    if train.optimizer == "adam":
        return torch.optim.Adam(parameters, lr=lr, weight_decay=train.weight_decay)
    return torch.optim.SGD(parameters, lr=lr, momentum=train.momentum, weight_decay=train.weight_decay)


def local_train(
    ctx: ClientContext,
    loss_fn: LossFn,
    parameters: Iterable[torch.nn.Parameter] | None = None,
    epochs: int | None = None,
    after_step: Callable[[], None] | None = None,
) -> dict[str, float]:
    """Run ``epochs`` (default ``train.local_epochs``) of mini-batch training of ``ctx.model`` on the
    client's data, minimising ``loss_fn``; ``after_step`` runs after every optimiser step (e.g. a BYOL
    target's moving average). Returns the mean of each loss term over the steps, with the total
    under ``"train_loss"``."""
    model = ctx.model
    model.train()
    parameters = list(model.parameters() if parameters is None else parameters)
    optimizer = make_optimizer(parameters, ctx.train, ctx.lr)
    totals: dict[str, Tensor] = {}  # kept on the device: no host sync per step
    steps = 0
    for x, y in ctx.batches(epochs):
        loss, terms = loss_fn(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if ctx.train.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(parameters, ctx.train.grad_clip)
        optimizer.step()
        if after_step is not None:
            after_step()
        steps += 1
        for name, value in {"train_loss": loss, **terms}.items():
            totals[name] = totals.get(name, 0.0) + value.detach()
    return {name: float(total) / max(steps, 1) for name, total in totals.items()}
