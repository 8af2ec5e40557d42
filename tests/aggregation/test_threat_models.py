"""Threat models (fedray.aggregation, ``robust.*``): Bulyan, ALIE, label flipping and the backdoor
against direct computations; per-round attacker sampling; the checks that refuse what cannot be
simulated; and the attacks inside real rounds (fedray.testing.Federation: the real engine and
workers, nothing mocked)."""

from __future__ import annotations

from statistics import NormalDist

import numpy as np
import pytest
import torch

from fedray.aggregation.attacks import (
    alie_updates,
    alie_z,
    backdoor_test_set,
    flipped_labels,
    malicious_clients,
    poisoned_data,
    poisoned_samples,
    round_attackers,
    stamp_trigger,
)
from fedray.aggregation.robust import bulyan, bulyan_selection, coordinate_median, robust_aggregate
from fedray.config import ConfigError
from fedray.plugins import load_config
from fedray.runtime.upload_path import ROBUST_UPDATE
from fedray.models.weights import set_flat_weights
from fedray.seeding import sample_cohort
from fedray.testing import SMALL, Federation


# ---------------------------------------------------------------------- Bulyan
def _bulyan_reference(updates: np.ndarray, f: int) -> np.ndarray:
    """Bulyan written out in numpy, loop by loop (El Mhamdi et al. 2018, Sec. 4)."""
    remaining, selected = list(range(len(updates))), []
    for _ in range(len(updates) - 2 * f):
        scores = []
        for i in remaining:
            distances = sorted(float(((updates[i] - updates[j]) ** 2).sum()) for j in remaining if j != i)
            scores.append(sum(distances[: max(len(remaining) - f - 2, 1)]))
        selected.append(remaining.pop(int(np.argmin(scores))))
    chosen = updates[selected]
    beta = len(selected) - 2 * f
    result = np.empty(updates.shape[1])
    for j in range(updates.shape[1]):
        column = chosen[:, j]
        closest = np.argsort(np.abs(column - np.median(column)), kind="stable")[:beta]
        result[j] = column[closest].mean()
    return result


def test_bulyan_by_hand():
    """Seven scalars, f = 1: Krum picks 2, 3, 1, 4, 0 (θ = 5; the outlier 100 and the farthest honest
    value 5 are left out), their median is 2, and the β = 3 values closest to it are 2, 1 and 3."""
    updates = torch.tensor([[0.0], [1.0], [2.0], [3.0], [4.0], [5.0], [100.0]], dtype=torch.float64)
    assert bulyan_selection(updates, 1).tolist() == [2, 3, 1, 4, 0]
    assert bulyan(updates, 1).tolist() == [2.0]
    assert robust_aggregate("bulyan", updates, 0.1, 1, None).tolist() == [2.0]


@pytest.mark.parametrize("f", [1, 2])
def test_bulyan_is_the_papers_rule(f):
    rng = np.random.default_rng(f)
    n = 4 * f + 3 + 2
    updates = np.concatenate([rng.normal(0.0, 1.0, size=(n - f, 6)), rng.normal(50.0, 1.0, size=(f, 6))])
    result = bulyan(torch.from_numpy(updates), f).numpy()
    assert np.allclose(result, _bulyan_reference(updates, f), rtol=0, atol=1e-12)
    assert np.abs(result).max() < 3  # the f outliers never move it


def test_bulyan_refuses_too_few_updates():
    with pytest.raises(ValueError, match="4f \\+ 3 = 7"):
        bulyan(torch.zeros(6, 2, dtype=torch.float64), 1)


def test_bulyan_needs_4f_plus_3_clients_per_round():
    with pytest.raises(ConfigError) as error:
        load_config(None, [*SMALL, "data.num_clients=8", "train.clients_per_round=6", "robust.rule=bulyan", "robust.krum_f=1"])
    assert "robust.rule=bulyan with robust.krum_f=1 needs train.clients_per_round >= 4f + 3 = 7 (got 6" in str(error.value)
    load_config(None, [*SMALL, "data.num_clients=8", "train.clients_per_round=7", "robust.rule=bulyan", "robust.krum_f=1"])


