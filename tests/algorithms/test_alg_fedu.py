"""Ray-free tests of FedU's divergence-aware predictor update (DAPU), through the real worker code
in-process. FedU's shared properties with FedEMA (target never uploaded, μ = +∞ equals FedEMA with
λ = 0, the divergence) are tested in test_alg_fedema.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedray.algorithms.divergence_byol import PREDICTOR_PREFIXES
from fedray.algorithms.ssl import ONLINE_PREFIXES
from fedray import load_config
from fedray.models import get_flat_weights, set_flat_weights

from test_alg_fedema import ssl_run, start_of_training

REPO = Path(__file__).resolve().parents[2]


def _split(run, online: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(encoder + projector, predictor) of an online vector."""
    model = run.algorithm.build_model("global")
    set_flat_weights(model, online, ONLINE_PREFIXES)
    return get_flat_weights(model, ("encoder.", "projector.")), get_flat_weights(model, PREDICTOR_PREFIXES)


@pytest.mark.parametrize("threshold", [".inf", "0", "-1"])
def test_dapu_takes_the_global_predictor_only_below_the_threshold(tmp_path, threshold):
    """Properties (a), (b), (d): the online encoder + projector a client starts training from is the
    broadcast one; its predictor is the global one for μ = +∞ and its own for μ ≤ 0."""
    run = ssl_run(tmp_path, "fedu", rounds=1, extra=[f"algorithm.dapu_threshold={threshold}"])
    take_global = threshold == ".inf"
    global_body, global_predictor = _split(run, run.state["weights"])
    for client_id in (0, 3):
        online, target, metrics = start_of_training(run, 2, client_id)
        body, predictor = _split(run, online)
        assert torch.equal(body, global_body)
        own = run.client_state(client_id)
        assert torch.equal(predictor, global_predictor if take_global else _split(run, own["online"])[1])
        assert metrics["global_predictor"] == float(take_global)
        assert torch.equal(target, own["target"])
    assert not torch.equal(global_predictor, _split(run, run.client_state(0)["online"])[1])  # the two choices differ


def test_decision_uses_the_previous_divergence(tmp_path):
    """μ between two clients' round-1 divergences splits them: the one below takes the global predictor."""
    run = ssl_run(tmp_path, "fedu", rounds=1)
    divergences = {c: m["divergence"] for c, m in run.results[0].client_metrics.items()}
    low, high = min(divergences, key=divergences.get), max(divergences, key=divergences.get)
    assert divergences[low] < divergences[high]
    run.algorithm.params.dapu_threshold = (divergences[low] + divergences[high]) / 2
    assert start_of_training(run, 2, low)[2]["global_predictor"] == 1.0
    assert start_of_training(run, 2, high)[2]["global_predictor"] == 0.0


def test_example_configs_are_fedu_and_fedema():
    assert load_config(REPO / "examples" / "fedu_digits.yaml").algorithm.name == "fedu"
    assert load_config(REPO / "examples" / "fedema_digits.yaml").algorithm.name == "fedema"
