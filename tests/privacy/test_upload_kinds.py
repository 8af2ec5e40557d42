"""Differential privacy of every upload kind (docs/guide/privacy.md, 'Every upload kind'): prototypes,
class representations, logit knowledge, per-class counts and SCAFFOLD's control variates are clipped
per client to their own bounds and noised with the same Gaussian mechanism, whose parts the accountant
charges as one."""

from __future__ import annotations

import math

import dp_accounting
import pytest
import torch
from dp_accounting import rdp

from fedray.algorithms import RoundResults
from fedray.algorithms.uploads import MODEL_WEIGHTS, private_parts, released_parts
from fedray.privacy.accountant import CentralAccountant, local_epsilon
from fedray.privacy.mechanisms import part_noise_multiplier
from fedray.runtime.upload_path import ClientUploadPath, ServerUploadPath
from fedray.testing import Federation
from preloaded_cli import run_fedray_preloaded
from test_bad_inputs import assert_rejected

#: Each algorithm with uploads besides its weights, and the settings that make them private.
KINDS = {
    "fedproto": ["privacy.clip_prototypes={proto}", "privacy.clip_counts={counts}"],
    "fedproc": ["privacy.clip_prototypes={proto}", "privacy.clip_counts={counts}"],
    "fedcosr": ["privacy.clip_prototypes={proto}", "privacy.clip_counts={counts}"],
    "fedsc": ["privacy.clip_prototypes={proto}", "privacy.sampling=fixed_size"],
    "fedskc": ["privacy.clip_logits={proto}", "privacy.sampling=fixed_size", "algorithm.gda_mode=fedavg"],
    "scaffold": ["privacy.clip_controls={controls}"],
}


def private(
    algorithm: str,
    mechanism: str = "central",
    clip: float = 0.05,
    proto: float = 0.5,
    counts: float = 2.0,
    z: float = 0.0,
    controls: float = 0.05,
) -> list[str]:
    settings = [f"privacy.mechanism={mechanism}", f"privacy.clip={clip}", f"privacy.noise_multiplier={z}"]
    bounds = [s.format(proto=proto, counts=counts, controls=controls) for s in KINDS[algorithm]]
    return [f"algorithm.name={algorithm}", *settings, *bounds]


def _value(update, key: str) -> torch.Tensor:
    return torch.as_tensor(update.sums[key] if key in update.sums else update.payload[key])


# ----------------------------------------------------------------------------- clipping
@pytest.mark.parametrize("mechanism", ["central", "local"])
@pytest.mark.parametrize("algorithm", sorted(KINDS))
def test_every_upload_kind_is_clipped_per_client(tmp_path, algorithm, mechanism):
    """Every key a client uploads is either the clipped weights, a part clipped to its own bound, or a
    constant: a key that reached the server unclipped (not declared ``clipped``) fails here."""
    federation = Federation(tmp_path, private(algorithm, mechanism))
    config, algo = federation.config, federation.algorithm
    bounds = {key: getattr(config.privacy, bound) for upload in algo.run_uploads() for key, bound in upload.clipped}
    constants = {key for upload in algo.run_uploads() for key in upload.constant}
    assert bounds, "the algorithm uploads parts besides its weights"
    broadcast = algo.broadcast(federation.state, 1)
    path = ClientUploadPath(config, algo, federation.num_clients)
    active = set()
    for client_id in range(federation.num_clients):
        plain = federation.client_update(1, client_id)
        update = path.apply(1, client_id, plain, broadcast)
        assert float(torch.linalg.vector_norm(update.sums["weights"])) <= config.privacy.clip * (1 + 1e-12)
        for key in [*update.sums, *update.payload]:
            if key in MODEL_WEIGHTS.sums:
                continue
            value = _value(update, key)
            if key in constants:
                assert torch.equal(value, torch.ones_like(value)), key
                continue
            assert key in bounds, f"{algorithm} uploads {key!r} unclipped"
            assert float(torch.linalg.vector_norm(value.double())) <= bounds[key] * (1 + 1e-6), key
            if update.metrics[f"update_norm_{key}"] > bounds[key]:
                active.add(key)
                # one factor for the whole upload: a class mean (sum / count) is kept
                original = _value(plain, key).double()
                ratio = value.double() / original
                assert torch.allclose(ratio[original != 0], ratio[original != 0].flatten()[0].expand_as(ratio[original != 0]))
    assert active == set(bounds), "every bound was active for some client (small bounds)"


