"""FedSC, FedSKC, FedProto and MOON end to end through ``run_experiment`` (tiny digits runs; two
workers on the local backend, bit-identical to two Ray workers: tests/runtime/test_backends.py), and
MOON's previous-local-model state surviving a driver crash and a resume."""

from __future__ import annotations

import math

import pytest
import torch

from fedray import load_config
from fedray.runtime import list_checkpoints, resume_experiment, run_experiment
from fedray.tracking import read_metrics

from e2e_helpers import CrashAfterRound, final_weights

pytestmark = pytest.mark.slow


def tiny_config(out_dir, *overrides: str):
    return load_config(
        None,
        [
            f"output.dir={out_dir}",
            "output.name=run",
            "output.tensorboard=false",
            "output.plots=false",
            "data.num_clients=6",
            "train.clients_per_round=3",
            "train.rounds=3",
            "train.local_epochs=2",
            "checkpoint.every=2",
            "resources.backend=local",
            *overrides,
        ],
    )


def later_client_rows(run_dir, term: str) -> list[float]:
    """The values of a client loss term after round 1 (round 1 has no prototypes / previous model)."""
    return [row[term] for row in read_metrics(run_dir, "client") if row["round"] > 1 and row.get(term) is not None]


@pytest.mark.parametrize(
    "overrides, round_metric, client_terms",
    [
        (["algorithm.name=fedsc"], "relational_prototypes", ["rpcl", "cpdr"]),
        (["algorithm.name=fedskc"], "variance_ratio", ["lcl"]),
        (["algorithm.name=fedproto", "algorithm.inference=nearest_prototype"], "prototype_classes", ["prototype_loss"]),
        (["algorithm.name=moon", "model.projection_dim=16"], None, ["contrastive"]),
    ],
    ids=["fedsc", "fedskc", "fedproto", "moon"],
)
def test_algorithm_trains_end_to_end(tmp_path, overrides, round_metric, client_terms):
    summary = run_experiment(tiny_config(tmp_path, *overrides), progress=False)
    rows = read_metrics(tmp_path / "run", "round")
    assert [r["round"] for r in rows] == [1, 2, 3]
    assert summary.final_test_accuracy > 0.25  # chance is 0.1
    if round_metric is not None:
        assert all(math.isfinite(r[round_metric]) for r in rows[1:]), rows
    for term in client_terms:
        values = later_client_rows(tmp_path / "run", term)
        assert values and all(math.isfinite(v) for v in values)
        assert any(v > 0 for v in values), (term, values)  # the term was active on the workers


def test_moon_resume_restores_the_previous_local_models(tmp_path):
    moon = [
        "algorithm.name=moon",
        "model.projection_dim=16",
        "data.num_clients=4",
        "train.clients_per_round=2",
        "train.rounds=4",
        "train.local_epochs=1",
        "resources.num_workers=1",
    ]
    run_experiment(tiny_config(tmp_path / "straight", *moon), progress=False)

    crashed = tiny_config(tmp_path / "crashed", *moon)
    with pytest.raises(RuntimeError, match="simulated"):
        run_experiment(crashed, progress=False, extra_callbacks=[CrashAfterRound(3)])
    assert [r for r, _ in list_checkpoints(tmp_path / "crashed" / "run")] == [2]
    assert any((tmp_path / "crashed" / "run" / "client_state").rglob("*.pt"))  # the state lives in the run directory
    resume_experiment(tmp_path / "crashed" / "run", progress=False)

    assert torch.equal(final_weights(tmp_path / "crashed" / "run"), final_weights(tmp_path / "straight" / "run"))
    assert later_client_rows(tmp_path / "crashed" / "run", "contrastive") == later_client_rows(tmp_path / "straight" / "run", "contrastive")
    # round 3, the first after the resume, has client 1 back (cohorts [0, 1], [0, 2], [1, 3], [0, 1]):
    # its previous model from round 1 was read from the run directory by a fresh worker
    resumed_round_3 = {r["client_id"]: r["contrastive"] for r in read_metrics(tmp_path / "crashed" / "run", "client") if r["round"] == 3}
    assert resumed_round_3[1] > 0 and resumed_round_3[3] == 0
