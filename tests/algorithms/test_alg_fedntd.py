"""FedNTD's not-true distillation, Ray-free."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from fedray.algorithms.losses import not_true_distillation
from fedray.models import set_flat_weights

from fedray.testing import Federation
from federation_helpers import assert_same_round_as


def toy(seed: int = 0, n: int = 5, classes: int = 4):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, classes, generator=g), torch.randn(n, classes, generator=g), torch.randint(0, classes, (n,), generator=g)


def test_zero_beta_is_fedavg(tmp_path):
    assert_same_round_as(tmp_path, ["algorithm.name=fedntd", "algorithm.beta=0"], ["algorithm.name=fedavg"])


def test_at_the_first_step_the_term_and_its_gradient_are_zero():
    local, _, labels = toy()
    local.requires_grad_(True)
    loss = not_true_distillation(local, local.detach().clone(), labels, tau=2.0)
    loss.backward()
    assert abs(float(loss.detach())) < 1e-7 and float(local.grad.abs().max()) < 1e-7


def test_the_true_class_logit_gets_no_gradient():
    local, global_logits, labels = toy(1)
    local.requires_grad_(True)
    not_true_distillation(local, global_logits, labels, tau=1.0).backward()
    assert torch.equal(local.grad.gather(1, labels[:, None]), torch.zeros(5, 1))
    assert float(local.grad.abs().sum()) > 0


def test_a_constant_shift_of_the_local_logits_changes_nothing():
    local, global_logits, labels = toy(2)
    base = not_true_distillation(local, global_logits, labels, tau=1.5)
    assert torch.allclose(not_true_distillation(local + 7.0, global_logits, labels, tau=1.5), base, atol=1e-6)


def test_four_class_toy_matches_the_hand_computed_kl():
    local, global_logits, label, tau = [1.0, 2.0, 0.0, -1.0], [0.5, 0.0, 1.0, 2.0], 1, 2.0

    def softmax(values):
        exps = [math.exp(v / tau) for v in values]
        return [e / sum(exps) for e in exps]

    p = softmax([z for c, z in enumerate(global_logits) if c != label])
    q = softmax([z for c, z in enumerate(local) if c != label])
    expected = sum(pi * math.log(pi / qi) for pi, qi in zip(p, q))
    loss = not_true_distillation(torch.tensor([local]), torch.tensor([global_logits]), torch.tensor([label]), tau)
    assert float(loss) == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("form, beta", [("official", 0.7), ("convex", 0.3)])
def test_both_forms_combine_ce_and_ntd_as_documented(tmp_path, form, beta):
    tau = 2.0
    federation = Federation(tmp_path, ["algorithm.name=fedntd", f"algorithm.form={form}", f"algorithm.beta={beta}", f"algorithm.tau={tau}"])
    ctx = federation.worker.client_context(1, 0, -1)
    received = federation.state["weights"]
    set_flat_weights(ctx.model, received)
    loss_fn = federation.algorithm.local_loss(ctx, {"weights": received})
    set_flat_weights(ctx.model, received + 0.05 * torch.randn(received.shape, generator=torch.Generator().manual_seed(0)))
    x, y = next(ctx.batches())
    loss, terms = loss_fn(x, y)
    logits = ctx.model(x)
    ce = F.cross_entropy(logits, y)
    set_flat_weights(ctx.model, received)
    with torch.no_grad():
        global_logits = ctx.model(x)
    ntd = not_true_distillation(logits, global_logits, y, tau)
    expected = ce + beta * tau**2 * ntd if form == "official" else (1 - beta) * ce + beta * ntd
    assert float(ntd.detach()) > 0 and torch.allclose(loss, expected, atol=1e-5)
    assert torch.allclose(terms["ntd"], ntd.detach(), atol=1e-6)


def test_convex_form_needs_beta_at_most_one():
    from fedray import load_config

    with pytest.raises(ValueError, match="algorithm.beta"):
        load_config(None, ["algorithm.name=fedntd", "algorithm.form=convex", "algorithm.beta=2"])
