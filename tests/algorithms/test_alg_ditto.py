"""Ray-free tests of Ditto (a personal model v_k per client, proximal to the FedAvg global model),
through the real worker code in-process: the global model is FedAvg's, v_k stays on the client and
survives rounds, λ = 0 is Local and a large λ keeps v_k on w^t."""

from __future__ import annotations

from pathlib import Path

import torch

from fedray.algorithms.base import evaluation_sums
from fedray import load_config
from fedray.data import build_federated_dataset
from fedray.models import get_flat_weights, set_flat_weights
from fedray.runtime.state_store import NO_STATE
from fedray.runtime.worker import ClientWorker

from fedray.testing import Federation
from test_personalized import TINY, simulate

REPO = Path(__file__).resolve().parents[2]


def _worker(overrides: list[str], run_dir: Path) -> ClientWorker:
    config = load_config(None, TINY + overrides)
    return ClientWorker(config.to_dict(), build_federated_dataset(config.data, config.seed), str(run_dir), use_gpu=False)


def test_global_model_is_fedavg_for_any_lambda(tmp_path):
    """Property (a) and (d): the global weights are bit-identical to FedAvg's, and what reaches the
    server is exactly FedAvg's sums (v_k never appears in them)."""
    fedavg = simulate(tmp_path / "fedavg", "fedavg", rounds=2)
    for mu in (0.0, 1.0):
        ditto = simulate(tmp_path / f"ditto{mu}", "ditto", rounds=2, extra=[f"algorithm.mu={mu}"])
        assert torch.equal(ditto.state["weights"], fedavg.state["weights"])
        for d, f in zip(ditto.results, fedavg.results):
            assert set(d.sums) == {"weights", "num_samples"}
            assert all(torch.equal(d.sums[k], f.sums[k]) for k in d.sums)
    personal = torch.stack([ditto.client_state(c)["personal_model"] for c in range(ditto.num_clients)])
    assert not torch.equal(personal[0], ditto.state["weights"])  # v_k is its own model
    assert set(ditto.state) == {"weights", "initial_personal", "initial_model"}
    assert torch.equal(ditto.state["initial_model"], get_flat_weights(ditto.initial_model))


def test_lambda_zero_personal_model_is_local_training(tmp_path):
    """Property (b): with λ = 0, v_k after a round equals Local's model when both see the same batch
    sequence (Local run on a generator already advanced by the global step's draws)."""
    ditto_worker = _worker(["algorithm.name=ditto", "algorithm.mu=0"], tmp_path / "ditto")
    local_worker = _worker(["algorithm.name=local"], tmp_path / "local")
    fedavg_worker = _worker(["algorithm.name=fedavg"], tmp_path / "fedavg")
    torch.manual_seed(0)
    theta_0 = ditto_worker.algorithm.build_model("global")
    ditto_broadcast = ditto_worker.algorithm.broadcast(ditto_worker.algorithm.init_server_state(theta_0), 1)
    local_broadcast = local_worker.algorithm.broadcast(local_worker.algorithm.init_server_state(theta_0), 1)
    for client_id in (0, 3):
        v_k = ditto_worker.algorithm.client_update(ditto_worker.client_context(1, client_id, NO_STATE), ditto_broadcast).state[
            "personal_model"
        ]
        ctx = local_worker.client_context(1, client_id, NO_STATE)
        fedavg_worker.algorithm.client_update(ctx, {"weights": get_flat_weights(theta_0)})  # the same draws as Ditto's global step
        local = local_worker.algorithm.client_update(ctx, local_broadcast).state["personal"]
        assert torch.equal(v_k, local)
        assert not torch.equal(v_k, get_flat_weights(theta_0))