# ---------------------------------------------------------------------- ALIE
def test_alie_z_is_the_papers_formula():
    # n = 50, m = 12 (Baruch et al.'s CIFAR setting): s = ⌊26⌋ − 12 = 14, z = Φ⁻¹(36/50) ≈ 0.583
    assert alie_z(50, 12) == pytest.approx(NormalDist().inv_cdf(36 / 50))
    assert alie_z(50, 12) == pytest.approx(0.5828, abs=1e-4)
    assert alie_z(10, 3) == pytest.approx(NormalDist().inv_cdf(7 / 10))  # s = 6 − 3 = 3
    assert alie_z(10, 8) == pytest.approx(NormalDist().inv_cdf(9 / 10))  # s would be < 1


def test_alie_sends_mean_minus_z_std_of_the_benign_updates():
    rng = np.random.default_rng(0)
    updates = rng.normal(size=(8, 5))
    malicious = np.array([False, True, False, False, True, False, False, False])
    out = alie_updates(torch.from_numpy(updates), torch.from_numpy(malicious), 1.5).numpy()
    benign = updates[~malicious]
    expected = benign.mean(axis=0) - 1.5 * benign.std(axis=0)  # numpy's std: ddof = 0
    assert np.allclose(out[1], expected, rtol=0, atol=1e-12) and np.allclose(out[4], expected, rtol=0, atol=1e-12)
    assert np.array_equal(out[~malicious], benign)  # the benign updates are untouched
    default = alie_updates(torch.from_numpy(updates), torch.from_numpy(malicious)).numpy()
    assert np.allclose(default[1], benign.mean(axis=0) - alie_z(8, 2) * benign.std(axis=0), rtol=0, atol=1e-12)


def _honest_round(federation: Federation, cohort: np.ndarray) -> tuple[dict, list[int], torch.Tensor, torch.Tensor]:
    """Round 1's broadcast, and its clients' ids, deltas and sample counts as the workers collect
    them (malicious clients' deltas still honest: ALIE is substituted on the server)."""
    federation.engine.broadcast(1)
    broadcast = federation.engine.plain_broadcast
    partial = federation.worker.run_clients(1, federation.engine.client_tasks(cohort.tolist()), broadcast)
    clients = sorted(partial.payloads)
    deltas = torch.stack([partial.payloads[cid][ROBUST_UPDATE] for cid in clients]).double()
    counts = torch.tensor([float(federation.data.clients.sizes[cid]) for cid in clients], dtype=torch.float64)
    return broadcast, clients, deltas, counts


@pytest.mark.parametrize("rule", ["median", "none"])
def test_alie_in_a_round_replaces_the_attackers_updates(tmp_path, rule):
    """2 of 6 clients attack by ALIE: the row reports the paper's z, and the new model is w + the
    rule (median, or the weighted mean) over the four benign deltas and two copies of μ − z·σ of
    those four, computed here from the clients' own deltas."""
    overrides = [
        "data.num_clients=6",
        "train.clients_per_round=6",
        "robust.attackers=per_round",
        "robust.attackers_per_round=2",
        f"robust.rule={rule}",
        "robust.attack=alie",
    ]
    federation = Federation(tmp_path, overrides)
    broadcast, clients, deltas, counts = _honest_round(federation, sample_cohort(federation.config.seed, 1, 6, 6))
    attackers = round_attackers(federation.config.seed, 1, 6, 6, 2)
    malicious = torch.tensor([cid in attackers for cid in clients])
    attacked = alie_updates(deltas, malicious, alie_z(6, 2))

    def combine(updates: torch.Tensor) -> torch.Tensor:
        if rule == "median":
            return coordinate_median(updates)
        return (counts[:, None] * updates).sum(dim=0) / counts.sum()

    row = federation.run_round(1)
    assert row["malicious_clients"] == 2.0 and row["alie_z"] == pytest.approx(alie_z(6, 2))
    new = federation.state["weights"].double()
    assert torch.allclose(new, broadcast["weights"].double() + combine(attacked), rtol=0, atol=1e-6)
    assert not torch.allclose(new, broadcast["weights"].double() + combine(deltas), rtol=0, atol=1e-6)


