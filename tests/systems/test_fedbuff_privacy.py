"""``train.mode: async`` (FedBuff) with ``privacy`` and ``robust``: central noise once on each
buffer's sum over the fixed denominator K, accounted at q = 1; local DP's per-client ε; robust rules
over a buffer's staleness-weighted deltas; attackers; the keys refused; a resume. Ray-free: real
engines in this process (fedray.testing.Federation) and the local backend for whole runs."""

from __future__ import annotations

import dp_accounting
import numpy as np
import pytest
import torch

import fedray
from e2e_helpers import CrashAfterRound, comparable_rows, final_weights, round_rows
from fedray.aggregation.attacks import Attackers
from fedray.aggregation.robust import coordinate_median
from fedray.algorithms import RoundResults
from fedray.config import ConfigError
from fedray.plugins import load_config
from fedray.privacy.accountant import epsilon_of, local_epsilon
from fedray.privacy.mechanisms import central_noise
from fedray.runtime import list_checkpoints, load_checkpoint
from fedray.runtime.upload_path import ROBUST_UPDATE, PrivacyBudgetExhausted, ServerUploadPath
from fedray.testing import SMALL, Federation
from preloaded_cli import run_fedray_preloaded
from test_bad_inputs import assert_rejected
from test_fedbuff import STALE, run_async, run_local

CENTRAL = ["privacy.mechanism=central", "privacy.noise_multiplier=0.5", "privacy.clip=1.0"]
LOCAL = ["privacy.mechanism=local", "privacy.noise_multiplier=2.0", "privacy.clip=1.0"]
# three clients of 479 samples each (the digits' 1,437 training samples, iid), three training at once, a buffer of two
EQUAL = ["systems.enabled=true", "train.mode=async", "data.num_clients=3", "data.partition=iid", "systems.fedbuff.buffer_size=2"]
ROUNDS = 5


def _config(*overrides: str):
    return load_config(None, [*SMALL, *STALE, *overrides])


def _groups(deltas: list[list[torch.Tensor]], weights: list[float], starts: list[torch.Tensor], first_id: int = 0, robust: bool = False):
    """Per version, the merged results of clients whose uploads are ``deltas`` (as the client upload
    path leaves them under privacy: the deltas' sum and a count of ones, or each delta alone for a rule)."""
    groups, cid = [], first_id
    for group, weight, start in zip(deltas, weights, starts):
        ids = list(range(cid, cid + len(group)))
        cid += len(group)
        if robust:
            payloads = {i: {ROBUST_UPDATE: delta.clone()} for i, delta in zip(ids, group)}
            sums = {}
        else:
            payloads = {}
            sums = {"weights": torch.stack(group).sum(0), "num_samples": torch.tensor(float(len(group)), dtype=torch.float64)}
        results = RoundResults(sums, payloads, {i: {} for i in ids}, len(group), [])
        groups.append((results, weight, start))
    return groups


# --------------------------------------------------------------------- the maths of one buffer


@pytest.mark.parametrize("mixing", ["delta", "model"])
def test_central_noise_is_drawn_once_on_the_buffers_sum_and_divided_by_K(mixing):
    """w + (Σ_k s(τ_k)·(clip(Δ_k) + p_k) + N(0, (z·C)²)) / K with one draw for the buffer (not one per
    version group), and K even though only three updates arrived in a buffer of four."""
    config = _config(*CENTRAL, "systems.fedbuff.buffer_size=4", f"systems.fedbuff.mixing={mixing}")
    path = ServerUploadPath(config)
    g = torch.Generator().manual_seed(1)
    current, old = torch.randn(300, generator=g), torch.randn(300, generator=g)
    fresh, stale = (
        [torch.randn(300, generator=g, dtype=torch.float64) * 0.1 for _ in range(2)],
        [torch.randn(300, dtype=torch.float64) * 0.1],
    )
    results, row = path.apply_buffer(4, _groups([fresh, stale], [1.0, 0.5], [current, old]), current)
    mean = results.sums["weights"] / results.sums["num_samples"]
    assert float(results.sums["num_samples"]) == 4  # the fixed denominator K
    public = (old.double() - current.double()) if mixing == "model" else 0.0
    summed = fresh[0] + fresh[1] + 0.5 * (stale[0] + public)
    noise = central_noise(config.seed, 4, summed, 0.5 * 1.0)  # z·C on the sum, drawn from (seed, round)
    assert torch.allclose(mean, current.double() + (summed + noise) / 4, rtol=0, atol=1e-12)
    assert row["dp_noise_multiplier"] == 0.5


