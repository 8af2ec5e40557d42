"""Ray-free tests of FedEMA and of the divergence-aware BYOL client it shares with FedU, through the
real worker code in-process (the same round loop as the personalised tests)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from fedray.algorithms.divergence_byol import encoder_conv_weights, mean_divergence
from fedray.algorithms.fedema import ema_weight
from fedray.algorithms.ssl import ONLINE_PREFIXES, TARGET_PREFIXES
from fedray.config import ConfigError
from fedray import load_config
from fedray.models import get_flat_weights, num_flat_weights, set_flat_weights
from fedray.runtime.state_store import NO_STATE

from fedray.testing import Federation
from test_personalized import TINY

REPO = Path(__file__).resolve().parents[2]
SSL = TINY + ["algorithm.projection_dim=32", "algorithm.hidden_dim=64", "algorithm.probe_epochs=5", "train.momentum=0.9"]


def ssl_run(tmp_path: Path, algorithm: str, rounds: int, extra: list[str] = ()) -> Federation:
    """The in-process federation without the personalised evaluation (these methods probe the
    global encoder instead)."""
    return Federation(tmp_path / algorithm, SSL + [f"algorithm.name={algorithm}", "eval.personalized=false", *extra]).run(rounds)


def start_of_training(run: Federation, round: int, client_id: int) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """The online and target networks a client starts ``round``'s training from (its update with no
    local epochs), and that update's metrics."""
    ctx = run.workers[0].client_context(round, client_id, int(run.versions[client_id]))
    ctx = replace(ctx, train=ctx.train.model_copy(update={"local_epochs": 0}))
    update = run.algorithm.client_update(ctx, run.algorithm.broadcast(run.state, round))
    return update.state["online"], update.state["target"], update.metrics


def test_auto_scaler_gives_tau_at_the_second_participation_and_mu_stays_in_0_1(tmp_path):
    """Property (a) and (b): μ = τ exactly at every client's second participation, λ_k = τ / d_1 is
    stored, and every later μ = min(λ_k d, 1) lies in [0, 1]."""
    run = ssl_run(tmp_path, "fedema", rounds=3, extra=["algorithm.scaler_target=0.6"])
    assert all("ema_mu" not in m for m in run.results[0].client_metrics.values())  # no EMA at the first participation
    first = run.results[0].client_metrics
    for metrics in run.results[1].client_metrics.values():
        assert metrics["ema_mu"] == 0.6
    for client_id, metrics in run.results[2].client_metrics.items():
        scaler = float(run.client_state(client_id)["scaler"])
        assert scaler == pytest.approx(0.6 / first[client_id]["divergence"], rel=1e-12)
        assert metrics["ema_mu"] == pytest.approx(min(scaler * run.results[1].client_metrics[client_id]["divergence"], 1.0), rel=1e-12)
        assert 0 <= metrics["ema_mu"] <= 1


def test_ema_weight_rules():
    """μ ∈ [0, 1] for any input; the first EMA gives min(τ, 1) and sets λ = τ/d only for d > 0; the
    constant λ is used as is."""
    generator = torch.Generator().manual_seed(0)
    for d, scaler, target in torch.rand(200, 3, generator=generator, dtype=torch.float64).mul(5).tolist():
        for stored in (None, scaler):
            mu, _ = ema_weight(d, stored, target, None)
            assert 0 <= mu <= 1
    assert ema_weight(0.5, None, 0.7, None) == (0.7, 0.7 / 0.5)
    assert ema_weight(0.0, None, 1.5, None) == (1.0, None)  # d = 0: no scaler yet
    assert ema_weight(0.2, 0.7 / 0.5, 0.7, None)[0] == pytest.approx(0.28)
    assert ema_weight(0.2, None, 0.7, 2.0) == (0.4, 2.0) and ema_weight(3.0, None, 0.7, 2.0) == (1.0, 2.0)


def test_first_participation_takes_the_global_online_and_target(tmp_path):
    """Property (e): at its first participation a client starts from the global online network and a
    target equal to the global encoder + projector."""
    run = Federation(tmp_path, SSL + ["algorithm.name=fedema", "eval.personalized=false"])
    online, target, _ = start_of_training(run, 1, 0)
    assert torch.equal(online, run.state["weights"])
    model = run.algorithm.build_model("global")
    set_flat_weights(model, run.state["weights"], ONLINE_PREFIXES)
    assert torch.equal(target, get_flat_weights(model, TARGET_PREFIXES))


