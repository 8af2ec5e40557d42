"""Ray-free tests of FedBN (BatchNorm layers stay on their clients), through the real worker code
in-process: the split, what reaches the server, the per-client BN state and its reduction to FedAvg."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedray.algorithms.fedbn import batchnorm_keys
from fedray.algorithms.personalized import ParameterSplit
from fedray import load_config
from fedray.data import build_federated_dataset
from fedray.models import build_model, get_flat_weights, state_keys
from fedray.runtime.state_store import NO_STATE
from fedray.runtime.worker import ClientWorker

from fedray.testing import Federation
from test_personalized import TINY, simulate

REPO = Path(__file__).resolve().parents[2]
RESNET_BN = ["model.name=resnet8", "model.norm=batch"]


def _model(overrides: list[str]):
    cfg = load_config(None, overrides)
    return build_model(cfg.model, build_federated_dataset(cfg.data, 0).info)


@pytest.fixture(scope="module")
def fedbn_run(tmp_path_factory):
    """Two rounds of FedBN on resnet8 with BatchNorm, every client every round."""
    return Federation(tmp_path_factory.mktemp("fedbn"), TINY + ["algorithm.name=fedbn", *RESNET_BN]).run(2)


def test_batchnorm_entries_are_found_by_module_type():
    model = _model(RESNET_BN)
    keys = batchnorm_keys(model)
    assert keys[:4] == ["encoder.stem.1.weight", "encoder.stem.1.bias", "encoder.stem.1.running_mean", "encoder.stem.1.running_var"]
    assert any(".shortcut.1." in k for k in keys) and any(".norm2." in k for k in keys)
    assert not any("num_batches_tracked" in k for k in keys)  # integer buffer, outside the flat layout
    assert all(k.endswith(("weight", "bias", "running_mean", "running_var")) for k in keys)
    bn_modules = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert len(keys) == 4 * len(bn_modules)
    assert batchnorm_keys(_model([])) == [] and batchnorm_keys(_model(["model.name=resnet8", "model.norm=group"])) == []


def test_split_from_keys_matches_the_keys_and_rejects_unknown_ones():
    model = _model(RESNET_BN)
    keys = batchnorm_keys(model)
    split = ParameterSplit.from_keys(model, keys)
    assert split.personal_keys == tuple(keys)
    flat = get_flat_weights(model)
    bn_values = torch.cat([model.state_dict()[k].flatten() for k in keys])
    assert torch.equal(split.personal(flat), bn_values)
    assert split.num_shared + split.num_personal == flat.numel()
    assert torch.equal(split.join(split.shared(flat), split.personal(flat)), flat)
    with pytest.raises(ValueError, match="num_batches_tracked"):
        ParameterSplit.from_keys(model, ["encoder.stem.1.num_batches_tracked"])


@pytest.mark.slow
def test_bn_entries_never_reach_the_server(fedbn_run):
    """Property (a): the BN positions are not in ``split.shared_index``, so never in ``sums``."""
    split = fedbn_run.algorithm.split
    keys = state_keys(fedbn_run.initial_model)
    position_key = [k for k in keys for _ in range(fedbn_run.initial_model.state_dict()[k].numel())]
    assert {position_key[i] for i in split.shared_index.tolist()}.isdisjoint(split.personal_keys)
    for results in fedbn_run.results:
        assert set(results.sums) == {"weights", "num_samples"}
        assert results.sums["weights"].numel() == split.num_shared


def test_server_bn_positions_never_change(fedbn_run):
    """Property (b): the global model's BN entries are θ_0's after every round, while the rest moved."""
    algorithm = fedbn_run.algorithm
    theta_0 = get_flat_weights(fedbn_run.initial_model)
    split = algorithm.split
    model = algorithm.build_model("global")
    algorithm.load_global_model(model, algorithm.broadcast(fedbn_run.state, 3))
    now = get_flat_weights(model)
    assert torch.equal(split.personal(now), split.personal(theta_0))
    assert not torch.equal(split.shared(now), split.shared(theta_0))
    assert torch.equal(fedbn_run.state["initial_personal"], split.personal(theta_0))


def test_each_client_keeps_and_reloads_its_own_bn(fedbn_run, tmp_path):
    """Property (d): after a round two clients hold different BN running means; each reloads its own
    (also from a fresh worker reading the run's state store, as after a resume: property (e))."""
    run = fedbn_run
    algorithm, split = run.algorithm, run.algorithm.split
    mean_positions = torch.cat(
        [torch.full((run.initial_model.state_dict()[k].numel(),), k.endswith("running_mean")) for k in split.personal_keys]
    )
    states = [run.client_state(c)["personal"] for c in range(run.num_clients)]
    assert not torch.equal(states[0][mean_positions], states[1][mean_positions])
    fresh = ClientWorker(run.config.to_dict(), build_federated_dataset(run.config.data, run.config.seed), str(run.run_dir), use_gpu=False)
    broadcast = algorithm.broadcast(run.state, 3)
    for client_id in (0, 1):
        for worker in (run.workers[0], fresh):
            ctx = worker.client_context(3, client_id, int(run.versions[client_id]))
            algorithm.load_client_model(ctx, broadcast)
            shared, personal = split.read(ctx.model)
            assert torch.equal(personal, states[client_id])
            assert torch.equal(shared, run.state["weights"])
    never_trained = run.workers[0].client_context(3, 0, NO_STATE)
    algorithm.load_client_model(never_trained, broadcast)
    assert torch.equal(split.read(never_trained.model)[1], run.state["initial_personal"])


def test_without_batchnorm_fedbn_is_fedavg(tmp_path):
    """Property (c): a model without BatchNorm (cnn_small; GroupNorm ResNets have no BN entries
    either, see above) has nothing personal, and FedBN is FedAvg, bit for bit."""
    fedbn = simulate(tmp_path / "bn", "fedbn", rounds=2)
    fedavg = simulate(tmp_path / "avg", "fedavg", rounds=2)
    assert fedbn.algorithm.split.num_personal == 0
    assert torch.equal(fedbn.state["weights"], fedavg.state["weights"])


def test_example_config_is_a_batchnorm_model():
    config = load_config(REPO / "examples" / "fedbn_digits.yaml")
    assert config.algorithm.name == "fedbn" and config.model.norm == "batch"
    assert config.model.name.startswith("resnet")
    assert config.eval.personalized and config.data.client_test_fraction > 0
