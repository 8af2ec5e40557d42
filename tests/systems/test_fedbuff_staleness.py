"""``systems.fedbuff.max_staleness``: an update that arrives more than τ_max versions old is discarded
(counted in the round's ``late``) and does not fill the buffer; a bound that never binds changes
nothing. Ray-free: real engines in this process (fedray.testing.Federation)."""

from __future__ import annotations

import pytest

from preloaded_cli import run_fedray_preloaded
from test_bad_inputs import assert_rejected
from test_fedbuff import STALE, run_async

from fedray.testing import Federation

ROUNDS = 6


@pytest.mark.slow
def test_updates_older_than_the_bound_are_discarded_and_counted_late(tmp_path):
    bounded = run_async(Federation(tmp_path / "bounded", [*STALE, "systems.fedbuff.max_staleness=0"]), ROUNDS)
    unbounded = run_async(Federation(tmp_path / "unbounded", STALE), ROUNDS)
    assert max(result["round"]["staleness_max"] for result in unbounded) >= 1  # without the bound, stale updates are aggregated
    assert sum(result["round"]["late"] for result in unbounded) == 0
    for result in bounded:
        row, clients = result["round"], result["clients"]
        assert [client["staleness"] for client in clients] == [0] * len(clients)  # only fresh updates are aggregated
        assert row["aggregated"] == len(clients) == 2  # the buffer still fills: a discarded update does not count
    assert sum(result["round"]["late"] for result in bounded) >= 1
    first_late = next(i for i, result in enumerate(bounded) if result["round"]["late"] > 0)
    assert bounded[:first_late] == unbounded[:first_late]  # the same run until the first discarded update


def test_a_bound_that_never_binds_changes_nothing(tmp_path):
    loose = run_async(Federation(tmp_path / "loose", [*STALE, f"systems.fedbuff.max_staleness={ROUNDS}"]), ROUNDS)
    assert loose == run_async(Federation(tmp_path / "unset", STALE), ROUNDS)


def test_a_negative_bound_is_one_line_and_exit_2(tmp_path):
    overrides = ["resources.num_workers=1", "systems.enabled=true", "train.mode=async", "systems.fedbuff.max_staleness=-1"]
    result = run_fedray_preloaded(["run", *[arg for override in overrides for arg in ("--set", override)]], tmp_path)
    assert_rejected(result, "systems.fedbuff.max_staleness")
