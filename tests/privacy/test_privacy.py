"""Differential privacy on the upload path (fedray.privacy, fedray.runtime.upload_path): the accountant
against dp-accounting itself, the noise's standard deviation, clipping, identity when off, resume,
the budget stop, the refusal of uploads the mechanism cannot privatise, and bad inputs on the CLI."""

from __future__ import annotations

import math

import dp_accounting
import pytest
import torch
from dp_accounting import pld, rdp

from fedray.algorithms import RoundResults
from fedray.config import ConfigError
from fedray.privacy.accountant import CentralAccountant, calibrated_noise_multiplier, local_epsilon
from fedray.privacy.clipping import clip_to_norm
from fedray.runtime.upload_path import ClientUploadPath, PrivacyBudgetExhausted, ServerUploadPath
from fedray.testing import Federation
from fedray import load_config
from preloaded_cli import run_fedray_preloaded
from test_bad_inputs import assert_rejected

CENTRAL = ["privacy.mechanism=central", "privacy.clip=0.5", "privacy.noise_multiplier=0.8"]


# ----------------------------------------------------------------------------- accountant
@pytest.mark.parametrize(("name", "sampling"), [("rdp", "poisson"), ("pld", "poisson"), ("rdp", "fixed_size")])
def test_epsilon_equals_a_direct_dp_accounting_computation(name, sampling):
    q_num, population, z, steps, delta = 10, 200, 1.1, 30, 1e-3
    ours = CentralAccountant(name, sampling, population, q_num, delta).epsilon(z, steps)
    if sampling == "poisson":
        accountant = rdp.RdpAccountant() if name == "rdp" else pld.PLDAccountant()
        event = dp_accounting.PoissonSampledDpEvent(q_num / population, dp_accounting.GaussianDpEvent(z))
    else:  # replace-one neighbours: the sensitivity of the clipped sum is 2C
        accountant = rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
        event = dp_accounting.SampledWithoutReplacementDpEvent(population, q_num, dp_accounting.GaussianDpEvent(z / 2))
    accountant.compose(event, steps)
    assert ours == accountant.get_epsilon(delta)


def test_calibrated_noise_multiplier_reaches_the_target_epsilon():
    accountant = CentralAccountant("rdp", "poisson", 100, 10, 1e-3)
    z = accountant.noise_multiplier_for(4.0, 20)
    assert accountant.epsilon(z, 20) == pytest.approx(4.0, rel=1e-3)
    assert accountant.epsilon(z * 1.05, 20) < 4.0 < accountant.epsilon(z * 0.95, 20)


def test_a_run_calibrates_its_noise_once_per_process():
    """The config check before Ray and the run's server both need z; the second reads the first's."""
    config = load_config("examples/dp_fedavg_digits.yaml", ["privacy.target_epsilon=3.5"])
    calibrated_noise_multiplier.cache_clear()
    checked, served = ServerUploadPath(config), ServerUploadPath(config)
    assert checked.noise_multiplier == served.noise_multiplier > 0
    assert (calibrated_noise_multiplier.cache_info().misses, calibrated_noise_multiplier.cache_info().hits) == (1, 1)


def test_local_epsilon_is_a_gaussian_mechanism_of_twice_the_clip_per_release():
    direct = rdp.RdpAccountant()
    direct.compose(dp_accounting.GaussianDpEvent(3.0 / 2), 4)
    assert local_epsilon(3.0, 4, 1e-5, "rdp") == direct.get_epsilon(1e-5)


# ----------------------------------------------------------------------------- mechanisms
def _results(weights_sum: torch.Tensor, num_clients: int) -> RoundResults:
    sums = {"weights": weights_sum, "num_samples": torch.tensor(float(num_clients), dtype=torch.float64)}
    return RoundResults(sums, {}, {cid: {} for cid in range(num_clients)}, num_clients, [])