def test_the_released_sums_noise_std_is_zC_over_K(tmp_path):
    """Measured on a run: the same first buffer with z > 0 and z = 0 differs by the noise alone, whose
    std over the model's parameters is z·C/K."""
    z, clip, buffer = 0.5, 1.0, 2
    noisy = Federation(tmp_path / "noisy", [*STALE, "privacy.mechanism=central", f"privacy.noise_multiplier={z}", f"privacy.clip={clip}"])
    exact = Federation(tmp_path / "exact", [*STALE, "privacy.mechanism=central", "privacy.noise_multiplier=0", f"privacy.clip={clip}"])
    for federation in (noisy, exact):
        federation.engine.run_round(1)
    difference = (noisy.state["weights"].double() - exact.state["weights"].double()).numpy()
    assert difference.size > 2000
    assert abs(difference.std() / (z * clip / buffer) - 1) < 0.05
    assert abs(difference.mean()) < 0.05 * z * clip / buffer


def test_without_noise_or_clipping_it_is_the_non_private_run_when_the_clients_weigh_the_same(tmp_path):
    """z = 0 and C = ∞: Σ_k s(τ_k)·Δ_k / K is FedBuff's Σ_k s(τ_k)·n_k·Δ_k / Σ_k n_k when every n_k is
    the same and every buffer is full (uniform client weights otherwise differ from the n_k weighting)."""
    dp_federation = Federation(tmp_path / "dp", [*EQUAL, "privacy.mechanism=central", "privacy.noise_multiplier=0", "privacy.clip=.inf"])
    plain_federation = Federation(tmp_path / "plain", EQUAL)
    private, plain = run_async(dp_federation, ROUNDS), run_async(plain_federation, ROUNDS)
    assert max(result["round"]["staleness_max"] for result in plain) >= 1  # stale updates are in it
    assert [[c["client_id"] for c in r["clients"]] for r in private] == [[c["client_id"] for c in r["clients"]] for r in plain]
    for a, b in zip(private, plain):
        assert a["round"]["test_loss"] == pytest.approx(b["round"]["test_loss"], rel=1e-5)
    assert torch.allclose(dp_federation.state["weights"], plain_federation.state["weights"], rtol=0, atol=1e-5)
    assert not torch.equal(dp_federation.state["weights"], Federation(tmp_path / "init", EQUAL).state["weights"])


# --------------------------------------------------------------------- accounting


def test_each_aggregation_is_one_gaussian_mechanism_composed_without_amplification(tmp_path):
    federation = Federation(tmp_path, [*STALE, *CENTRAL])
    rows = [result["round"] for result in run_async(federation, 3)]
    delta = federation.engine.upload_path.delta
    for t, row in enumerate(rows, start=1):
        assert row["dp_epsilon"] == pytest.approx(epsilon_of(dp_accounting.GaussianDpEvent(0.5), t, delta, "rdp"), rel=1e-9)
    sampled = epsilon_of(dp_accounting.PoissonSampledDpEvent(2 / 10, dp_accounting.GaussianDpEvent(0.5)), 3, delta, "rdp")
    assert rows[-1]["dp_epsilon"] > 2 * sampled  # no amplification by sampling: a buffer is not a uniform sample


def test_a_target_epsilon_is_calibrated_at_q_1(tmp_path):
    config = _config("privacy.mechanism=central", "privacy.target_epsilon=8", "train.rounds=4")
    path = ServerUploadPath(config)
    z = path.noise_multiplier
    assert epsilon_of(dp_accounting.GaussianDpEvent(z), 4, path.delta, "rdp") == pytest.approx(8, rel=1e-3)
    sync = ServerUploadPath(
        load_config(None, [*SMALL, "data.num_clients=10", "privacy.mechanism=central", "privacy.target_epsilon=8", "train.rounds=4"])
    )
    assert z > sync.noise_multiplier  # the synchronous run's sampling amplifies; the buffer's does not


def test_a_target_epsilon_stops_the_run_before_a_buffer_past_it(tmp_path):
    federation = Federation(tmp_path, [*STALE, "privacy.mechanism=central", "privacy.target_epsilon=8", "train.rounds=2"])
    rows = [result["round"] for result in run_async(federation, 2)]
    assert rows[-1]["dp_epsilon"] == pytest.approx(8, rel=1e-3)
    with pytest.raises(PrivacyBudgetExhausted, match="round 3 would spend"):
        federation.engine.run_round(3)


