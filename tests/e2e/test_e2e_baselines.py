"""The seed papers' global-model baselines end to end through ``run_experiment`` (tiny digits runs;
two workers on the local backend, the crash-and-resume tests with one worker, also on the local
backend: the resume is the engine's, bit-identical on Ray's workers): each learns, reports finite
metrics and keeps its own server / client state; the server optimizers' moments and SCAFFOLD's
control variates survive a crash and resume."""

from __future__ import annotations

import math

import pytest
import torch

from fedray import load_config
from fedray.runtime import list_checkpoints, load_checkpoint, resume_experiment, run_experiment
from fedray.tracking import read_metrics
from fedray.runtime.state_store import decode_state

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
            "checkpoint.every=3",
            *overrides,
        ],
    )


def final_server_state(run_dir) -> dict:
    return load_checkpoint(list_checkpoints(run_dir)[-1][1])["server_state"]


@pytest.mark.parametrize(
    "overrides, server_keys, client_terms",
    [
        (["algorithm.name=fedavgm", "algorithm.server_momentum=0.4"], ["server_m"], []),
        (["algorithm.name=fedprox", "algorithm.server_optimizer=yogi"], ["server_m", "server_v"], ["proximal"]),
        (["algorithm.name=scaffold"], ["control"], ["ce"]),
        (["algorithm.name=fedlc", "algorithm.server_optimizer=avgm", "algorithm.server_momentum=0.4"], ["server_m"], []),
        (["algorithm.name=fedntd"], [], ["ntd"]),
        (["algorithm.name=feddecorr"], [], ["decorrelation"]),
        (["algorithm.name=feddyn", "algorithm.dyn_alpha=0.1"], ["lambda_sum"], ["proximal"]),
        (["algorithm.name=fedproc", "train.rounds=3"], ["prototypes"], ["contrastive"]),
    ],
    ids=["fedavgm", "fedprox+yogi", "scaffold", "fedavgm+fedlc", "fedntd", "feddecorr", "feddyn", "fedproc"],
)
def test_baseline_trains_end_to_end(tmp_path, overrides, server_keys, client_terms):
    # Two workers in this process (the local backend: bit-identical to two Ray workers, which
    # tests/runtime/test_backends.py checks).
    summary = run_experiment(tiny_config(tmp_path, *overrides, "resources.backend=local"), progress=False)
    rows = read_metrics(tmp_path / "run", "round")
    assert [r["round"] for r in rows] == [1, 2, 3]
    assert all(math.isfinite(r["train_loss"]) and math.isfinite(r["test_loss"]) for r in rows)
    assert summary.final_test_accuracy > 0.25  # chance is 0.1
    state = final_server_state(tmp_path / "run")
    for key in server_keys:
        assert torch.isfinite(state[key]).all() and bool((state[key] != 0).any()), key
    if "control" in server_keys:  # SCAFFOLD: every trained client stored a non-zero c_i
        stored = [decode_state(path.read_bytes(), str(path))["control"] for path in (tmp_path / "run" / "client_state").rglob("r*.pt")]
        assert stored and all(bool((c != 0).any()) for c in stored)
    clients = read_metrics(tmp_path / "run", "client")
    for term in client_terms:
        values = [row[term] for row in clients if row.get(term) is not None]
        assert values and all(math.isfinite(v) for v in values) and any(v > 0 for v in values), term


@pytest.mark.parametrize(
    "overrides",
    [["algorithm.name=fedadam", "algorithm.server_lr=0.01"], ["algorithm.name=scaffold"]],
    ids=["fedadam", "scaffold"],
)
def test_resume_continues_the_server_and_client_state(tmp_path, overrides):
    common = [
        *overrides,
        "data.num_clients=4",
        "train.clients_per_round=2",
        "train.rounds=4",
        "train.local_epochs=1",
        "resources.num_workers=1",
        "checkpoint.every=2",
    ]
    run_experiment(tiny_config(tmp_path / "straight", *common), progress=False)
    with pytest.raises(RuntimeError, match="simulated"):
        run_experiment(tiny_config(tmp_path / "crashed", *common), progress=False, extra_callbacks=[CrashAfterRound(3)])
    assert [r for r, _ in list_checkpoints(tmp_path / "crashed" / "run")] == [2]
    resume_experiment(tmp_path / "crashed" / "run", progress=False)
    straight, resumed = final_server_state(tmp_path / "straight" / "run"), final_server_state(tmp_path / "crashed" / "run")
    assert set(straight) == set(resumed)
    for key in straight:
        assert torch.equal(straight[key], resumed[key]), key
    assert torch.equal(final_weights(tmp_path / "crashed" / "run"), final_weights(tmp_path / "straight" / "run"))
