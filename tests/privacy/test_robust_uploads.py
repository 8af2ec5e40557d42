"""Robust rules over uploads besides the model weights (``Upload.robust``,
fedray.aggregation.robust.robust_sum): prototype sums per class, over the class means of the clients
that hold each class; SCAFFOLD's control-variate deltas over the clients; the refusals (whole-update
rules on per-class sums, local DP's noised counts, per-client payloads combined by the algorithm's
own rule). Ray-free: real engines and workers in this process (fedray.testing.Federation)."""

from __future__ import annotations

import pytest
import torch

from fedray.aggregation.robust import coordinate_median, robust_sum, trimmed_mean
from fedray.algorithms import get_algorithm_class
from fedray.config import ConfigError
from fedray.plugins import load_config
from fedray.runtime.experiment import prepare_data
from fedray.runtime.support import base_overrides
from fedray.testing import Federation

COHORT = [0, 2, 3, 5, 7]


def federation(tmp_path, name: str, *overrides: str) -> Federation:
    return Federation(tmp_path, [*base_overrides(get_algorithm_class(name), name), "train.clients_per_round=5", *overrides])


def test_robust_sum_per_class_takes_the_rule_over_the_holders_class_means():
    sums = torch.tensor([[[2.0, 4.0], [0.0, 0.0]], [[9.0, 9.0], [6.0, 3.0]], [[1.0, 1.0], [1.0, 1.0]]])  # [3 clients, 2 classes, 2]
    counts = torch.tensor([[2.0, 0.0], [3.0, 3.0], [1.0, 1.0]])  # client 0 does not hold class 1
    total, total_counts = robust_sum("median", sums, counts, 0.2, 1, None)
    assert torch.equal(total_counts, torch.tensor([6.0, 4.0]))
    # class 0: median of the means (1, 2), (3, 3), (1, 1) is (1, 2); class 1: mean of (2, 1) and (1, 1), the two holders
    assert torch.allclose(total[0] / 6.0, torch.tensor([1.0, 2.0]))
    assert torch.allclose(total[1] / 4.0, torch.tensor([1.5, 1.0]))
    vectors = torch.arange(12.0).view(3, 2, 2)
    summed, none = robust_sum("trimmed_mean", vectors, None, 0.34, 1, None)
    assert none is None and torch.equal(summed, 3 * trimmed_mean(vectors.view(3, -1), 0.34).view(2, 2))


@pytest.mark.parametrize("rule", ["median", "trimmed_mean"])
def test_fedprotos_server_prototypes_are_the_per_class_rule_over_the_clients_class_means(tmp_path, rule):
    run = federation(tmp_path, "fedproto", f"robust.rule={rule}", "robust.trim_fraction=0.2")
    updates = {client: run.client_update(1, client) for client in COHORT}  # the same seeded client steps as in the round
    run.run_round(1, COHORT)
    prototypes = run.state["prototypes"].double()
    sums = torch.stack([updates[client].sums["class_sums"].double() for client in COHORT])
    counts = torch.stack([updates[client].sums["class_counts"].double() for client in COHORT])
    assert bool((counts == 0).any())  # some client lacks some class: the rule runs over the holders only
    for c in range(counts.shape[1]):
        holders = counts[:, c] > 0
        if not bool(holders.any()):
            continue
        means = sums[holders, c] / counts[holders, c, None]
        expected = coordinate_median(means) if rule == "median" else trimmed_mean(means, 0.2)
        assert torch.allclose(prototypes[c], expected, rtol=1e-5, atol=1e-6), c
    plain = federation(tmp_path / "plain", "fedproto")
    plain.run_round(1, COHORT)
    assert not torch.allclose(plain.state["prototypes"].double(), prototypes, rtol=1e-5, atol=1e-6)  # the mean differs


def test_scaffolds_control_variate_moves_by_the_rule_over_the_clients_deltas(tmp_path):
    """c ← c + Σ Δc_i / N becomes c + |S| · median(Δc_i) / N."""
    run = federation(tmp_path, "scaffold", "robust.rule=median")
    deltas = torch.stack([run.client_update(1, client).sums["delta_control"].double() for client in COHORT])
    before = run.state["control"].double()
    run.run_round(1, COHORT)
    expected = before + len(COHORT) * coordinate_median(deltas) / run.num_clients
    assert torch.allclose(run.state["control"].double(), expected, rtol=1e-5, atol=1e-7)


def problems(name: str, *overrides: str) -> list[str]:
    config = load_config(None, [*base_overrides(get_algorithm_class(name), name), "train.clients_per_round=7", *overrides])
    with pytest.raises(ConfigError) as error:
        prepare_data(config)
    header, *lines = str(error.value).splitlines()
    assert header == "invalid config:"
    return lines


def test_what_a_rule_cannot_take_is_refused_with_its_reason():
    (krum,) = problems("fedproto", "robust.rule=krum")
    assert "fedproto uploads prototypes per class, and robust.rule=krum selects whole client updates" in krum
    (local,) = problems(
        "fedcosr",
        "robust.rule=median",
        "privacy.mechanism=local",
        "privacy.noise_multiplier=1",
        "privacy.clip_prototypes=1",
        "privacy.clip_counts=1",
    )
    assert "privacy.mechanism=local noises the counts" in local
    (fedsc,) = problems("fedsc", "robust.rule=median")
    assert "fedsc uploads prototypes, which its server combines client by client by its own rule, which robust.rule=median" in fedsc
    # SCAFFOLD's deltas live in one space on every client: a whole-update rule takes them
    prepare_data(
        load_config(None, [*base_overrides(get_algorithm_class("scaffold"), "scaffold"), "train.clients_per_round=7", "robust.rule=krum"])
    )
