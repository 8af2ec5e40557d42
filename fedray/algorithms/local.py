"""The local SGD loop shared by every algorithm's ``client_update``.

An algorithm supplies only its loss; this module owns the optimiser, the learning-rate decay,
gradient clipping and the running means of the loss terms.
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch
from torch.optim.sgd import sgd

from fedray.algorithms.base import ClientContext, Tensor
from fedray.config import TrainConfig

# (x [b, C, H, W] normalised, y [b]) → (total loss, {term name: value} for the metrics)
LossFn = Callable[[Tensor, Tensor], tuple[Tensor, dict[str, Tensor]]]


class ClientSGD:
    """``torch.optim.SGD(lr, momentum, weight_decay)``'s update, bit for bit, through PyTorch's
    functional ``torch.optim.sgd.sgd``; only ``zero_grad`` and ``step``.

    Why not ``torch.optim.SGD`` itself: every ``torch.optim.Optimizer`` imports ``torch._dynamo`` the
    first time one is built in a process (``add_param_group`` is wrapped in ``torch._disable_dynamo``).
    That import costs ~1.5 CPU-seconds in every worker process, at the worst moment: the first round,
    while the other processes of a run are still starting (benchmarks/startup.py)."""

    def __init__(self, parameters: Iterable[torch.nn.Parameter], lr: float, momentum: float, weight_decay: float) -> None:
        self.parameters = [p for p in parameters if p.requires_grad]
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.momentum_buffers: list[Tensor | None] = [None] * len(self.parameters)  # created by the first step

    def zero_grad(self) -> None:
        for parameter in self.parameters:
            parameter.grad = None

    @torch.no_grad()
    def step(self) -> None:
        """Parameters without a gradient this step are skipped, their momentum kept, as in torch.optim.SGD."""
        stepped = [i for i, p in enumerate(self.parameters) if p.grad is not None]
        buffers = [self.momentum_buffers[i] for i in stepped]
        sgd(
            [self.parameters[i] for i in stepped],
            [self.parameters[i].grad for i in stepped],
            buffers,
            weight_decay=self.weight_decay,
            momentum=self.momentum,
            lr=self.lr,
            dampening=0.0,
            nesterov=False,
            maximize=False,
        )
        for i, buffer in zip(stepped, buffers):  # sgd() puts a new buffer in the list on a first step
            self.momentum_buffers[i] = buffer


def make_optimizer(parameters: Iterable[torch.nn.Parameter], train: TrainConfig, lr: float) -> ClientSGD | torch.optim.Adam:
    """The client optimiser named by ``train.optimizer`` (fresh per client: no state leaks between clients)."""
    if train.optimizer == "adam":
        return torch.optim.Adam(parameters, lr=lr, weight_decay=train.weight_decay)
    return ClientSGD(parameters, lr=lr, momentum=train.momentum, weight_decay=train.weight_decay)


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
        optimizer.zero_grad()
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