@pytest.mark.parametrize("noise_cohort", [None, 12])
def test_central_noise_has_the_configured_standard_deviation(noise_cohort):
    """z·C·m/M on the sum; 200 000 draws estimate a std to ±0.4 % (3 standard errors), far inside the 10 %
    an error in σ would show."""
    overrides = [*CENTRAL, "data.num_clients=20", "train.clients_per_round=4"]
    if noise_cohort:
        overrides.append(f"privacy.noise_cohort_size={noise_cohort}")
    config = load_config(None, overrides)
    path = ServerUploadPath(config)
    reference = torch.zeros(200_000)
    results, row = path.apply(7, _results(torch.zeros(200_000, dtype=torch.float64), 4), reference)
    noise = results.sums["weights"]  # reference 0 and no client signal: the sum is the noise
    expected = 0.8 * 0.5 * 4 / (noise_cohort or 4)
    assert float(noise.std()) == pytest.approx(expected, rel=0.01)
    assert abs(float(noise.std()) / expected - 1) < 0.1 / 3
    assert float(results.sums["num_samples"]) == 4.0  # the fixed denominator m
    assert row["dp_epsilon"] == CentralAccountant("rdp", "poisson", 20, noise_cohort or 4, 20**-1.1).epsilon(0.8, 1)
    again, _ = ServerUploadPath(config).apply(7, _results(torch.zeros(200_000, dtype=torch.float64), 4), reference)
    assert torch.equal(again.sums["weights"], noise)  # seeded from (seed, round)


def test_clip_to_norm_bounds_and_leaves_small_updates_alone():
    delta = torch.tensor([3.0, 4.0], dtype=torch.float64)
    clipped, norm = clip_to_norm(delta, 1.0)
    assert norm == 5.0 and torch.allclose(clipped, delta / 5)
    assert clip_to_norm(delta, 10.0)[0] is delta and clip_to_norm(delta, math.inf)[0] is delta


@pytest.mark.parametrize("mechanism", ["central", "local"])
def test_every_clients_upload_is_clipped(tmp_path, mechanism):
    clip = 0.05
    federation = Federation(tmp_path, [f"privacy.mechanism={mechanism}", f"privacy.clip={clip}", "privacy.noise_multiplier=0"])
    broadcast = federation.algorithm.broadcast(federation.state, 1)
    path = ClientUploadPath(federation.config, federation.algorithm, federation.num_clients)
    for client_id in range(federation.num_clients):
        update = path.apply(1, client_id, federation.client_update(1, client_id), broadcast)
        assert set(update.sums) == {"weights", "num_samples"} and float(update.sums["num_samples"]) == 1.0
        assert float(torch.linalg.vector_norm(update.sums["weights"])) <= clip * (1 + 1e-12)
        assert update.metrics["update_norm"] > clip  # the bound was active: one local epoch moves more


def test_no_noise_and_no_clip_leave_the_clients_deltas_bit_identical(tmp_path):
    """clip ∞ and z 0: what reaches aggregate is exactly w + Σ_k (w_k − w) / m of the non-private updates."""
    clients = [0, 2, 5]
    private = Federation(tmp_path / "private", ["privacy.mechanism=central", "privacy.clip=.inf", "privacy.noise_multiplier=0"])
    plain = Federation(tmp_path / "plain", [])
    weights = plain.state["weights"].double()
    deltas = [plain.client_update(1, cid).sums for cid in clients]
    total = None
    for sums in deltas:
        delta = sums["weights"].double() / sums["num_samples"] - weights
        total = delta.clone() if total is None else total + delta
    private.run_round(1, clients)
    result = private.results[0]
    assert torch.equal(result.sums["weights"], 3 * weights + total)
    assert float(result.sums["num_samples"]) == 3.0


def test_off_by_default_and_explicitly_off_are_the_same_run(tmp_path):
    default = Federation(tmp_path / "default", []).run(2)
    off = Federation(tmp_path / "off", ["privacy.mechanism=none", "robust.rule=none", "robust.malicious_fraction=0"]).run(2)
    assert default.rows == off.rows
    assert default.engine.upload_path is None and default.worker.upload_path is None
    assert "privacy" not in default.config.to_dict() and "robust" not in default.config.to_dict()


def test_resume_from_a_checkpoint_is_bit_identical(tmp_path):
    overrides = ["privacy.mechanism=local", "privacy.clip=0.5", "privacy.noise_multiplier=0.3", "robust.rule=median"]
    straight = Federation(tmp_path / "straight", overrides).run(3)
    resumed = Federation(tmp_path / "first", overrides).run(2).resumed(tmp_path / "resumed").run(1)
    assert resumed.rows == straight.rows
    assert torch.equal(resumed.state["weights"], straight.state["weights"])
    assert int(resumed.engine.upload_path.participations.sum()) == 9


