"""``systems.fedbuff.max_staleness``: an update that arrives more than τ_max versions old is discarded
(counted in the round's ``late``) and does not fill the buffer; a bound that never binds changes
nothing. ``systems.fedbuff.mixing: model`` (FedAsync): a stale update is mixed into the current model
instead of applied as a change from its start. Ray-free: real engines in this process
(fedray.testing.Federation)."""

from __future__ import annotations

import pytest
import torch

from preloaded_cli import run_fedray_preloaded
from test_bad_inputs import assert_rejected
from test_fedbuff import STALE, _results, run_async

from fedray.systems.fedbuff import buffered_results
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


def test_model_mixing_is_fedasyncs_update():
    """w + s(τ)·n(w_k − w)/n: with one update a buffer, FedAsync's w ← (1 − α_t) w + α_t w_k at
    α_t = s(τ) (times the server learning rate α in the algorithm's step); the change from the
    stale start it trained from (FedBuff's delta) is not used."""
    g = torch.Generator().manual_seed(0)
    current, old = torch.randn(50, generator=g), torch.randn(50, generator=g)
    client = old + 0.1 * torch.randn(50, generator=g)
    stale = _results([client], [4])
    mixed = buffered_results([(stale, 0.5, old)], current, "model")
    mean = mixed.sums["weights"] / mixed.sums["num_samples"]
    assert torch.allclose(mean, 0.5 * current.double() + 0.5 * client.double(), rtol=0, atol=1e-12)
    delta = buffered_results([(stale, 0.5, old)], current)
    assert torch.allclose(delta.sums["weights"] / delta.sums["num_samples"], current.double() + 0.5 * (client - old).double(), atol=1e-12)
    fresh = _results([current + 0.1], [4])  # from the current model, both rules are the same sums
    assert torch.equal(buffered_results([(fresh, 1.0, current)], current, "model").sums["weights"], fresh.sums["weights"])


@pytest.mark.slow
def test_model_mixing_changes_a_run_from_its_first_stale_update_only(tmp_path):
    """The same schedule (the clock does not depend on the weights); the same rounds until the first
    stale update, which the two rules apply differently."""
    mixed = run_async(Federation(tmp_path / "mixed", [*STALE, "systems.fedbuff.mixing=model"]), ROUNDS)
    delta = run_async(Federation(tmp_path / "delta", STALE), ROUNDS)
    first_stale = next(i for i, result in enumerate(delta) if result["round"]["staleness_max"] > 0)
    assert mixed[:first_stale] == delta[:first_stale]  # fresh updates: the same rounds, bit for bit
    assert mixed[first_stale]["round"]["test_loss"] != delta[first_stale]["round"]["test_loss"]
    schedule = [[(client["client_id"], client["staleness"]) for client in result["clients"]] for result in mixed]
    assert schedule == [[(client["client_id"], client["staleness"]) for client in result["clients"]] for result in delta]


def test_an_unknown_mixing_is_one_line_and_exit_2(tmp_path):
    overrides = ["resources.num_workers=1", "systems.enabled=true", "train.mode=async", "systems.fedbuff.mixing=average"]
    result = run_fedray_preloaded(["run", *[arg for override in overrides for arg in ("--set", override)]], tmp_path)
    assert_rejected(result, "systems.fedbuff.mixing")
