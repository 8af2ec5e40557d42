"""Ray-free tests of the personalised-FL machinery (split models, personal parts in client state,
personalised evaluation), of FedPer and Local, and of FedCoSR's first round and its reductions to
them, run through the real worker code in-process."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedray.algorithms.personalized import ParameterSplit
from fedray import load_config
from fedray.config import ConfigError
from fedray.data import build_federated_dataset
from fedray.models import build_model, get_flat_weights, num_flat_weights
from fedray.runtime.state_store import NO_STATE

from fedray.testing import Federation

REPO = Path(__file__).resolve().parents[2]

TINY = [
    "data.num_clients=6",
    "data.partition=shards",
    "data.classes_per_client=2",
    "data.client_test_fraction=0.25",
    "eval.personalized=true",
    "train.clients_per_round=6",
    "train.local_epochs=1",
    "resources.num_workers=2",
]


def simulate(tmp_path: Path, algorithm: str, rounds: int, extra: list[str] = ()) -> Federation:
    return Federation(tmp_path / algorithm, TINY + [f"algorithm.name={algorithm}", *extra]).run(rounds)


# --------------------------------------------------------------------- the split


def cnn_small(num_classes: int = 10):
    cfg = load_config(None, [])
    info = build_federated_dataset(cfg.data, 0).info
    return build_model(cfg.model, info), info


def test_split_by_prefix_partitions_the_flat_weights():
    model, _ = cnn_small()
    split = ParameterSplit.from_model(model, ("classifier.",))
    flat = get_flat_weights(model)
    personal = torch.cat([model.classifier.weight.flatten(), model.classifier.bias])
    assert torch.equal(split.personal(flat), personal)
    assert torch.equal(split.shared(flat), get_flat_weights(model, ("encoder.",)))
    assert split.num_shared + split.num_personal == num_flat_weights(model)
    assert split.personal_keys == ("classifier.weight", "classifier.bias")
    assert torch.equal(split.join(split.shared(flat), split.personal(flat)), flat)
    nothing_personal = ParameterSplit.from_model(model, ())
    assert nothing_personal.num_personal == 0 and torch.equal(nothing_personal.shared(flat), flat)
    finer = ParameterSplit.from_model(model, ("encoder.fc.", "classifier."))  # LG-FedAvg-style top
    assert finer.num_personal == model.encoder.fc.weight.numel() + model.encoder.fc.bias.numel() + personal.numel()


def test_split_load_sets_both_parts():
    model, _ = cnn_small()
    split = ParameterSplit.from_model(model, ("classifier.",))
    shared, personal = torch.randn(split.num_shared), torch.randn(split.num_personal)
    split.load(model, shared, personal)
    assert torch.equal(model.classifier.bias, personal[-10:])
    read_shared, read_personal = split.read(model)
    assert torch.equal(read_shared, shared) and torch.equal(read_personal, personal)


def test_bad_personal_prefixes_are_config_errors():
    with pytest.raises(ConfigError, match=r"algorithm\.personal_prefixes.*model part"):
        load_config(None, ["algorithm.name=fedper", "algorithm.personal_prefixes=[head.]"])
    with pytest.raises(ConfigError, match=r"algorithm\.personal_prefixes: unknown key"):
        load_config(None, ["algorithm.name=local", "algorithm.personal_prefixes=[classifier.]"])
    model, _ = cnn_small()
    with pytest.raises(ValueError, match=r"algorithm\.personal_prefixes.*projector\..*match no state-dict key"):
        ParameterSplit.from_model(model, ("projector.",))  # cnn_small has no projection head


@pytest.mark.parametrize("name", ["fedcosr", "local", "fedper"])
def test_example_digits_configs_are_personalised(name):
    config = load_config(REPO / "examples" / f"{name}_digits.yaml")
    assert config.algorithm.name == name
    assert config.eval.personalized and config.data.client_test_fraction > 0


@pytest.mark.parametrize("setting", ["practical", "pathological"])
def test_paper_cifar10_configs_validate(setting):
    config = load_config(REPO / "examples" / f"paper_fedcosr_cifar10_{setting}.yaml")
    assert config.algorithm.name == "fedcosr" and config.model.name == "cnn_cifar"
    assert config.data.num_clients == 20 and config.data.client_test_fraction == 0.25
    assert config.train.local_epochs == 1 and config.train.clients_per_round == 20


# --------------------------------------------------------------------- what reaches the server


@pytest.mark.parametrize("algorithm", ["fedper", "fedcosr", "local"])
def test_personal_part_never_reaches_the_server(tmp_path, algorithm):
    run = simulate(tmp_path, algorithm, rounds=2)
    split = run.algorithm.split
    model = run.initial_model
    pi_0 = split.personal(get_flat_weights(model))
    for results in run.results:
        upload = results.sums
        if algorithm == "local":
            assert upload == {} and results.payloads == {}  # no communication at all
            continue
        assert split.num_shared == num_flat_weights(model, ("encoder.",))  # φ is the encoder only
        assert upload["weights"].numel() == split.num_shared
        expected = {"weights", "num_samples"} | ({"centroid_sums", "centroid_counts"} if algorithm == "fedcosr" else set())
        assert set(upload) == expected and results.payloads == {}
    # the server keeps θ_0's head, bit-identical, and no other personal weights
    assert torch.equal(run.state["initial_personal"], pi_0)
    assert sum(v.numel() for k, v in run.state.items() if k not in ("initial_personal", "centroids", "centroid_mask")) == split.num_shared
    # while every client's stored π has moved away from π_0
    for client_id in range(run.num_clients):
        assert not torch.equal(run.client_state(client_id)["personal"], pi_0)


def test_fedper_keeps_its_head_and_takes_the_global_body(tmp_path):
    run = simulate(tmp_path, "fedper", rounds=2)
    worker, algorithm = run.workers[0], run.algorithm
    ctx = worker.client_context(3, 0, int(run.versions[0]))
    algorithm.load_client_model(ctx, algorithm.broadcast(run.state, 3))
    shared, personal = algorithm.split.read(ctx.model)
    assert torch.equal(shared, run.state["weights"])
    assert torch.equal(personal, run.client_state(0)["personal"])


def test_personalised_evaluation_uses_the_clients_own_head(tmp_path):
    run = simulate(tmp_path, "fedper", rounds=3)
    algorithm = run.algorithm
    broadcast = algorithm.broadcast(run.state, 4)
    sums = run.client_sums(3)
    model = run.initial_model
    for client_id in range(run.num_clients):
        ctx = run.workers[0].client_context(3, client_id, int(run.versions[client_id]))
        algorithm.split.load(model, run.state["weights"], run.client_state(client_id)["personal"])
        with torch.no_grad():
            correct = (model(algorithm.info.normalize(ctx.x_test)).argmax(1) == ctx.y_test).sum()
        assert sums[client_id]["correct"] == float(correct)
        assert sums[client_id]["count"] == float(ctx.y_test.numel())
    # the global model (φ^G with π_0) is a different, far worse, model on the same splits
    global_correct = sum(algorithm.evaluate_global(model, broadcast, *_client_test(run, c))["correct"] for c in range(run.num_clients))
    assert global_correct < sum(s["correct"] for s in sums.values())


def _client_test(run: Federation, client_id: int):
    ctx = run.workers[0].client_context(1, client_id, NO_STATE)
    return ctx.x_test, ctx.y_test


def test_post_training_accuracy_is_logged(tmp_path):
    run = simulate(tmp_path, "fedper", rounds=1)
    clients = run.results[0].client_metrics
    assert all(0 <= m["post_train_accuracy"] <= 1 and m["test_samples"] > 0 for m in clients.values())
    expected = sum(m["post_train_accuracy"] * m["test_samples"] for m in clients.values()) / sum(
        m["test_samples"] for m in clients.values()
    )
    assert run.rows[0]["post_train_personal_accuracy"] == pytest.approx(expected)


def test_in_process_runs_are_deterministic(tmp_path):
    first = simulate(tmp_path / "a", "fedcosr", rounds=3)
    second = simulate(tmp_path / "b", "fedcosr", rounds=3)
    assert first.rows == second.rows
    assert all(torch.equal(first.state[k], second.state[k]) for k in first.state)


# --------------------------------------------------------------------- Local


def test_local_never_communicates_and_every_client_trains_its_own_model(tmp_path):
    run = Federation(tmp_path, TINY + ["algorithm.name=local"])
    initial = {k: v.clone() for k, v in run.state.items()}
    run.run(2)
    assert all(r.sums == {} and r.payloads == {} for r in run.results)
    assert run.state.keys() == initial.keys() and all(torch.equal(run.state[k], initial[k]) for k in initial)
    assert run.state["weights"].numel() == 0
    models = [run.client_state(c)["personal"] for c in range(run.num_clients)]
    assert all(m.numel() == num_flat_weights(run.initial_model) for m in models)
    assert len({tuple(m[:50].tolist()) for m in models}) == run.num_clients  # one model per client


# --------------------------------------------------------------------- FedCoSR's first round and reductions


def test_fedcosr_first_participation_starts_from_theta0_without_mixing(tmp_path):
    """Every client starts round 1 from the same θ_0 (π_0 included), trains on CE only
    (no global centroids yet), does no mixing, and records no contrastive loss."""
    run = Federation(tmp_path, TINY + ["algorithm.name=fedcosr"])
    algorithm = run.algorithm
    broadcast = algorithm.broadcast(run.state, 1)
    theta_0 = get_flat_weights(run.initial_model)
    for client_id in range(run.num_clients):
        ctx = run.workers[0].client_context(1, client_id, NO_STATE)
        assert algorithm.load_client_model(ctx, broadcast) == {}  # no λ
        assert torch.equal(get_flat_weights(ctx.model), theta_0)
    run.run(1)
    for metrics in run.results[0].client_metrics.values():
        assert "lambda" not in metrics and "contrastive" not in metrics
        assert metrics["train_loss"] == metrics["ce"]
    assert all("reg_loss" not in run.client_state(c) for c in range(run.num_clients))
    assert run.state["centroid_mask"].all()  # shards cover every class


def test_fedcosr_reduces_to_fedper(tmp_path):
    """α = 0 and λ ≡ 0 give FedPer's trajectory, bit for bit."""
    fedper = simulate(tmp_path, "fedper", rounds=3)
    fedcosr = simulate(tmp_path, "fedcosr", rounds=3, extra=["algorithm.contrast_weight=0", "algorithm.fixed_lambda=0"])
    assert torch.equal(fedcosr.state["weights"], fedper.state["weights"])
    for client_id in range(fedper.num_clients):
        assert torch.equal(fedcosr.client_state(client_id)["personal"], fedper.client_state(client_id)["personal"])
    for a, b in zip(fedcosr.rows, fedper.rows):
        assert a["personal_accuracy"] == b["personal_accuracy"]