# ----------------------------------------------------------------------------- noise
def _zeros_results(sums: dict[str, torch.Tensor], payloads: dict[int, dict[str, torch.Tensor]], clients: int) -> RoundResults:
    sums = {"weights": torch.zeros(10, dtype=torch.float64), "num_samples": torch.tensor(float(clients), dtype=torch.float64), **sums}
    return RoundResults(sums, payloads, {cid: {} for cid in range(clients)}, clients, [])


def _assert_std(noise: torch.Tensor, expected: float) -> None:
    """200 000 draws estimate a std to ±0.4 % (3 standard errors), far inside the 10 % an error in σ would show."""
    assert abs(float(noise.double().std()) / expected - 1) < 0.1 / 3


def test_central_noise_on_summed_prototypes_and_counts_has_the_configured_std(tmp_path):
    """FedProto releases P = 3 parts (weights, prototype sums, counts): each sum gets √3·z·C_i·m/M."""
    federation = Federation(tmp_path, [*private("fedproto", z=0.8, proto=0.5, counts=3.0), "privacy.noise_cohort_size=6"])
    path = ServerUploadPath(federation.config, federation.algorithm)
    assert path.released_parts == 3 and [p.key for p in path.parts] == ["class_sums", "class_counts"]
    big = torch.zeros(200_000, dtype=torch.float64)
    results, row = path.apply(4, _zeros_results({"class_sums": big, "class_counts": big.clone()}, {}, 3), torch.zeros(10))
    _assert_std(results.sums["class_sums"], math.sqrt(3) * 0.8 * 0.5 * 3 / 6)
    _assert_std(results.sums["class_counts"], math.sqrt(3) * 0.8 * 3.0 * 3 / 6)
    assert row["dp_noise_multiplier"] == 0.8  # the accountant charges the composed z


def test_central_noise_on_scaffolds_summed_control_variates_has_the_configured_std(tmp_path):
    """SCAFFOLD releases P = 2 parts (weights, control-variate updates): the Δc sum gets √2·z·C_c·m/M."""
    federation = Federation(tmp_path, [*private("scaffold", z=0.6, controls=0.3), "privacy.noise_cohort_size=6"])
    path = ServerUploadPath(federation.config, federation.algorithm)
    assert path.released_parts == 2 and [p.key for p in path.parts] == ["delta_control"]
    results, row = path.apply(2, _zeros_results({"delta_control": torch.zeros(200_000, dtype=torch.float64)}, {}, 3), torch.zeros(10))
    _assert_std(results.sums["delta_control"], math.sqrt(2) * 0.6 * 0.3 * 3 / 6)
    assert row["dp_noise_multiplier"] == 0.6


def test_per_client_prototypes_get_their_own_noise_and_anonymous_keys(tmp_path):
    """FedSC under central DP: each client's prototypes get √2·z·C_p (no m/M: each is its own release),
    and reach aggregate keyed 0..K−1 in a seeded order that is not the clients' order."""
    federation = Federation(tmp_path, private("fedsc", z=1.5, proto=0.4))
    path = ServerUploadPath(federation.config, federation.algorithm)
    clients = [1, 3, 4]
    payloads = {cid: {"prototypes": torch.full((200_000,), float(cid))} for cid in clients}
    results, _ = path.apply(9, _zeros_results({}, payloads, 3), torch.zeros(10))
    assert sorted(results.payloads) == [0, 1, 2]
    origins = [round(float(p["prototypes"].mean())) for p in results.payloads.values()]
    assert sorted(origins) == clients and origins != clients
    for payload in results.payloads.values():
        _assert_std(payload["prototypes"] - payload["prototypes"].mean(), math.sqrt(2) * 1.5 * 0.4)


def test_local_noise_on_prototypes_has_the_configured_std(tmp_path):
    federation = Federation(tmp_path, private("fedsc", mechanism="local", z=2.0, proto=0.25))
    path = ClientUploadPath(federation.config, federation.algorithm, federation.num_clients)
    payload = {
        "prototypes": torch.zeros(200_000),
        "class_present": torch.zeros(10, dtype=torch.bool),
        "num_samples": 5.0,
        "discrepancy": 0.3,
    }
    path.privatise_parts(2, 0, {}, payload, {})
    _assert_std(payload["prototypes"], math.sqrt(2) * 2.0 * 0.25)


