"""Adaptive clipping (``privacy.clipping: adaptive``; Andrew et al., NeurIPS 2021, "Differentially Private
Learning with Adaptive Clipping"): the bound follows the target quantile of the update norms, the
workers clip to the bound the server broadcasts, the noise on the count of unclipped updates and on
the update have the stds of the paper's Theorem 1 while the accountant charges the effective z, the
bound is checkpointed (resume is bit-identical), and bad settings are refused with one line."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
import torch
from dp_accounting import rdp
from test_bad_inputs import assert_rejected, run_fedray

from fedray import load_config
from fedray.algorithms import RoundResults
from fedray.config import ConfigError
from fedray.privacy.accountant import CentralAccountant
from fedray.privacy.mechanisms import update_noise_multiplier
from fedray.runtime.upload_path import ADAPTIVE_CLIP, ClientUploadPath, ServerUploadPath
from fedray.testing import Federation

ADAPTIVE = ["privacy.mechanism=central", "privacy.clipping=adaptive"]


def server_path(population: int, cohort: int, overrides: list[str]) -> ServerUploadPath:
    config = load_config(None, [f"data.num_clients={population}", f"train.clients_per_round={cohort}", *ADAPTIVE, *overrides])
    return ServerUploadPath(config)


def round_results(norms: dict[int, float], size: int = 1) -> RoundResults:
    """A round's merged results as the workers send them under central DP: the sum of the clipped
    deltas (zero here, so that what the server adds is its noise alone) and each client's norm."""
    sums = {"weights": torch.zeros(size, dtype=torch.float64), "num_samples": torch.tensor(float(len(norms)), dtype=torch.float64)}
    return RoundResults(sums, {}, {cid: {"update_norm": norm} for cid, norm in norms.items()}, len(norms), [])


# ----------------------------------------------------------------------------- Theorem 1
@pytest.mark.parametrize(("z", "count_stddev"), [(0.8, 2.0), (1.1, 0.6), (3.0, 10.0)])
def test_update_and_count_noise_together_are_one_gaussian_mechanism_of_multiplier_z(z, count_stddev):
    """Andrew et al., Thm. 1: the update noised with z_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2) and the centred count
    (sensitivity ½) with σ_b compose, by dp-accounting's own Rényi accounting, to a Gaussian of multiplier z."""
    z_update = update_noise_multiplier(z, count_stddev)
    assert z_update == pytest.approx((z**-2 - (2 * count_stddev) ** -2) ** -0.5, rel=1e-15) and z_update > z
    both, one = rdp.RdpAccountant(), rdp.RdpAccountant()
    both.compose(dp_accounting.ComposedDpEvent([dp_accounting.GaussianDpEvent(z_update), dp_accounting.GaussianDpEvent(2 * count_stddev)]))
    one.compose(dp_accounting.GaussianDpEvent(z))
    assert both.get_epsilon(1e-5) == pytest.approx(one.get_epsilon(1e-5), rel=1e-9)


def test_the_update_noise_has_std_z_delta_c_m_over_m_and_the_accountant_charges_z():
    """200 000 draws estimate a std to ±0.4 % (3 standard errors), far inside the 10 % an error would show."""
    z, count_stddev, clip, cohort, noise_cohort = 0.8, 0.6, 0.5, 4, 12  # z_Δ = 1.07
    path = server_path(20, cohort, [f"privacy.noise_multiplier={z}", f"privacy.clip={clip}", f"privacy.clipped_count_stddev={count_stddev}",
                                    f"privacy.noise_cohort_size={noise_cohort}"])  # fmt: skip
    results, row = path.apply(3, round_results({0: 0.1, 1: 0.2, 2: 0.9, 3: 2.0}, size=200_000), torch.zeros(200_000))
    z_update = (z**-2 - (2 * count_stddev) ** -2) ** -0.5
    expected = z_update * clip * cohort / noise_cohort
    assert abs(float(results.sums["weights"].std()) / expected - 1) < 0.1 / 3
    assert abs(float(results.sums["weights"].std()) / (z * clip * cohort / noise_cohort) - 1) > 0.1  # z_Δ, not z
    assert row["dp_noise_multiplier"] == z and row["dp_clip"] == clip and row["dp_clipped_fraction"] == 0.5
    assert row["dp_epsilon"] == CentralAccountant("rdp", "poisson", 20, noise_cohort, 20**-1.1).epsilon(z, 1)


def test_the_count_noise_has_std_sigma_b_m_over_m():
    """The noise on the count of unclipped updates, read back from each round's geometric step
    (b̃ = γ − ln(C_{t+1}/C_t)/η_C): 4 000 rounds estimate its std to ±3.4 % (3 standard errors)."""
    count_stddev, cohort, noise_cohort, quantile, lr = 2.0, 5, 20, 0.5, 0.2
    path = server_path(40, cohort, ["privacy.noise_multiplier=0", f"privacy.clipped_count_stddev={count_stddev}",
                                    f"privacy.noise_cohort_size={noise_cohort}"])  # fmt: skip
    noises = []
    for round in range(1, 4001):
        clip = path.clip
        path.apply(round, round_results({0: clip / 2, 1: clip / 2, 2: 2 * clip, 3: 2 * clip, 4: 2 * clip}), torch.zeros(1))
        noisy_fraction = quantile - math.log(path.clip / clip) / lr
        noises.append(noisy_fraction * cohort - 2)  # two of the five updates were within the bound
    expected = count_stddev * cohort / noise_cohort
    assert abs(float(np.mean(noises))) < 3 * expected / math.sqrt(len(noises))
    assert abs(float(np.std(noises)) / expected - 1) < 0.035  # and an error of 10 % in σ_b fails


