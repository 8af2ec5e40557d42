"""Secure aggregation, simulated (``privacy.secure_aggregation``, fedray.privacy.secure_aggregation): off
changes nothing, on alone changes only its column, the dropout threshold fails a round, distributed
noise sums to the central noise, the protocol's cost grows with the cohort as Bell et al. (CCS 2020)
say, and the refusals on the CLI."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedray import load_config
from fedray.privacy.secure_aggregation import client_bytes, neighbours, realised_noise_multiplier, survivor_threshold
from fedray.runtime.upload_path import ClientUploadPath
from fedray.systems.clock import client_durations
from fedray.testing import Federation
from preloaded_cli import run_fedray_preloaded
from test_bad_inputs import assert_rejected

ON = "privacy.secure_aggregation.enabled=true"
CENTRAL = ["privacy.mechanism=central", "privacy.clip=0.5", "privacy.noise_multiplier=0.8"]


def test_off_by_default_and_explicitly_off_are_the_same_run(tmp_path):
    default = Federation(tmp_path / "default", []).run(2)
    off = Federation(tmp_path / "off", ["privacy.secure_aggregation.enabled=false"]).run(2)
    assert default.rows == off.rows and torch.equal(default.state["weights"], off.state["weights"])
    assert off.engine.upload_path is None and "privacy" not in off.config.to_dict()
    dp = load_config(None, CENTRAL).to_dict()["privacy"]
    assert "secure_aggregation" not in dp  # a DP run saves the config it did before the section existed


def test_on_alone_releases_the_same_sum(tmp_path):
    """The workers already sum the cohort: the model is bit-identical, the row gains secagg_failed = 0."""
    plain = Federation(tmp_path / "plain", []).run(2)
    secagg = Federation(tmp_path / "secagg", [ON]).run(2)
    assert torch.equal(plain.state["weights"], secagg.state["weights"])
    assert [row.pop("secagg_failed") for row in secagg.rows] == [0.0, 0.0]
    assert plain.rows == secagg.rows
    assert secagg.config.to_dict()["privacy"]["secure_aggregation"]["enabled"] is True


def test_a_round_below_the_threshold_fails_is_counted_and_not_accounted(tmp_path):
    federation = Federation(tmp_path, [ON, "privacy.secure_aggregation.threshold=1.0", *CENTRAL])
    first = federation.run_round(1, [0, 1, 2])
    before = federation.state["weights"].clone()
    failed = federation.run_round(2, [0, 1])  # 2 of 3 report: t = 3
    assert first["secagg_failed"] == 0.0 and "dp_epsilon" in first
    assert failed["secagg_failed"] == 1.0 and "dp_epsilon" not in failed
    assert torch.equal(federation.state["weights"], before)
    third = federation.run_round(3, [3, 4, 5])
    assert third["secagg_failed"] == 0.0 and third["dp_epsilon"] > first["dp_epsilon"]
    assert federation.engine.upload_path.rounds_accounted == 2


def test_threshold_as_fraction_or_count():
    config = load_config(None, [ON]).privacy.secure_aggregation
    assert survivor_threshold(config, 10) == 5
    assert survivor_threshold(config.model_copy(update={"threshold": 0.7}), 10) == 7
    assert survivor_threshold(config.model_copy(update={"threshold": 4.0}), 10) == 4


def test_distributed_noise_sums_to_the_central_noise(tmp_path):
    """Each of m clients adds N(0, σ²/m): exactly σ/√m per share, and the m shares' sum has std σ = z·C
    (estimated over the model's coordinates to a few %, well inside the 10 % bound)."""
    overrides = [ON, "privacy.secure_aggregation.noise=distributed", *CENTRAL]
    federation = Federation(tmp_path / "noisy", overrides)
    silent = Federation(tmp_path / "silent", [*overrides[:-1], "privacy.noise_multiplier=0"])
    m, sigma = 3, 0.8 * 0.5
    noisy = ClientUploadPath(federation.config, federation.algorithm, federation.num_clients)
    assert noisy.noise_share_std(0.5) == pytest.approx(sigma / math.sqrt(m), rel=1e-12)
    clean = ClientUploadPath(silent.config, silent.algorithm, silent.num_clients)
    broadcast = federation.algorithm.broadcast(federation.state, 1)
    total = sum(
        noisy.apply(1, cid, federation.client_update(1, cid), broadcast).sums["weights"]
        - clean.apply(1, cid, federation.client_update(1, cid), broadcast).sums["weights"]
        for cid in range(m)
    )
    assert total.numel() > 1000
    assert float(total.std()) == pytest.approx(sigma, rel=0.1)
    # the server adds nothing more, and reports the realised multiplier
    row = federation.run_round(1, [0, 1])
    assert row["secagg_noise_multiplier"] == pytest.approx(realised_noise_multiplier(0.8, 2, 3)) == 0.8 * math.sqrt(2 / 3)


def test_distributed_noise_is_accounted_at_the_least_noise_a_sum_has_carried(tmp_path):
    """Dropped clients' shares are missing from the sum: every round is accounted at the smallest
    realised multiplier so far (an upper bound on ε), and that survives a resume."""
    from fedray.privacy.accountant import CentralAccountant

    overrides = [ON, "privacy.secure_aggregation.noise=distributed", *CENTRAL]
    federation = Federation(tmp_path / "run", overrides)
    full = federation.run_round(1, [0, 1, 2])
    assert full["dp_noise_multiplier"] == 0.8  # all 3 shares: the planned z
    short = federation.run_round(2, [3, 4])  # 2 of 3 report: z·√(2/3)
    again = federation.run_round(3, [5, 0, 1])
    path = federation.engine.upload_path
    accountant = CentralAccountant(path.accountant.name, path.accountant.sampling, path.population, 3, path.delta)
    least = 0.8 * math.sqrt(2 / 3)
    assert short["dp_noise_multiplier"] == again["dp_noise_multiplier"] == pytest.approx(least)
    assert short["dp_epsilon"] == pytest.approx(accountant.epsilon(least, 2))
    assert again["dp_epsilon"] == pytest.approx(accountant.epsilon(least, 3))
    assert again["dp_epsilon"] > accountant.epsilon(0.8, 3)  # more than the planned z would have said
    resumed = type(path)(federation.config, federation.algorithm)
    resumed.load_state_dict(path.state_dict())
    assert resumed.accounted_multiplier == path.accounted_multiplier == pytest.approx(least)


def test_distributed_noise_is_the_same_whatever_the_worker_count(tmp_path):
    """Each share is drawn from (seed, round, client id), never from the worker that ran the client."""
    overrides = [ON, "privacy.secure_aggregation.noise=distributed", *CENTRAL]
    one = Federation(tmp_path / "one", overrides).run(2)
    two = Federation(tmp_path / "two", [*overrides, "resources.num_workers=2"]).run(2)
    assert len(two.workers) == 2 and torch.equal(one.state["weights"], two.state["weights"])
    # test_loss: a float sum over the workers' test shards, whose last bits differ with their number (as without privacy)
    assert [{**row, "test_loss": None} for row in one.rows] == [{**row, "test_loss": None} for row in two.rows]


def test_the_cost_grows_with_the_cohort_as_the_protocols_say():
    secagg = load_config(None, [ON]).privacy.secure_aggregation
    plus = secagg.model_copy(update={"protocol": "secagg_plus"})
    per_neighbour = client_bytes(secagg, 3) - client_bytes(secagg, 2)
    for n in (10, 100, 1000):
        assert neighbours(secagg, n) == n - 1  # SecAgg: O(n) bytes per client
        assert client_bytes(secagg, n) == client_bytes(secagg, 1) + (n - 1) * per_neighbour
        assert neighbours(plus, n) == min(n - 1, math.ceil(2 * math.log2(n)))  # SecAgg+: O(log n)
    assert client_bytes(plus, 1000) < client_bytes(secagg, 100)


@pytest.mark.slow  # the systems model measures each client's FLOPs (2 s idle, 6 s on a loaded machine)
def test_the_systems_model_reports_the_cost_and_puts_it_on_the_clock(tmp_path):
    secagg = load_config(None, [ON]).privacy.secure_aggregation
    federation = Federation(tmp_path, [ON, "systems.enabled=true"]).run(1)
    row = federation.rows[0]
    assert row["secagg_bytes_per_client"] == client_bytes(secagg, row["selected"]) and row["secagg_rounds"] == 4
    systems = federation.engine.systems
    clients = np.arange(3)
    plain = client_durations(systems.devices, clients, systems.train_flops[clients], 1000, systems.upload_bytes_per_client)
    extra = client_bytes(secagg, 3) / systems.devices.upload_bytes_per_second[clients]
    np.testing.assert_allclose(systems.durations(clients, 1000), plain + extra, rtol=1e-12)


BAD = [
    ("per-client", ["algorithm.name=fedsc", ON], "privacy.secure_aggregation: fedsc uploads prototypes"),
    ("threshold", [ON, "privacy.secure_aggregation.threshold=11"], "privacy.secure_aggregation.threshold (11) must be <= train"),
    ("robust", [ON, "robust.rule=median"], "robust.rule (and robust.attack=alie) need each client's update"),
    ("distributed", [ON, "privacy.secure_aggregation.noise=distributed"], "noise=distributed splits the central noise"),
    (
        "distributed-calibrated",
        [ON, "privacy.secure_aggregation.noise=distributed", "privacy.mechanism=central", "privacy.target_epsilon=5"],
        "noise=distributed needs privacy.noise_multiplier",
    ),
]


@pytest.mark.parametrize(("overrides", "expected"), [case[1:] for case in BAD], ids=[case[0] for case in BAD])
def test_bad_secure_aggregation_input_exits_2_with_one_line(tmp_path, overrides, expected):
    args = ["run", "--set", "resources.num_workers=1", "--set", "train.rounds=1"]
    for override in overrides:
        args += ["--set", override]
    assert_rejected(run_fedray_preloaded(args, tmp_path), expected)