def test_central_accounting_resumes_and_the_budget_stops_the_run(tmp_path):
    overrides = [*CENTRAL, "privacy.target_epsilon=2.2"]  # ε = 1.16, 1.91, 2.56 after rounds 1-3
    federation = Federation(tmp_path / "run", overrides)
    epsilons = []
    with pytest.raises(PrivacyBudgetExhausted, match=r"round 3 would spend ε = 2.558 > privacy.target_epsilon = 2.2"):
        for round in range(1, 5):
            epsilons.append(federation.run_round(round)["dp_epsilon"])
    assert len(epsilons) == 2 and epsilons[-1] == pytest.approx(1.9128, abs=1e-4)
    with pytest.raises(PrivacyBudgetExhausted):
        federation.resumed(tmp_path / "resumed").run_round(len(epsilons) + 1)


# ----------------------------------------------------------------------------- what can be made private
@pytest.mark.parametrize(
    ("algorithm", "message"),
    [
        ("feddyn", "feddyn does not declare what it uploads"),
    ],
)
def test_algorithms_with_uploads_the_mechanism_cannot_privatise_are_refused(tmp_path, algorithm, message):
    from fedray.algorithms.requirements import check_requirements

    federation = Federation(tmp_path, [f"algorithm.name={algorithm}"])
    private = federation.config.model_copy(
        update={"privacy": federation.config.privacy.model_copy(update={"mechanism": "central", "noise_multiplier": 1.0})}
    )
    federation.algorithm.config = private
    with pytest.raises(ConfigError, match=message):
        check_requirements(federation.algorithm, federation.initial_model)


def test_an_undeclared_upload_stops_the_worker(tmp_path):
    federation = Federation(tmp_path, [*CENTRAL])
    update = federation.client_update(1, 0)
    update.sums["prototype_sums"] = torch.zeros(3)
    path = ClientUploadPath(federation.config, federation.algorithm, federation.num_clients)
    with pytest.raises(TypeError, match=r"uploads sums\['prototype_sums'\], which its `uploads` do not declare"):
        path.apply(1, 0, update, federation.algorithm.broadcast(federation.state, 1))


# ----------------------------------------------------------------------------- bad input on the CLI
BAD = [
    ("epsilon-zero", ["privacy.mechanism=central", "privacy.target_epsilon=0"], "privacy.target_epsilon: Input should be greater than 0"),
    (
        "delta-one",
        ["privacy.mechanism=central", "privacy.noise_multiplier=1", "privacy.delta=1"],
        "privacy.delta: Input should be less than 1",
    ),
    (
        "delta-large",
        ["privacy.mechanism=central", "privacy.noise_multiplier=1", "privacy.delta=0.1"],
        "privacy.delta (0.1) is >= 1/population (1/20)",
    ),
    (
        "clip-zero",
        ["privacy.mechanism=central", "privacy.noise_multiplier=1", "privacy.clip=0"],
        "privacy.clip: Input should be greater than 0",
    ),
    (
        "sigma-negative",
        ["privacy.mechanism=central", "privacy.noise_multiplier=-1"],
        "privacy.noise_multiplier: Input should be greater than or equal to 0",
    ),
    (
        "noise-cohort",
        ["privacy.mechanism=central", "privacy.noise_multiplier=1", "privacy.noise_cohort_size=5"],
        "privacy.noise_cohort_size (5) must be >= train.clients_per_round (10)",
    ),
    ("trim-half", ["robust.rule=trimmed_mean", "robust.trim_fraction=0.5"], "robust.trim_fraction: Input should be less than 0.5"),
    ("krum-few", ["robust.rule=krum", "robust.krum_f=4"], "needs train.clients_per_round >= 2f + 3 = 11 (got 10)"),
    ("no-noise", ["privacy.mechanism=central"], "privacy.mechanism needs privacy.noise_multiplier or privacy.target_epsilon"),
    (
        "prototypes-unbounded",
        ["algorithm.name=fedsc", "privacy.mechanism=central", "privacy.noise_multiplier=1", "privacy.sampling=fixed_size"],
        "privacy.clip_prototypes: fedsc uploads prototypes",
    ),
]


@pytest.mark.parametrize(("overrides", "expected"), [case[1:] for case in BAD], ids=[case[0] for case in BAD])
def test_bad_privacy_input_exits_2_with_one_line(tmp_path, overrides, expected):
    """The real ``fedray run``, each case a fork of a preloaded process (tests/preloaded_cli.py)."""
    args = ["run", "--set", "resources.num_workers=1", "--set", "train.rounds=1"]
    for override in overrides:
        args += ["--set", override]
    result = run_fedray_preloaded(args, tmp_path)
    assert_rejected(result, expected)