def test_second_participation_mixes_own_and_global_with_mu(tmp_path):
    run = ssl_run(tmp_path, "fedema", rounds=1)
    online, target, metrics = start_of_training(run, 2, 1)
    own = run.client_state(1)
    mu = metrics["ema_mu"]
    assert mu == 0.7
    expected = (mu * own["online"].double() + (1 - mu) * run.state["weights"].double()).float()
    assert torch.equal(online, expected)
    assert torch.equal(target, own["target"])  # the client's own target, not the global one


@pytest.mark.parametrize("algorithm", ["fedema", "fedu"])
def test_target_never_reaches_the_server(tmp_path, algorithm):
    """FedEMA (d) / FedU (e): the broadcast and the sums carry the online network only; each client
    stores its own target."""
    run = ssl_run(tmp_path, algorithm, rounds=2)
    online_size = num_flat_weights(run.initial_model, ONLINE_PREFIXES)
    assert set(run.state) == {"weights"} and run.state["weights"].numel() == online_size
    assert set(run.algorithm.broadcast(run.state, 3)) == {"weights"}
    for results in run.results:
        assert set(results.sums) == {"weights", "num_samples"} and results.sums["weights"].numel() == online_size
    targets = [run.client_state(c)["target"] for c in range(run.num_clients)]
    assert targets[0].numel() == num_flat_weights(run.initial_model, TARGET_PREFIXES)
    assert not torch.equal(targets[0], targets[1])


@pytest.mark.slow
def test_fedema_with_lam_0_is_fedu_always_taking_the_global_predictor(tmp_path):
    """FedEMA (c) = FedU (c): λ = 0 and μ_DAPU = +∞ are the same algorithm, bit for bit."""
    fedema = ssl_run(tmp_path, "fedema", rounds=3, extra=["algorithm.lam=0"])
    fedu = ssl_run(tmp_path, "fedu", rounds=3, extra=["algorithm.dapu_threshold=.inf"])
    assert torch.equal(fedema.state["weights"], fedu.state["weights"])
    for client_id in range(fedu.num_clients):
        a, b = fedema.client_state(client_id), fedu.client_state(client_id)
        assert torch.equal(a["online"], b["online"]) and torch.equal(a["target"], b["target"])


def test_divergence_is_the_mean_conv_weight_change(tmp_path):
    """d = mean over the encoder's Conv2d weights of ‖W_end − W_start‖₂ (cnn_small: conv1, conv2),
    measured from where training started (the global online network at the first participation)."""
    run = ssl_run(tmp_path, "fedema", rounds=1)
    model = run.algorithm.build_model("global")
    set_flat_weights(model, get_flat_weights(run.initial_model, ONLINE_PREFIXES), ONLINE_PREFIXES)
    start = [w.detach().clone() for w in encoder_conv_weights(model)]
    assert len(start) == 2
    set_flat_weights(model, run.client_state(2)["online"], ONLINE_PREFIXES)
    end = [w.detach() for w in encoder_conv_weights(model)]
    expected = float((torch.dist(end[0], start[0]) + torch.dist(end[1], start[1])) / 2)
    assert float(run.client_state(2)["divergence"]) == pytest.approx(expected, rel=1e-5)
    assert mean_divergence(start, start) == 0.0


def test_only_byol_is_supported():
    with pytest.raises(ConfigError, match=r"algorithm\.ssl"):
        load_config(None, ["algorithm.name=fedema", "algorithm.ssl=simsiam"])
    with pytest.raises(ConfigError, match=r"algorithm\.ssl"):
        load_config(None, ["algorithm.name=fedu", "algorithm.ssl=simsiam"])


def test_global_encoder_is_probed(tmp_path):
    """Evaluation probes the global online encoder (the broadcast), whichever client context runs it."""
    run = ssl_run(tmp_path, "fedema", rounds=1, extra=["algorithm.probe_epochs=100", "algorithm.probe_lr=0.01"])
    algorithm = run.algorithm
    assert algorithm.evaluation_clients(run.num_clients) == [0]
    worker = run.workers[0]
    ctx = worker.client_context(2, 0, NO_STATE)
    metrics = algorithm.evaluate_on_test_set(
        ctx, algorithm.broadcast(run.state, 2), (worker.x_train, worker.y_train), (worker.x_test, worker.y_test)
    )
    assert torch.equal(get_flat_weights(ctx.model, ONLINE_PREFIXES), run.state["weights"])
    assert metrics["test_accuracy"] == metrics["probe_accuracy"] > 0.5


def test_example_config_is_fedema():
    config = load_config(REPO / "examples" / "fedema_digits.yaml")
    assert config.algorithm.name == "fedema"