def test_large_lambda_keeps_the_personal_model_on_the_global_model(tmp_path):
    """Property (c): with λ = 1000 and η_p = 5e-4 (η_p λ = 0.5 per step) v_k ends within a small
    distance of the received w^t, far closer than with λ = 0."""
    gaps = {}
    for mu in (0.0, 1000.0):
        run = Federation(
            tmp_path / str(mu),
            TINY + ["algorithm.name=ditto", f"algorithm.mu={mu}", "algorithm.personal_lr=5e-4", "algorithm.personal_epochs=3"],
        )
        received = run.state["weights"].clone()
        run.run(1)
        gaps[mu] = max(float((run.client_state(c)["personal_model"] - received).abs().max()) for c in range(run.num_clients))
    assert gaps[1000.0] < 1e-3
    assert gaps[1000.0] < gaps[0.0] / 5


def test_personal_model_survives_rounds_and_is_what_is_evaluated(tmp_path):
    """Property (e): with no personal epochs v_k stays θ_0 round after round (it is read back from the
    state store, not rebuilt); with personal epochs, round 2 continues from round 1's v_k, and the
    personalised metric is v_k on the client's own split."""
    frozen = simulate(tmp_path / "frozen", "ditto", rounds=2, extra=["algorithm.personal_epochs=0"])
    theta_0 = get_flat_weights(frozen.initial_model)
    assert all(torch.equal(frozen.client_state(c)["personal_model"], theta_0) for c in range(frozen.num_clients))

    run = Federation(tmp_path / "run", TINY + ["algorithm.name=ditto", "algorithm.mu=0"]).run(1)
    after_round_1 = run.client_state(2)["personal_model"]
    fresh = _worker(["algorithm.name=ditto", "algorithm.mu=0"], tmp_path / "run")  # as after a resume
    ctx = fresh.client_context(2, 2, int(run.versions[2]))
    assert torch.equal(ctx.state["personal_model"], after_round_1)
    run.run(1)
    after_round_2 = run.client_state(2)["personal_model"]
    assert not torch.equal(after_round_2, after_round_1)

    sums = run.client_sums(1)
    algorithm = run.algorithm
    for client_id in (0, 2):
        ctx = run.workers[0].client_context(2, client_id, int(run.versions[client_id]))
        model = run.initial_model
        set_flat_weights(model, run.client_state(client_id)["personal_model"])
        expected = evaluation_sums(algorithm, model, {}, ctx.x_test, ctx.y_test, 512)
        assert sums[client_id] == expected


def test_personal_step_uses_momentum_free_sgd_and_its_own_lr(tmp_path):
    """The personal step is a fresh plain SGD at ``personal_lr`` even when train.optimizer is Adam
    with momentum settings: one step of CE at lr η from θ_0 gives θ_0 − η ∇CE."""
    worker = _worker(
        [
            "algorithm.name=ditto",
            "algorithm.mu=0",
            "algorithm.personal_epochs=1",
            "algorithm.personal_lr=0.5",
            "train.optimizer=adam",
            "train.batch_size=1000",
        ],
        tmp_path,
    )
    torch.manual_seed(0)
    theta_0 = worker.algorithm.build_model("global")
    broadcast = worker.algorithm.broadcast(worker.algorithm.init_server_state(theta_0), 1)
    ctx = worker.client_context(1, 1, NO_STATE)
    update = worker.algorithm.client_update(ctx, broadcast)
    # one full batch, no augmentation on digits: the gradient of CE at θ_0 over the client's data
    model = worker.algorithm.build_model("global")
    set_flat_weights(model, get_flat_weights(theta_0))
    order = torch.randperm(ctx.num_samples, generator=torch.Generator().manual_seed(0))  # any order: one batch
    loss = torch.nn.functional.cross_entropy(model(worker.algorithm.info.normalize(ctx.x[order])), ctx.y[order])
    loss.backward()
    expected = torch.cat([(p.detach() - 0.5 * p.grad).flatten() for p in model.parameters()])
    assert torch.allclose(update.state["personal_model"], expected, atol=1e-6)


def test_example_config_is_ditto():
    config = load_config(REPO / "examples" / "ditto_digits.yaml")
    assert config.algorithm.name == "ditto" and config.eval.personalized and config.data.client_test_fraction > 0