# ---------------------------------------------------------------------- data poisoning
def test_label_flipping_maps_y_to_c_minus_1_minus_y():
    y = torch.tensor([0, 1, 2, 9, 4])
    assert flipped_labels(y, 10).tolist() == [9, 8, 7, 0, 5]


def test_the_trigger_is_a_white_square_in_the_bottom_right_corner():
    x = torch.zeros(2, 3, 8, 8, dtype=torch.uint8)
    out = stamp_trigger(x, 3)
    assert (out[:, :, 5:, 5:] == 255).all() and int(out.sum()) == 2 * 3 * 9 * 255  # nothing else
    assert (x == 0).all()  # a copy


def test_backdoor_poisons_a_seeded_share_of_a_malicious_clients_samples():
    config = load_config(None, [*SMALL, "robust.attack=backdoor", "robust.malicious_fraction=0.5", "robust.poison_fraction=0.3"])
    x = torch.randint(0, 100, (20, 1, 8, 8), dtype=torch.uint8)
    y = torch.full((20,), 5)
    px, py = poisoned_data(config, 10, 2, 4, x, y)
    chosen = poisoned_samples(config.seed, 2, 4, 20, 0.3)
    assert len(chosen) == 6 and len(set(chosen.tolist())) == 6  # round(0.3 · 20) distinct samples
    assert (py[chosen] == 0).all() and (py[np.setdiff1d(np.arange(20), chosen)] == 5).all()
    assert (px[chosen][:, :, 5:, 5:] == 255).all()
    assert torch.equal(px[chosen][:, :, :5], x[chosen][:, :, :5]) and torch.equal(px[chosen][:, :, :, :5], x[chosen][:, :, :, :5])
    others = np.setdiff1d(np.arange(20), chosen)
    assert torch.equal(px[others], x[others])
    assert (y == 5).all() and (x <= 100).all()  # the client's own tensors are left as they were
    assert not np.array_equal(chosen, poisoned_samples(config.seed, 3, 4, 20, 0.3))  # drawn again each round


def test_the_backdoor_test_set_is_the_triggered_non_target_samples():
    x = torch.zeros(5, 1, 8, 8, dtype=torch.uint8)
    y = torch.tensor([0, 1, 2, 0, 3])
    tx, ty = backdoor_test_set(x, y, 2, 0)
    assert ty.tolist() == [0, 0, 0] and tx.shape == (3, 1, 8, 8) and (tx[:, :, 6:, 6:] == 255).all()


def test_a_malicious_client_trains_on_flipped_labels_and_an_honest_one_does_not(tmp_path):
    federation = Federation(tmp_path, ["data.num_clients=6", "robust.malicious_fraction=0.5", "robust.attack=label_flip"])
    mask = malicious_clients(federation.config.seed, 6, 0.5)
    bad, good = int(np.flatnonzero(mask)[0]), int(np.flatnonzero(~mask)[0])
    y_bad = torch.as_tensor(federation.data.train.y[federation.data.clients.client(bad)])
    y_good = torch.as_tensor(federation.data.train.y[federation.data.clients.client(good)])
    assert torch.equal(federation.client_context(1, bad).y, 9 - y_bad)
    assert torch.equal(federation.client_context(1, good).y, y_good)