def test_local_dp_accounts_each_client_by_its_own_releases_once_per_buffer(tmp_path):
    """A client is in a buffer at most once (the schedule: once per model version, finished clients
    wait for the next aggregation), so its ε after its j-th buffer is j Gaussian releases."""
    results = run_async(Federation(tmp_path, [*STALE, *LOCAL]), 6)
    participations: dict[int, int] = {}
    for result in results:
        ids = [client["client_id"] for client in result["clients"]]
        assert len(ids) == len(set(ids))  # once per buffer: what bounds a client's change of the sum by C
        for client in result["clients"]:
            participations[client["client_id"]] = participations.get(client["client_id"], 0) + 1
            assert client["dp_epsilon"] == local_epsilon(2.0, participations[client["client_id"]], 10**-1.1, "rdp")
        assert result["round"]["dp_epsilon"] == local_epsilon(2.0, max(participations.values()), 10**-1.1, "rdp")
    assert max(participations.values()) >= 2


def test_local_dp_combines_the_noised_deltas_by_version_and_staleness():
    """w + Σ_k s(τ_k)·(clip(Δ_k) + N(0, (z·C)²)) / k over the k updates received (noised on the workers)."""
    config = _config(*LOCAL)
    g = torch.Generator().manual_seed(2)
    current, old = torch.randn(50, generator=g), torch.randn(50, generator=g)
    fresh, stale = [torch.randn(50, generator=g, dtype=torch.float64)], [torch.randn(50, generator=g, dtype=torch.float64)]
    results, row = ServerUploadPath(config).apply_buffer(3, _groups([fresh, stale], [1.0, 0.25], [current, old]), current)
    mean = results.sums["weights"] / results.sums["num_samples"]
    assert torch.allclose(mean, current.double() + (fresh[0] + 0.25 * stale[0]) / 2, rtol=0, atol=1e-12)
    assert row["dp_epsilon"] == local_epsilon(2.0, 1, 10**-1.1, "rdp")


# --------------------------------------------------------------------- robust rules and attackers


@pytest.mark.parametrize("mixing", ["delta", "model"])
def test_the_median_of_a_buffer_is_the_median_of_its_staleness_weighted_deltas(mixing):
    config = _config("robust.rule=median", "systems.fedbuff.buffer_size=3", f"systems.fedbuff.mixing={mixing}")
    g = torch.Generator().manual_seed(3)
    current, old = torch.randn(40, generator=g), torch.randn(40, generator=g)
    deltas = [torch.randn(40, generator=g, dtype=torch.float64) for _ in range(3)]
    groups = _groups([deltas[:2], deltas[2:]], [1.0, 1 / np.sqrt(3)], [current, old], robust=True)
    results, _ = ServerUploadPath(config).apply_buffer(2, groups, current)
    public = old.double() - current.double() if mixing == "model" else 0.0
    by_hand = torch.stack([deltas[0], deltas[1], (deltas[2] + public) / np.sqrt(3)]).median(dim=0).values  # n odd: the middle value
    assert torch.allclose(results.sums["weights"] / results.sums["num_samples"], current.double() + by_hand, rtol=0, atol=1e-12)
    assert torch.equal(coordinate_median(torch.stack([deltas[0], deltas[1], (deltas[2] + public) / np.sqrt(3)])), by_hand)


def test_a_median_run_differs_from_the_mean_and_records_its_attackers(tmp_path):
    attacked = run_async(Federation(tmp_path / "attacked", [*STALE, "robust.rule=median", "robust.malicious_fraction=0.3"]), ROUNDS)
    mask = Attackers(_config("robust.malicious_fraction=0.3"), 10).mask
    for result in attacked:
        expected = sum(bool(mask[client["client_id"]]) for client in result["clients"])
        assert result["round"]["malicious_clients"] == expected
    assert sum(result["round"]["malicious_clients"] for result in attacked) >= 1


@pytest.mark.parametrize("attack", ["alie", "label_flip"])
def test_attacks_act_on_the_buffer(tmp_path, attack):
    overrides = [*STALE, "robust.malicious_fraction=0.3", f"robust.attack={attack}"]
    attacked = run_async(Federation(tmp_path / "attacked", overrides), ROUNDS)
    clean = run_async(Federation(tmp_path / "clean", STALE), ROUNDS)
    schedule = [[c["client_id"] for c in r["clients"]] for r in attacked]
    assert schedule == [[c["client_id"] for c in r["clients"]] for r in clean]  # the clock does not depend on the weights
    first = next(i for i, r in enumerate(attacked) if r["round"]["malicious_clients"] > 0)
    assert attacked[first]["round"]["test_loss"] != clean[first]["round"]["test_loss"]


