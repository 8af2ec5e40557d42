"""FedProc, Ray-free: round 1 is FedAvg, the contrastive-weight schedule, the server prototypes,
no contrastive gradient without a prototype, and a single class gives ℓ ≡ 0."""

from __future__ import annotations

import pytest
import torch

from fedray.algorithms.base import ClientUpdate
from fedray.algorithms.fedproc import prototype_upload
from fedray.algorithms.losses import prototype_contrastive_loss
from fedray.runtime.reduction import PartialResult, merge_partials

from fedray.testing import Federation
from federation_helpers import assert_same_round_as


def test_round_one_is_fedavg(tmp_path):
    assert_same_round_as(tmp_path, ["algorithm.name=fedproc"], ["algorithm.name=fedavg"])


def test_later_rounds_train_with_the_prototypes(tmp_path):
    federation = Federation(tmp_path, ["algorithm.name=fedproc", "train.rounds=4"])
    metrics = federation.run_round(1, [0, 1, 2])
    assert metrics["prototype_classes"] == 10 and bool(federation.state["has_prototype"].all())
    broadcast = federation.algorithm.broadcast(federation.state, 2)
    update = federation.algorithm.client_update(federation.worker.client_context(2, 3, -1), broadcast)
    assert update.metrics["contrastive"] > 0


@pytest.mark.parametrize("rounds, expected", [(5, [1.0, 0.75, 0.5, 0.25, 0.0]), (1, [0.0])])
def test_linear_decay_reaches_zero_in_the_last_round(tmp_path, rounds, expected):
    algorithm = Federation(tmp_path, ["algorithm.name=fedproc", f"train.rounds={rounds}"]).algorithm
    assert [algorithm.contrastive_weight(t) for t in range(1, rounds + 1)] == pytest.approx(expected)


def test_constant_schedule_uses_mu(tmp_path):
    algorithm = Federation(tmp_path, ["algorithm.name=fedproc", "algorithm.schedule=constant", "algorithm.mu=0.3"]).algorithm
    assert algorithm.broadcast(algorithm.init_server_state(algorithm.build_model("global")), 7)["alpha_t"] == 0.3


@pytest.mark.parametrize("weighting", ["clients", "samples"])
def test_server_prototypes_are_the_hand_computed_means(tmp_path, weighting):
    federation = Federation(tmp_path, ["algorithm.name=fedproc", f"algorithm.proto_weighting={weighting}", "data.num_clients=3"])
    algorithm, d = federation.algorithm, federation.worker.model_for(None).feature_dim
    # three clients' class feature sums / counts over 10 classes; class 2 only at client 0, class 9 nowhere
    g = torch.Generator().manual_seed(0)
    counts = [
        torch.tensor([4, 1, 3, 0, 2, 2, 5, 1, 1, 0.0]),
        torch.tensor([2, 0, 0, 6, 1, 2, 5, 1, 1, 0.0]),
        torch.tensor([1, 3, 0, 2, 2, 2, 5, 1, 1, 0.0]),
    ]
    sums = [torch.randn(10, d, generator=g) * (c > 0).unsqueeze(1) for c in counts]
    partial = PartialResult()
    weights = federation.state["weights"]
    for client, (s, c) in enumerate(zip(sums, counts)):
        upload = {"weights": weights.double(), "num_samples": torch.tensor(1.0, dtype=torch.float64), **prototype_upload(s, c, weighting)}
        partial.add(client, ClientUpdate(sums=upload))
    new_state, _ = algorithm.aggregate(federation.state, 1, merge_partials([partial]))
    for cls in range(9):
        holders = [k for k in range(3) if counts[k][cls] > 0]
        if weighting == "clients":
            expected = sum(sums[k][cls] / counts[k][cls] for k in holders) / len(holders)
        else:
            expected = sum(sums[k][cls] for k in holders) / sum(counts[k][cls] for k in holders)
        assert torch.allclose(new_state["prototypes"][cls], expected, atol=1e-5), cls
    assert new_state["has_prototype"].tolist() == [True] * 9 + [False]


def test_samples_without_a_prototype_get_no_contrastive_gradient():
    g = torch.Generator().manual_seed(1)
    features = torch.randn(6, 4, generator=g, requires_grad=True)
    labels = torch.tensor([0, 1, 2, 0, 2, 1])
    prototypes, classes = torch.randn(2, 4, generator=g), torch.tensor([0, 2])  # class 1 has none
    prototype_contrastive_loss(features, labels, prototypes, classes, 1.0, None).backward()
    assert torch.equal(features.grad[labels == 1], torch.zeros(2, 4))
    assert bool((features.grad[labels != 1].abs().sum(dim=1) > 0).all())


def test_a_single_prototype_class_gives_zero_loss():
    g = torch.Generator().manual_seed(2)
    features, prototype = torch.randn(5, 4, generator=g), torch.randn(1, 4, generator=g)
    loss = prototype_contrastive_loss(features, torch.zeros(5, dtype=torch.long), prototype, torch.tensor([0]), 0.5, None)
    assert float(loss) == pytest.approx(0.0, abs=1e-7)