# ----------------------------------------------------------------------------- accounting
def test_the_parts_are_one_gaussian_mechanism_of_the_composed_multiplier():
    """P parts of multiplier √P·z each: dp-accounting's composition of the P Gaussians equals one
    Gaussian of multiplier z, sampled (central) and per participation (local)."""
    z, parts, population, cohort, rounds, delta = 1.1, 3, 500, 25, 40, 1e-4
    each = part_noise_multiplier(z, parts)
    assert (parts * each**-2) ** -0.5 == pytest.approx(z, rel=1e-15)
    composed = dp_accounting.ComposedDpEvent([dp_accounting.GaussianDpEvent(each)] * parts)
    direct = rdp.RdpAccountant()
    direct.compose(dp_accounting.PoissonSampledDpEvent(cohort / population, composed), rounds)
    ours = CentralAccountant("rdp", "poisson", population, cohort, delta).epsilon(z, rounds)
    assert ours == pytest.approx(direct.get_epsilon(delta), rel=1e-9)
    local = rdp.RdpAccountant()
    local.compose(dp_accounting.ComposedDpEvent([dp_accounting.GaussianDpEvent(each / 2)] * parts), 7)
    assert local_epsilon(z, 7, delta, "rdp") == pytest.approx(local.get_epsilon(delta), rel=1e-9)


def test_a_run_charges_the_composed_multiplier_and_noises_each_part_with_sqrt_p_z(tmp_path):
    federation = Federation(tmp_path, private("fedproto", z=0.9))
    rows = federation.run(2).rows
    accountant = CentralAccountant("rdp", "poisson", 6, 3, 6**-1.1)
    assert [row["dp_epsilon"] for row in rows] == [accountant.epsilon(0.9, 1), accountant.epsilon(0.9, 2)]
    assert released_parts(federation.algorithm) == 3
    assert federation.engine.upload_path.update_noise_multiplier == pytest.approx(0.9 * math.sqrt(3), rel=1e-15)


# ----------------------------------------------------------------------------- identities
def test_no_noise_and_no_clip_leave_prototypes_bit_identical(tmp_path):
    """clip ∞ and z 0: FedProto's prototype sums and counts, and the server's prototypes from them, are
    the non-private run's bit for bit; the weights are w + Σ_k Δ_k / m (DP-FedAvg's uniform mean)."""
    clients = [0, 2, 5]
    overrides = [*private("fedproto", clip=math.inf, proto=math.inf, counts=math.inf)]
    secret = Federation(tmp_path / "private", overrides)
    plain = Federation(tmp_path / "plain", ["algorithm.name=fedproto"])
    weights = plain.state["weights"].double()
    total = sum(u.sums["weights"].double() / u.sums["num_samples"] - weights for u in (plain.client_update(1, c) for c in clients))
    secret.run_round(1, clients)
    plain.run_round(1, clients)
    for key in ("class_sums", "class_counts"):
        assert torch.equal(secret.results[0].sums[key], plain.results[0].sums[key])
    for key in ("prototypes", "prototype_present"):
        assert torch.equal(secret.state[key], plain.state[key])
    assert torch.equal(secret.results[0].sums["weights"], 3 * weights + total)


def test_no_noise_and_no_clip_leave_scaffolds_control_variates_bit_identical(tmp_path):
    """clip ∞ and z 0: round 1's summed Δc_i, the server's c = Σ Δc_i / N and the clients' stored c_i
    are the non-private run's bit for bit (the weights take DP-FedAvg's uniform mean, so later rounds differ)."""
    clients = [1, 3, 4]
    secret = Federation(tmp_path / "private", private("scaffold", clip=math.inf, controls=math.inf))
    plain = Federation(tmp_path / "plain", ["algorithm.name=scaffold"])
    secret.run_round(1, clients)
    plain.run_round(1, clients)
    assert torch.equal(secret.results[0].sums["delta_control"], plain.results[0].sums["delta_control"])
    assert torch.equal(secret.state["control"], plain.state["control"])
    assert not torch.equal(secret.state["control"], torch.zeros_like(secret.state["control"]))


def test_no_noise_and_no_clip_leave_fedscs_prototypes_bit_identical(tmp_path):
    """FedSC: every client's prototypes reach aggregate bit for bit (under anonymous keys)."""
    clients = [1, 2, 4]
    secret = Federation(tmp_path / "private", private("fedsc", clip=math.inf, proto=math.inf))
    plain = Federation(tmp_path / "plain", ["algorithm.name=fedsc"])
    secret.run_round(1, clients)
    plain.run_round(1, clients)
    received = sorted((p["prototypes"] for p in secret.results[0].payloads.values()), key=lambda t: t.sum().item())
    sent = sorted((p["prototypes"] for p in plain.results[0].payloads.values()), key=lambda t: t.sum().item())
    assert all(torch.equal(a, b) for a, b in zip(received, sent, strict=True))