def test_fedcosr_reduces_to_local(tmp_path):
    """α = 0 and λ ≡ 1 (full participation, so round 1 starts everyone from θ_0) give
    Local's per-client models, bit for bit: after round 1 no client depends on any other."""
    local = simulate(tmp_path, "local", rounds=3)
    fedcosr = simulate(tmp_path, "fedcosr", rounds=3, extra=["algorithm.contrast_weight=0", "algorithm.fixed_lambda=1"])
    for client_id in range(local.num_clients):
        state = fedcosr.client_state(client_id)
        theta = fedcosr.algorithm.split.join(state["shared"], state["personal"])
        assert torch.equal(theta, local.client_state(client_id)["personal"])
    for a, b in zip(fedcosr.rows, local.rows):
        assert a["personal_accuracy"] == b["personal_accuracy"]


def test_fedcosr_default_is_not_fedper(tmp_path):
    """The reductions above are not vacuous: with its defaults FedCoSR mixes (0 < λ < 1) and its
    contrastive term changes the trajectory."""
    fedper = simulate(tmp_path, "fedper", rounds=3)
    fedcosr = simulate(tmp_path, "fedcosr", rounds=3)
    assert not torch.equal(fedcosr.state["weights"], fedper.state["weights"])
    lambdas = [m["lambda"] for r in fedcosr.results[1:] for m in r.client_metrics.values()]
    assert lambdas and all(0 < lam < 1 for lam in lambdas)
    assert all("probe_reg_loss" in m for m in fedcosr.results[1].client_metrics.values())  # round 2: probe
    assert all("probe_reg_loss" not in m for m in fedcosr.results[2].client_metrics.values())  # then recorded L_Reg


