"""benchmarks/fmnist_claims.py: each paper's claim read from paired differences by seed, by a rule that
depends on the numbers alone."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import fmnist_claims  # noqa: E402
import real_table  # noqa: E402

BASELINE = {"0": 0.870, "1": 0.860, "2": 0.880}


@pytest.mark.parametrize(
    ("method", "lower_is_better", "expected"),
    [
        ({"0": 0.880, "1": 0.871, "2": 0.889}, False, "**holds**"),  # +1.0, +1.1, +0.9 points
        ({"0": 0.860, "1": 0.849, "2": 0.871}, False, "**contradicted**"),
        ({"0": 0.880, "1": 0.850, "2": 0.890}, False, "not resolved; above on 2 of 3 seeds"),
        ({"0": 0.860, "1": 0.849, "2": 0.871}, True, "**holds**"),  # a spread: lower is the claimed side
        ({"0": 0.880, "1": 0.850, "2": 0.890}, True, "not resolved; below on 1 of 3 seeds"),
    ],
)
def test_the_reading_follows_from_the_paired_interval_and_the_claimed_side(method, lower_is_better, expected):
    assert fmnist_claims.reading(method, BASELINE, lower_is_better) == expected


def test_only_the_seeds_both_trained_count():
    one_seed = {"0": 0.99}
    assert fmnist_claims.reading(one_seed, BASELINE, False) == "not resolved; above on 1 of 1 seed"
    assert fmnist_claims.reading({"7": 0.99}, BASELINE, False) == "no seed in common"
    rows = [{"seed": "0", "final": "0.9", "diverged": ""}, {"seed": "1", "final": "", "diverged": "True"}]
    assert fmnist_claims.seed_values(rows, "final") == {"0": 0.9}


def test_every_claim_names_algorithms_of_its_group_and_a_value_the_table_has():
    for claim in fmnist_claims.CLAIMS:
        group = real_table.GROUPS[claim.group]
        assert set(claim.methods + claim.baselines) <= set(real_table.table_algorithms(group)), claim
        assert claim.key in (None, *(f"{also}_final" for also in group["also"])), claim