@pytest.mark.parametrize("algorithm", ["fedsc", "fedproto"])
def test_one_and_two_workers_give_bit_identical_private_runs(tmp_path, algorithm):
    overrides = private(algorithm, clip=0.5, proto=2.0, counts=20.0, z=0.7)
    one = Federation(tmp_path / "one", overrides).run(2)
    two = Federation(tmp_path / "two", [*overrides, "resources.num_workers=2"]).run(2)
    assert len(two.workers) == 2
    # test_loss is a float sum over the workers' test shards, which differs in its last bits with their
    # number with or without privacy; the model and every other column are bit-identical
    assert [{k: v for k, v in row.items() if k != "test_loss"} for row in one.rows] == [
        {k: v for k, v in row.items() if k != "test_loss"} for row in two.rows
    ]
    for key, value in one.state.items():
        assert torch.equal(value, two.state[key]), key
    for mine, theirs in zip(one.results, two.results, strict=True):
        assert list(mine.payloads) == list(theirs.payloads)
        assert all(torch.equal(mine.payloads[slot]["prototypes"], theirs.payloads[slot]["prototypes"]) for slot in mine.payloads)


# ----------------------------------------------------------------------------- what stays refused, bad input
PROTO = ["privacy.mechanism=central", "privacy.noise_multiplier=1"]
BAD = [
    (
        "clip-zero",
        ["algorithm.name=fedproto", *PROTO, "privacy.clip_prototypes=0"],
        "privacy.clip_prototypes: Input should be greater than 0",
    ),
    ("clip-missing", ["algorithm.name=fedsc", *PROTO, "privacy.sampling=fixed_size"], "privacy.clip_prototypes: fedsc uploads prototypes"),
    (
        "clip-infinite",
        ["algorithm.name=fedskc", "algorithm.gda_mode=fedavg", *PROTO, "privacy.sampling=fixed_size", "privacy.clip_logits=.inf"],
        "privacy.clip_logits: must be finite when the noise multiplier is not 0",
    ),
    (
        "poisson-per-client",
        ["algorithm.name=fedsc", *PROTO, "privacy.clip_prototypes=1"],
        "privacy.sampling: fedsc uploads prototypes per client",
    ),
    (
        "weights-per-client",
        ["algorithm.name=fedskc", *PROTO, "privacy.clip_logits=1", "privacy.sampling=fixed_size"],
        "fedskc uploads model weights per client (payload['weights']), which cannot be clipped and noised: it would be sent in "
        "the clear; set algorithm.gda_mode=fedavg",
    ),
    ("controls-missing", ["algorithm.name=scaffold", *PROTO], "privacy.clip_controls: scaffold uploads control variates"),
]


@pytest.mark.parametrize(("overrides", "expected"), [case[1:] for case in BAD], ids=[case[0] for case in BAD])
def test_bad_upload_privacy_input_exits_2_with_one_line(tmp_path, overrides, expected):
    """The real ``fedray run``, each case a fork of a preloaded process (tests/preloaded_cli.py)."""
    args = ["run", "--set", "resources.num_workers=1", "--set", "train.rounds=1"]
    for override in overrides:
        args += ["--set", override]
    assert_rejected(run_fedray_preloaded(args, tmp_path), expected)


def test_kernel_matrices_stay_refused(tmp_path):
    from fedray.algorithms.requirements import check_requirements
    from fedray.config import ConfigError

    federation = Federation(tmp_path, ["algorithm.name=hetero_ssfl", *PROTO])
    assert private_parts(federation.algorithm) == []
    with pytest.raises(ConfigError, match=r"hetero_ssfl uploads kernel matrices \(payload\['representations'\]"):
        check_requirements(federation.algorithm, federation.initial_model)


def test_calibration_under_fixed_size_sampling_reaches_the_target():
    """dp-accounting's search from z = 0 divides by zero for sampling without replacement."""
    accountant = CentralAccountant("rdp", "fixed_size", 10_000, 500, 1e-4)
    z = accountant.noise_multiplier_for(4.0, 30)
    assert accountant.epsilon(z, 30) == pytest.approx(4.0, rel=1e-3)
    assert accountant.epsilon(z * 1.05, 30) < 4.0 < accountant.epsilon(z * 0.95, 30)