# ----------------------------------------------------------------------------- the bound follows the quantile
@pytest.mark.parametrize("quantile", [0.3, 0.8])
def test_the_clip_converges_to_the_target_quantile_of_the_update_norms(quantile):
    """A population of 500 clients with fixed update norms (log-normal), 50 drawn per round, the bound
    starting 100× below them: after 150 rounds it stays within 10 % of the norms' γ-quantile and leaves
    about γ of the updates unclipped (σ_b = m/20, η_C = 0.2: the paper's defaults)."""
    rng = np.random.default_rng(0)
    norms = np.exp(rng.normal(0.0, 0.7, size=500))
    path = server_path(
        500, 50, ["privacy.noise_multiplier=0", "privacy.clip=0.01", f"privacy.target_quantile={quantile}"]
    )  # z: no matter here
    clips, unclipped = [], []
    for round in range(1, 301):
        cohort = rng.choice(500, size=50, replace=False)
        clips.append(path.clip)
        unclipped.append(float(np.mean(norms[cohort] <= path.clip)))
        path.apply(round, round_results({int(cid): float(norms[cid]) for cid in cohort}), torch.zeros(1))
    target = float(np.quantile(norms, quantile))
    assert clips[0] < target / 50
    assert abs(float(np.median(clips[150:])) / target - 1) < 0.1
    assert abs(float(np.mean(unclipped[150:])) - quantile) < 0.05


def test_the_workers_clip_to_the_bound_the_server_broadcasts(tmp_path):
    federation = Federation(tmp_path, [*ADAPTIVE, "privacy.clip=1.0", "privacy.noise_multiplier=0"])
    path = federation.engine.upload_path
    path.clip = 0.03  # the bound of a later round, far below privacy.clip
    broadcast = path.broadcast(federation.algorithm.broadcast(federation.state, 1))
    assert float(broadcast[ADAPTIVE_CLIP]) == 0.03
    clients = ClientUploadPath(federation.config, federation.algorithm, federation.num_clients)
    for client_id in range(federation.num_clients):
        update = clients.apply(1, client_id, federation.client_update(1, client_id), broadcast)
        assert float(torch.linalg.vector_norm(update.sums["weights"])) <= 0.03 * (1 + 1e-12) < update.metrics["update_norm"]


def test_a_run_raises_a_bound_that_clips_every_update(tmp_path):
    rows = Federation(tmp_path, [*ADAPTIVE, "privacy.clip=0.001", "privacy.noise_multiplier=0.2"]).run(3).rows
    clips = [row["dp_clip"] for row in rows]
    assert clips[0] == 0.001 and clips[0] < clips[1] < clips[2]
    assert all(row["dp_clipped_fraction"] == 1.0 for row in rows)


def test_fixed_clipping_broadcasts_nothing_more(tmp_path):
    federation = Federation(tmp_path, ["privacy.mechanism=central", "privacy.noise_multiplier=0.5"])
    assert ADAPTIVE_CLIP not in federation.engine.broadcast(1) and "dp_clip" not in federation.run_round(1)


# ----------------------------------------------------------------------------- checkpoints
def test_resume_with_adaptive_clipping_is_bit_identical(tmp_path):
    overrides = [*ADAPTIVE, "privacy.clip=0.05", "privacy.noise_multiplier=0.5", "privacy.clipped_count_stddev=1"]
    straight = Federation(tmp_path / "straight", overrides).run(3)
    resumed = Federation(tmp_path / "first", overrides).run(2).resumed(tmp_path / "resumed").run(1)
    assert resumed.rows == straight.rows
    assert torch.equal(resumed.state["weights"], straight.state["weights"])
    assert resumed.engine.upload_path.clip == straight.engine.upload_path.clip != 0.05


# ----------------------------------------------------------------------------- bad input
def test_a_calibrated_z_the_count_noise_cannot_carry_is_refused(tmp_path):
    overrides = [*ADAPTIVE, "privacy.target_epsilon=0.5", "privacy.clipped_count_stddev=0.2"]
    with pytest.raises(ConfigError, match=r"privacy.clipped_count_stddev: σ_b = 0.2 must be > z/2 = "):
        Federation(tmp_path, overrides)


BAD = [
    ("local", ["privacy.mechanism=local", "privacy.noise_multiplier=1", "privacy.clipping=adaptive"], "needs privacy.mechanism=central"),
    (
        "count-noise",
        [*ADAPTIVE, "privacy.noise_multiplier=1.2"],  # σ_b = 10/20 = 0.5 by default
        "privacy.clipped_count_stddev: σ_b = 0.5 must be > z/2 = 0.6",
    ),
    (
        "quantile",
        [*ADAPTIVE, "privacy.noise_multiplier=0.5", "privacy.target_quantile=1"],
        "privacy.target_quantile: Input should be less than 1",
    ),
    ("clip-lr", [*ADAPTIVE, "privacy.noise_multiplier=0.5", "privacy.clip_lr=0"], "privacy.clip_lr: Input should be greater than 0"),
    (  # z calibrated from the target: known only once the accountant has run, still before Ray starts
        "calibrated-on-ray",
        [*ADAPTIVE, "privacy.target_epsilon=0.5", "privacy.clipped_count_stddev=0.2", "resources.backend=ray"],
        "privacy.clipped_count_stddev: σ_b = 0.2 must be > z/2 = ",
    ),
]


@pytest.mark.parametrize(("overrides", "expected"), [case[1:] for case in BAD], ids=[case[0] for case in BAD])
def test_bad_adaptive_clipping_input_exits_2_with_one_line(tmp_path, overrides, expected):
    args = ["run", "--set", "resources.num_workers=1", "--set", "train.rounds=1"]
    for override in overrides:
        args += ["--set", override]
    assert_rejected(run_fedray(args, tmp_path), expected)
