"""A config with several incompatible settings is refused once, with every problem listed (one line
each, exit code 2, before Ray starts), not one problem per attempt: the algorithm's checks
(check_requirements: its requirements, what privacy/robust cannot handle of its uploads, what
compression and train.mode=async need of them) and the privacy/robust checks of the config schema
each collect all their problems. The real ``fedray run`` (a fork of a preloaded process)."""

from __future__ import annotations

import subprocess

import pytest

from fedray.config import ConfigError
from fedray.plugins import load_config
from preloaded_cli import run_fedray_preloaded

SMALL = ["data.num_clients=10", "train.clients_per_round=2", "train.rounds=1", "resources.backend=local"]


def refused(args: list[str], tmp_path) -> list[str]:
    """The problem lines of a ``fedray run`` that must be refused with exit code 2 and nothing written."""
    result: subprocess.CompletedProcess = run_fedray_preloaded(
        ["run", *[part for key in [*SMALL, f"output.dir={tmp_path / 'out'}", *args] for part in ("--set", key)]], tmp_path
    )
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    assert "Traceback" not in result.stderr + result.stdout
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines[0] == "fedray: invalid config:", lines
    assert not (tmp_path / "out").exists()
    return [line.strip() for line in lines[1:]]


def test_an_algorithm_with_four_problems_is_refused_once_naming_all_four(tmp_path):
    """FedCoSR without per-client test splits, under local DP without the bounds of its two class-
    representation tensors, and under FedBuff: before, four attempts, each refused for the next problem."""
    lines = refused(
        [
            "algorithm.name=fedcosr",
            "model.name=mlp",
            "systems.enabled=true",
            "train.mode=async",
            "systems.fedbuff.buffer_size=2",
            "privacy.mechanism=local",
            "privacy.noise_multiplier=1.0",
        ],
        tmp_path,
    )
    assert len(lines) == 4, lines
    assert lines[0].startswith("data.client_test_fraction / eval.personalized: fedcosr needs per-client test splits")
    assert lines[1].startswith("privacy.clip_prototypes: fedcosr uploads class representations ('centroid_sums')")
    assert lines[2].startswith("privacy.clip_counts: fedcosr uploads class representations ('centroid_counts')")
    assert lines[3].startswith("train.mode: async combines updates trained from different model versions")


def test_uploads_that_privacy_and_robust_cannot_handle_are_listed_together(tmp_path):
    """FedSC with local DP but no bound for its prototypes, and a robust rule (which cannot stand in for
    FedSC's own combination of its clients' prototypes)."""
    lines = refused(
        [
            "algorithm.name=fedsc",
            "model.name=mlp",
            "privacy.mechanism=local",
            "privacy.noise_multiplier=1.0",
            "robust.rule=median",
            "train.clients_per_round=5",
        ],
        tmp_path,
    )
    assert lines == [
        "robust.rule: fedsc uploads prototypes, which its server combines client by client by its own rule, which robust.rule=median "
        "cannot stand in for; use an algorithm whose uploads are summed, such as fedavg or fedproto",
        "privacy.clip_prototypes: fedsc uploads prototypes ('prototypes'); give the L2 bound each client's is clipped to",
    ]


def test_the_privacy_and_robust_settings_of_the_config_are_refused_together(tmp_path):
    """Central DP with a robust rule (which needs each client's update), Krum with too small a cohort
    and a δ above 1/population: three problems of the config's sections, one message."""
    lines = refused(
        ["privacy.mechanism=central", "privacy.noise_multiplier=1.0", "privacy.delta=0.5", "robust.rule=krum"],
        tmp_path,
    )
    assert len(lines) == 3, lines
    assert lines[0].startswith("privacy.delta (0.5) is >= 1/population (1/10)")
    assert lines[1].startswith("robust.rule=krum needs each client's update, and privacy.mechanism=central noises only their sum")
    assert lines[2] == "robust.rule=krum with robust.krum_f=1 needs train.clients_per_round >= 2f + 3 = 5 (got 2)"


def test_a_trimmed_mean_that_would_trim_nothing_is_refused():
    """⌊β·m⌋ = 0 would make the trimmed mean the plain mean of the updates: refused, naming both keys."""
    with pytest.raises(ConfigError, match=r"cuts ⌊β·m⌋ = ⌊0.1·5⌋ = 0 updates at each end") as error:
        load_config(None, [*SMALL, "train.clients_per_round=5", "robust.rule=trimmed_mean", "robust.trim_fraction=0.1"])
    assert "raise robust.trim_fraction to at least 1/m = 0.2" in str(error.value)
    config = load_config(None, [*SMALL, "train.clients_per_round=5", "robust.rule=trimmed_mean", "robust.trim_fraction=0.2"])
    assert config.robust.trim_fraction == 0.2
    load_config(None, [*SMALL, "train.clients_per_round=5", "robust.rule=trimmed_mean", "robust.trim_fraction=0"])  # asked for: the mean


def test_async_with_privacy_and_a_robust_rule_is_one_message_naming_each_problem(tmp_path):
    """train.mode's problems and privacy/robust's come from the schema's one check across sections."""
    lines = refused(
        [
            "train.mode=async",
            "systems.enabled=true",
            "systems.selection.deadline_seconds=10",
            "privacy.mechanism=central",
            "privacy.noise_multiplier=1.0",
            "privacy.population_size=1000",
            "robust.rule=median",
        ],
        tmp_path,
    )
    assert any("close synchronous rounds, which train.mode=async has none of" in line for line in lines), lines
    assert any("privacy.population_size sets the sampling probability q = M/N" in line for line in lines), lines
    assert any("robust.rule=median needs each client's update" in line for line in lines), lines