def test_attack_success_rate_is_the_share_of_triggered_test_samples_classified_as_the_target(tmp_path):
    """A backdoor round's attack_success_rate, recomputed from the new global model on the test set."""
    overrides = ["data.num_clients=6", "robust.attack=backdoor", "robust.malicious_fraction=0.5", "robust.target_class=3", "train.lr=0.1"]
    federation = Federation(tmp_path, overrides)
    row = federation.run(2).rows[-1]
    model = federation.algorithm.build_model(federation.algorithm.model_key(None))
    set_flat_weights(model, federation.state["weights"])
    x, y = torch.as_tensor(federation.data.test.x), torch.as_tensor(federation.data.test.y)
    keep = y != 3
    triggered = x[keep].clone()
    triggered[:, :, 5:, 5:] = 255
    with torch.no_grad():
        predicted = model.eval()(federation.data.info.normalize(triggered)).argmax(dim=1)
    assert row["attack_success_rate"] == pytest.approx(float((predicted == 3).double().mean()), abs=1e-12)
    assert all("attack_success_rate" in r for r in federation.rows)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data.name=diabetes", "data.task=regression", "robust.attack=label_flip"], "needs data.task=classification"),
        (["robust.attack=sign_flip", "robust.boost=10"], "robust.boost scales the update of a data-poisoning attack"),
        (["robust.attackers=per_round"], "needs robust.attackers_per_round"),
        (["robust.attackers=per_round", "robust.attackers_per_round=4"], "must be <= train.clients_per_round (3)"),
        (["robust.attackers_per_round=1"], "robust.attackers_per_round is for robust.attackers=per_round"),
    ],
)
def test_impossible_attacks_are_refused_in_one_line(overrides, message):
    with pytest.raises(ConfigError) as error:
        load_config(None, [*SMALL, *overrides])
    assert message in str(error.value)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["robust.trigger_size=9"], "robust.trigger_size (9) is larger than the images of data.name=digits (8×8)"),
        (["robust.target_class=10"], "robust.target_class (10) must be below the 10 classes"),
    ],
)
def test_a_backdoor_the_data_cannot_take_is_refused(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match="robust") as error:
        Federation(tmp_path, ["robust.attack=backdoor", "robust.malicious_fraction=0.3", *overrides])
    assert message in str(error.value)


# ---------------------------------------------------------------------- attacker sampling
def test_per_round_sampling_gives_exactly_k_attackers_of_each_rounds_cohort():
    for round in range(1, 30):
        attackers = round_attackers(7, round, 40, 10, 3)
        assert len(set(attackers.tolist())) == 3 and set(attackers) <= set(sample_cohort(7, round, 40, 10))
    assert not np.array_equal(round_attackers(7, 1, 40, 10, 3), round_attackers(8, 1, 40, 10, 3))


def test_per_round_runs_have_k_attackers_every_round_fraction_runs_vary(tmp_path):
    common = ["data.num_clients=10", "train.clients_per_round=5", "robust.attack=sign_flip"]
    per_round = Federation(tmp_path / "per_round", [*common, "robust.attackers=per_round", "robust.attackers_per_round=2"]).run(5)
    assert [row["malicious_clients"] for row in per_round.rows] == [2.0] * 5
    for round, results in enumerate(per_round.results, start=1):
        flagged = sorted(cid for cid, metrics in results.client_metrics.items() if metrics.get("malicious"))
        assert flagged == round_attackers(per_round.config.seed, round, 10, 5, 2).tolist()
    fraction = Federation(tmp_path / "fraction", [*common, "robust.malicious_fraction=0.2"]).run(5)
    mask = malicious_clients(fraction.config.seed, 10, 0.2)
    expected = [float(mask[sample_cohort(fraction.config.seed, r, 10, 5)].sum()) for r in range(1, 6)]
    assert [row["malicious_clients"] for row in fraction.rows] == expected


def test_a_backdoor_without_attackers_trains_exactly_as_robust_off_and_reports_its_baseline(tmp_path):
    """``attack: backdoor`` with no attackers measures attack_success_rate (the trigger's rate on a
    clean model) and changes nothing else: the weights are bit-identical to a run without ``robust``,
    and the saved config keeps the section (a resumed run measures it too)."""
    off = Federation(tmp_path / "off", ["train.lr=0.1"]).run(2)
    clean = Federation(tmp_path / "clean", ["train.lr=0.1", "robust.attack=backdoor"]).run(2)
    assert torch.equal(off.state["weights"], clean.state["weights"])
    assert [row["test_accuracy"] for row in off.rows] == [row["test_accuracy"] for row in clean.rows]
    assert all(0.0 <= row["attack_success_rate"] <= 1.0 for row in clean.rows)
    assert "attack_success_rate" not in off.rows[-1] and "robust" not in off.config.to_dict()
    assert clean.config.to_dict()["robust"]["attack"] == "backdoor"