def test_fedcosr_client_state_holds_its_model_and_loss(tmp_path):
    run = simulate(tmp_path, "fedcosr", rounds=2)
    state = run.client_state(0)
    assert set(state) == {"shared", "personal", "reg_loss"}
    assert state["shared"].numel() == run.algorithm.split.num_shared
    assert state["personal"].numel() == run.algorithm.split.num_personal
    assert state["reg_loss"].ndim == 0 and float(state["reg_loss"]) > 0
    assert float(state["reg_loss"]) == pytest.approx(run.results[1].client_metrics[0]["contrastive"], rel=1e-5)


def test_fedcosr_without_separation_shares_the_whole_model(tmp_path):
    """The w/o Sep ablation (``personal_prefixes: []``): the head is aggregated too."""
    run = simulate(tmp_path, "fedcosr", rounds=2, extra=["algorithm.personal_prefixes=[]"])
    assert run.results[0].sums["weights"].numel() == num_flat_weights(run.initial_model)
    assert run.client_state(0)["personal"].numel() == 0


def test_fedcosr_loss_logged_per_client_is_ce_plus_weighted_contrastive(tmp_path):
    run = simulate(tmp_path, "fedcosr", rounds=2, extra=["algorithm.contrast_weight=2"])
    for m in run.results[1].client_metrics.values():
        assert m["train_loss"] == pytest.approx(m["ce"] + 2 * m["contrastive"], rel=1e-5)


def test_fedavg_personalised_metric_is_the_global_model(tmp_path):
    """FedAvg's ``personal_accuracy`` (the e2e comparison's baseline) is its global model on each
    client's split."""
    run = simulate(tmp_path, "fedavg", rounds=1)
    algorithm = run.algorithm
    model = algorithm.load_global_model(run.initial_model, algorithm.broadcast(run.state, 2))
    sums = run.client_sums(1)
    for client_id, s in sums.items():
        x, y = _client_test(run, client_id)
        with torch.no_grad():
            assert s["correct"] == float((model(algorithm.info.normalize(x)).argmax(1) == y).sum())
