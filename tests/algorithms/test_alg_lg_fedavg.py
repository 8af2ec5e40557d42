"""Ray-free tests of LG-FedAvg (local representation, global head), through the real worker code
in-process: its reductions to FedAvg and Local, what reaches the server, the next round's model."""

from __future__ import annotations

from pathlib import Path

import torch

from fedray import load_config
from fedray.data import build_federated_dataset
from fedray.algorithms import get_algorithm_class
from fedray.models import num_flat_weights

from test_personalized import simulate

REPO = Path(__file__).resolve().parents[2]


def test_nothing_personal_is_fedavg(tmp_path):
    """Property (a): ``personal_prefixes: []`` is bit-identical to FedAvg."""
    lg = simulate(tmp_path / "lg", "lg_fedavg", rounds=2, extra=["algorithm.personal_prefixes=[]"])
    fedavg = simulate(tmp_path / "fedavg", "fedavg", rounds=2)
    assert torch.equal(lg.state["weights"], fedavg.state["weights"])


def test_everything_personal_is_local(tmp_path):
    """Property (b): every part personal gives Local's per-client models, bit for bit."""
    lg = simulate(tmp_path / "lg", "lg_fedavg", rounds=2, extra=["algorithm.personal_prefixes=[encoder., classifier.]"])
    local = simulate(tmp_path / "local", "local", rounds=2)
    assert all(r.sums == {} for r in lg.results)
    for client_id in range(lg.num_clients):
        assert torch.equal(lg.client_state(client_id)["personal"], local.client_state(client_id)["personal"])


def test_encoder_never_reaches_the_server_and_every_client_takes_the_global_head(tmp_path):
    """Properties (c) and (d): the sums hold the classifier only; at the next round every client's
    model is its own stored encoder with the global head."""
    run = simulate(tmp_path, "lg_fedavg", rounds=2)
    head_size = num_flat_weights(run.initial_model, ("classifier.",))
    for results in run.results:
        assert set(results.sums) == {"weights", "num_samples"} and results.sums["weights"].numel() == head_size
    algorithm = run.algorithm
    broadcast = algorithm.broadcast(run.state, 3)
    bodies = []
    for client_id in range(run.num_clients):
        ctx = run.workers[0].client_context(3, client_id, int(run.versions[client_id]))
        algorithm.load_client_model(ctx, broadcast)
        shared, personal = algorithm.split.read(ctx.model)
        assert torch.equal(shared, run.state["weights"])
        assert torch.equal(personal, run.client_state(client_id)["personal"])
        bodies.append(personal)
    assert not torch.equal(bodies[0], bodies[1])
    assert run.rows[-1]["personal_accuracy"] > 0.5


def test_default_split_keeps_a_projection_head_local():
    config = load_config(None, ["algorithm.name=lg_fedavg", "model.projection_dim=16"])
    info = build_federated_dataset(config.data, 0).info
    algorithm = get_algorithm_class("lg_fedavg")(config, info)
    assert algorithm.personal_prefixes() == ("encoder.", "projector.")
    assert all(k.startswith(("encoder.", "projector.")) for k in algorithm.split.personal_keys)
    explicit = load_config(None, ["algorithm.name=lg_fedavg", "model.projection_dim=16", "algorithm.personal_prefixes=[encoder.]"])
    assert get_algorithm_class("lg_fedavg")(explicit, info).personal_prefixes() == ("encoder.",)
    no_projector = load_config(None, ["algorithm.name=lg_fedavg"])
    assert get_algorithm_class("lg_fedavg")(no_projector, info).personal_prefixes() == ("encoder.",)


def test_example_config_is_lg_fedavg():
    config = load_config(REPO / "examples" / "lg_fedavg_digits.yaml")
    assert config.algorithm.name == "lg_fedavg" and config.eval.personalized and config.data.client_test_fraction > 0
