"""The health warnings (Ray-free): a collapse of the evaluated accuracy is told once, when it happens;
a client whose training loss blows up is named in the round it does; they reach stderr without a
progress bar (``--quiet``, Tune trials) and are written above the bar when there is one."""

from __future__ import annotations

import math

from types import SimpleNamespace

from fedray import load_config
from fedray.tracking import RunContext
import pytest

from fedray.tracking.health import HealthMonitor, loss_outliers
from fedray.tracking.progress import ProgressBar


def monitored(with_bar: bool) -> list:
    """The health monitor, after a progress bar or alone (``--quiet``, a Tune trial)."""
    return [ProgressBar(), HealthMonitor()] if with_bar else [HealthMonitor()]


@pytest.mark.parametrize("with_bar", [True, False])
def test_a_collapse_of_the_accuracy_is_warned_once_with_what_to_do(tmp_path, capsys, with_bar):
    run = RunContext(
        config=load_config(None, ["train.rounds=5", "train.lr=0.2"]),
        run_dir=tmp_path,
        data=SimpleNamespace(info=SimpleNamespace(num_classes=10)),
        server=None,
        start_round=0,
    )
    callbacks = monitored(with_bar)
    for callback in callbacks:
        callback.on_run_start(run)
    accuracies = {1: 0.80, 2: 0.91, 3: 0.0887, 4: 0.09, 5: 0.85}
    for round, accuracy in accuracies.items():
        for callback in callbacks:
            callback.on_round_end(
                run, {"round": round, "train_loss": 0.5, "seconds": 1.0, "excluded_updates": 0, "test_accuracy": accuracy}, []
            )
    for callback in callbacks:
        callback.on_run_end(run)

    warnings = [line for line in "".join(capsys.readouterr()).splitlines() if line.startswith("warning")]
    assert warnings == [
        "warning: round 3: test_accuracy fell to 0.0887 from 0.9100 (round 2): training collapsed; "
        "a lower train.lr (now 0.2) or a train.grad_clip may keep it stable"
    ]  # not again in round 4, still collapsed; round 5 recovered (0.85 > 0.455)


def client_rows(losses: dict[int, float], key: str = "ce") -> list[dict]:
    return [{"client_id": client, "train_loss": -3.0, key: loss} for client, loss in losses.items()]


@pytest.mark.parametrize("with_bar", [True, False])
def test_a_client_whose_loss_blows_up_is_named_in_a_warning(tmp_path, capsys, with_bar):
    # SCAFFOLD's client 67 (Fashion-MNIST, Dirichlet 0.1, lr 0.05): its cross-entropy beside the cohort's
    data = SimpleNamespace(info=SimpleNamespace(num_classes=10))
    run = RunContext(config=load_config(None, ["train.rounds=3", "train.lr=0.05"]), run_dir=tmp_path, data=data, server=None, start_round=0)
    cohort = {3: 0.15, 11: 0.26, 32: 0.40, 44: 0.62, 70: 1.9}
    callbacks = monitored(with_bar)
    for callback in callbacks:
        callback.on_run_start(run)
    for round, worst in [(1, 4.6), (2, 45.9), (3, 2709.0)]:
        for callback in callbacks:
            callback.on_round_end(
                run,
                {"round": round, "train_loss": -3.0, "seconds": 1.0, "excluded_updates": 0},
                client_rows({**cohort, 67: worst, 8: float("nan")}),
            )
    for callback in callbacks:
        callback.on_run_end(run)

    warnings = [line for line in "".join(capsys.readouterr()).splitlines() if line.startswith("warning")]
    assert warnings == [  # round 1: 4.6 is 11× the median but below 3 ln 10 = 6.9: a hard client, not a blow-up
        f"warning: round {round}: training ce far above the median client's 0.51: client 67 ({loss}). A client "
        "update that blows up but stays finite is aggregated and can derail the model; a lower train.lr (now 0.05) "
        "or a train.grad_clip may keep it stable"
        for round, loss in [(2, "45.9"), (3, "2.71e+03")]
    ]


def test_loss_outliers_read_train_loss_without_ce_and_need_a_cohort():
    key, median, outliers = loss_outliers(client_rows({1: 0.2, 2: 0.3, 3: 9.0}, key="train_loss"), math.log(10))
    assert (key, median, outliers) == ("train_loss", 0.3, [(3, 9.0)])
    assert loss_outliers(client_rows({1: 0.2, 2: 90.0}), math.log(10))[2] == []  # two clients: no median to stand out from
    assert loss_outliers(client_rows({1: 0.0, 2: 0.0, 3: 0.0}), math.log(10))[2] == []


def test_every_run_monitors_its_health_with_or_without_a_bar():
    from fedray.runtime.experiment import default_callbacks

    config = load_config(None, [])
    for progress in (True, False):
        assert sum(isinstance(callback, HealthMonitor) for callback in default_callbacks(config, progress)) == 1


def test_a_collapse_with_differential_privacy_on_names_the_noise_multiplier(tmp_path, capsys):
    """The noise of DP, not only the learning rate, collapses training: the warning says so and what lowers it."""
    config = load_config(None, ["train.lr=0.2", "privacy.mechanism=central", "privacy.clip=0.5", "privacy.noise_multiplier=2.5"])
    run = RunContext(
        config=config, run_dir=tmp_path, data=SimpleNamespace(info=SimpleNamespace(num_classes=10)), server=None, start_round=0
    )
    monitor = HealthMonitor()
    for round, accuracy in {1: 0.6, 2: 0.2}.items():
        row = {"round": round, "seconds": 1.0, "excluded_updates": 0, "test_accuracy": accuracy, "dp_noise_multiplier": 2.5}
        monitor.on_round_end(run, row, [])
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning")]
    assert warnings == [
        "warning: round 2: test_accuracy fell to 0.2000 from 0.6000 (round 1): training collapsed; differential privacy is on "
        "(central): its noise (noise multiplier z = 2.5) may be the cause; a smaller privacy.noise_multiplier (or, when z is "
        f"calibrated, a larger privacy.target_epsilon) or more clients per round (train.clients_per_round, now {config.train.clients_per_round}) "
        "lowers it relative to the update; else a lower train.lr (now 0.2) or a train.grad_clip may keep it stable"
    ]


@pytest.mark.parametrize(("aggregated", "warned"), [([0, 0, 0], True), ([0, 2, 0], False)])
def test_a_run_that_aggregated_no_client_in_any_round_is_warned_at_its_end(tmp_path, capsys, aggregated, warned):
    run = RunContext(
        config=load_config(None, ["systems.enabled=true"]),
        run_dir=tmp_path,
        data=SimpleNamespace(info=SimpleNamespace(num_classes=10)),
        server=None,
        start_round=0,
    )
    monitor = HealthMonitor()
    for round, count in enumerate(aggregated, start=1):
        row = {"round": round, "seconds": 1.0, "excluded_updates": 0, "selected": count, "aggregated": count, "dropped": 0, "late": 0}
        run.history.append(row)  # as the driver does, before the callbacks
        monitor.on_round_end(run, dict(row), [])
    monitor.on_run_end(run)
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning")]
    expected = (
        "warning: no client update was aggregated in any of the 3 rounds (nobody was online, or every selected client dropped out "
        "or was late): the model is the initial one; see systems.availability and systems.selection"
    )
    assert warnings == ([expected] if warned else [])