# --------------------------------------------------------------------- refusals


def test_the_keys_that_assume_a_sampled_cohort_are_refused_together():
    with pytest.raises(ConfigError) as error:
        _config(
            *CENTRAL,
            "privacy.population_size=1000",
            "privacy.noise_cohort_size=5",
            "privacy.sampling=fixed_size",
            "privacy.clipping=adaptive",
        )
    lines = str(error.value).splitlines()[1:]
    for line, key in zip(
        lines, ("privacy.population_size", "privacy.noise_cohort_size", "privacy.sampling=fixed_size", "privacy.clipping=adaptive")
    ):
        assert line.strip().startswith(key), lines
    assert len(lines) == 4 and sum("q = 1" in line for line in lines) == 3, lines
    with pytest.raises(ConfigError, match="privacy.audit adds its canaries with the accountant's sampling probability"):
        _config(*CENTRAL, "privacy.audit.canaries=8")
    with pytest.raises(ConfigError, match="trusted execution environment"):
        _config("privacy.secure_aggregation.enabled=true")


def test_a_rule_that_needs_more_updates_than_a_buffer_holds_is_refused_with_the_numbers():
    with pytest.raises(
        ConfigError, match=r"robust.rule=krum with robust.krum_f=1 needs systems.fedbuff.buffer_size >= 2f \+ 3 = 5 \(got 2\)"
    ):
        _config("robust.rule=krum")
    with pytest.raises(ConfigError, match=r"bulyan with robust.krum_f=1 needs systems.fedbuff.buffer_size >= 4f \+ 3 = 7 \(got 4;"):
        _config("robust.rule=bulyan", "systems.fedbuff.buffer_size=4")
    assert _config("robust.rule=krum", "systems.fedbuff.buffer_size=5", "systems.fedbuff.concurrency=6").robust.rule == "krum"


@pytest.mark.slow
def test_an_async_population_size_is_one_line_and_exit_2(tmp_path):
    overrides = ["resources.num_workers=1", *STALE, *CENTRAL, "privacy.population_size=1000"]
    result = run_fedray_preloaded(["run", *[arg for override in overrides for arg in ("--set", override)]], tmp_path)
    assert_rejected(result, "privacy.population_size sets the sampling probability")
    assert not (tmp_path / "runs").exists()


# --------------------------------------------------------------------- reproducibility


def test_one_or_two_workers_release_the_same_buffers(tmp_path):
    one, two = (Federation(tmp_path / str(n), [*STALE, *CENTRAL, f"resources.num_workers={n}"]) for n in (1, 2))
    one_rounds, two_rounds = run_async(one, 4), run_async(two, 4)
    for rounds in (one_rounds, two_rounds):
        for result in rounds:
            del result["round"]["test_loss"]  # summed by worker shard
    assert one_rounds == two_rounds
    assert torch.equal(one.state["weights"], two.state["weights"])


@pytest.mark.parametrize(
    "overrides", [CENTRAL, [*LOCAL, "robust.rule=median", "robust.malicious_fraction=0.3"]], ids=["central", "local_median"]
)
def test_a_resumed_private_async_run_is_bit_identical(tmp_path, overrides):
    settings = ["resources.backend=local", "model.name=mlp", *overrides]
    whole = run_local(tmp_path, "whole", settings)
    with pytest.raises(RuntimeError, match="simulated driver crash"):
        run_local(tmp_path, "cut", settings, callbacks=[CrashAfterRound(3)])
    checkpoint = load_checkpoint(list_checkpoints(tmp_path / "cut")[-1][1])
    assert "upload_path" in checkpoint and checkpoint["fedbuff"]["schedule"]["clients"].numel() > 0
    fedray.resume_experiment(tmp_path / "cut", progress=False)
    rows = comparable_rows(round_rows(whole))
    assert comparable_rows(round_rows(tmp_path / "cut")) == rows
    assert torch.equal(final_weights(tmp_path / "cut"), final_weights(whole))
    assert max(row["staleness_max"] for row in rows) >= 1
    assert all(np.isfinite(row["dp_epsilon"]) for row in rows)
