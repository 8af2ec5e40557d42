"""privacy.audit (fedray/privacy/audit.py): Steinke, Nasr and Jagielski's one-run audit. The bound
against values computed by hand, the seeded canaries, and real ``fedray run`` processes (local
backend, digits, mlp): with noise the bound stays below the accountant's ε, without noise it is far
above any useful target; an audit without central DP is refused before the run starts."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from test_bad_inputs import run_fedray

from fedray.privacy.audit import directions, epsilon_lower_bound, guesses_and_correct, membership, p_value


def test_all_correct_guesses_without_delta_match_the_closed_form_and_grow_with_the_guesses():
    # v = r, δ = 0: p = q^r with q = 1/(1 + e^−ε), so p = 0.05 at ε = −ln(0.05^(−1/r) − 1)
    bounds = []
    for r in (10, 100, 1000):
        expected = -math.log(0.05 ** (-1 / r) - 1)
        bound = epsilon_lower_bound(2 * r, r, r, 0.0)
        assert bound == pytest.approx(expected, abs=1e-4)
        bounds.append(bound)
    assert bounds[0] < bounds[1] < bounds[2]
    assert bounds[2] > 5


def test_guessing_no_better_than_chance_gives_zero():
    assert epsilon_lower_bound(1000, 200, 100, 1e-5) == 0.0
    assert epsilon_lower_bound(1000, 200, 90, 1e-5) == 0.0
    assert epsilon_lower_bound(1000, 200, 0, 0.0) == 0.0


def test_the_bound_grows_with_the_correct_guesses_and_shrinks_with_delta():
    bounds = [epsilon_lower_bound(1000, 200, v, 1e-5) for v in range(100, 201, 10)]
    assert all(a <= b for a, b in zip(bounds, bounds[1:])) and bounds[0] == 0 and bounds[-1] > 3
    assert epsilon_lower_bound(1000, 200, 190, 1e-3) < epsilon_lower_bound(1000, 200, 190, 1e-6) < epsilon_lower_bound(1000, 200, 190, 0)


def test_p_value_is_the_binomial_tail_plus_the_delta_term():
    q = 1 / (1 + math.exp(-1.0))
    tail = sum(math.comb(20, j) * q**j * (1 - q) ** (20 - j) for j in range(15, 21))
    assert p_value(40, 20, 15, 1.0, 0.0) == pytest.approx(tail, rel=1e-9)
    pmf = [math.comb(20, j) * q**j * (1 - q) ** (20 - j) for j in range(21)]
    alpha = max(sum(pmf[15 - i : 15]) / i for i in range(1, 16))
    assert p_value(40, 20, 15, 1.0, 1e-4) == pytest.approx(tail + 2 * 40 * 1e-4 * alpha, rel=1e-9)


def test_canaries_are_seeded_and_half_are_in():
    included = membership(3, 20_000)
    assert abs(included.mean() - 0.5) < 0.015
    assert np.array_equal(included, membership(3, 20_000)) and not np.array_equal(included, membership(4, 20_000))
    units = directions(3, 50, 300)
    assert torch.allclose(units.norm(dim=1), torch.ones(50), atol=1e-5)
    assert torch.equal(units, directions(3, 50, 300)) and not torch.equal(units, directions(4, 50, 300))


def test_guesses_take_the_highest_scores_in_and_the_lowest_out():
    included = np.array([True, False, True, False, True, False])
    scores = np.array([5.0, -1.0, 4.0, 3.0, -2.0, 0.0])  # in: 5, 4, −2; out: −1, 3, 0
    assert guesses_and_correct(scores, included, 1) == (2, 1)  # 5 guessed in (right), −2 guessed out (wrong)
    assert guesses_and_correct(scores, included, 2) == (4, 3)  # 5, 4 in (right); −2 (wrong), −1 out (right)


AUDIT_RUN = [
    "resources.backend=local",
    "resources.num_workers=1",
    "data.name=digits",
    "data.num_clients=4",
    "train.clients_per_round=4",
    "train.local_epochs=1",
    "model.name=mlp",
    "model.width=64",
    "privacy.mechanism=central",
    "privacy.clip=0.5",
    "privacy.delta=1e-5",
    "privacy.audit.canaries=2000",
    "privacy.audit.guesses=500",
]


def audited_run(directory: Path, overrides: list[str]) -> dict:
    args = ["run"]
    for override in [*AUDIT_RUN, f"output.dir={directory / 'runs'}", *overrides]:
        args += ["--set", override]
    result = run_fedray(args, directory)
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = (directory / "runs").iterdir()
    return json.loads((run_dir / "summary.json").read_text())["final_metrics"]


@pytest.mark.slow
def test_with_noise_the_bound_stays_below_the_accountants_epsilon(tmp_path):
    row = audited_run(tmp_path, ["train.rounds=3", "privacy.noise_multiplier=1.0"])
    assert row["audit_guesses"] == 1000 and row["audit_canaries"] == 2000
    assert row["audit_correct_guesses"] > 500  # the canaries are seen through the noise...
    assert row["audit_epsilon_lower_bound"] < row["dp_epsilon"]  # ...but no more than the accountant allows


@pytest.mark.slow
def test_without_noise_the_bound_is_far_above_any_target(tmp_path):
    row = audited_run(tmp_path, ["train.rounds=2", "privacy.noise_multiplier=0"])
    assert math.isinf(row["dp_epsilon"])
    assert row["audit_correct_guesses"] >= 995
    assert row["audit_epsilon_lower_bound"] > 5


def test_an_audit_without_central_dp_is_refused_before_the_run(tmp_path):
    args = ["run", "--set", "resources.backend=local", "--set", f"output.dir={tmp_path / 'runs'}"]
    for override in ("privacy.mechanism=local", "privacy.noise_multiplier=1.0", "privacy.audit.canaries=100"):
        args += ["--set", override]
    result = run_fedray(args, tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "privacy.audit needs privacy.mechanism=central" in result.stderr + result.stdout
    assert "Traceback" not in result.stderr and not (tmp_path / "runs").exists()
