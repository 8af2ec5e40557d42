"""FedRep (Collins et al., "Exploiting Shared Representations for Personalized Federated Learning",
ICML 2021).

A shared body φ (the representation) and a personal head h per client. Per round a client (paper
Alg. 1):

1. loads the global φ^t and its own head h_k (θ_0's head before its first round);
2. **head phase**: ``algorithm.head_epochs`` epochs (the paper's τ_h) of cross-entropy on h only,
   φ frozen (Eq. 3's h-update);
3. **body phase**: ``train.local_epochs`` epochs (τ_φ) of cross-entropy on φ only, h frozen;
4. uploads ``n_k · φ_k`` (summed in the workers); h_k goes to the client state store.

The server averages φ weighted by sample count (the paper averages uniformly over the sampled
clients; fedray's personalised family weights by size, as FedPer and FedCoSR do). Each phase gets a
fresh ``train.optimizer``; the frozen part has ``requires_grad`` off, so it gets no gradient at all
(weight decay and clipping included). In the head phase the body's BatchNorm running statistics
still update in train mode, as in the official code and PFLlib (immaterial for BN-free CNNs).

Paper symbol → config key: h's parameters → ``algorithm.personal_prefixes`` (default
``["classifier."]``, the last linear layer); τ_h → ``algorithm.head_epochs`` (default 10, the
official README's ``--local_ep 11 --local_rep_ep 1``; PFLlib — and so probably FedCoSR's Table II —
uses 1); τ_φ → ``train.local_epochs``; η → ``train.lr``. With ``head_epochs: 0`` it is FedPer with
a frozen head.

Evaluation: as FedPer (:mod:`fedray.algorithms.personalized`): global φ plus the client's own head
on its held-out split (``personal_accuracy``); ``test_accuracy`` (φ with θ_0's head) means little.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from pydantic import Field

from fedray.algorithms.base import Broadcast, ClientContext, ClientUpdate
from fedray.algorithms.local import local_train
from fedray.algorithms.personalized import PersonalizedAlgorithm, PersonalizedParams


class FedRepParams(PersonalizedParams):
    head_epochs: int = Field(10, ge=0, description="epochs τ_h of head-only training before the body epochs")


@contextmanager
def trainable_only(model: torch.nn.Module, trainable: list[torch.nn.Parameter]) -> Iterator[list[torch.nn.Parameter]]:
    """Turn ``requires_grad`` off for every parameter of ``model`` outside ``trainable`` for the
    duration (the worker's model is shared by all its clients, so it is always turned back on)."""
    keep = {id(p) for p in trainable}
    frozen = [p for p in model.parameters() if id(p) not in keep and p.requires_grad]
    for p in frozen:
        p.requires_grad_(False)
    try:
        yield trainable
    finally:
        for p in frozen:
            p.requires_grad_(True)


class FedRep(PersonalizedAlgorithm):
    name = "fedrep"
    Params = FedRepParams
    params: FedRepParams

    def client_update(self, ctx: ClientContext, broadcast: Broadcast) -> ClientUpdate:
        model = ctx.model
        metrics = self.load_client_model(ctx, broadcast)
        prefixes = self.personal_prefixes()
        head = [p for name, p in model.named_parameters() if name.startswith(prefixes)]
        body = [p for name, p in model.named_parameters() if not name.startswith(prefixes)]

        def base_loss(x: torch.Tensor, y: torch.Tensor):
            return self.task.loss(model(x), y), {}

        if self.params.head_epochs > 0:
            with trainable_only(model, head):
                head_metrics = local_train(ctx, base_loss, head, epochs=self.params.head_epochs)
            metrics["head_train_loss"] = head_metrics["train_loss"]
        with trainable_only(model, body):
            metrics.update(local_train(ctx, base_loss, body))
        metrics.update(self.post_train_metrics(ctx, broadcast))
        shared, personal = self.split.read(model)
        return ClientUpdate(sums=self.shared_sums(shared, ctx.num_samples), metrics=metrics, state={"personal": personal})
