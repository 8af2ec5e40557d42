"""End-to-end runs of the personalised, FedBN and self-supervised baselines (Ditto, FedRep, LG-FedAvg,
FedBN, FedEMA, FedU) with two workers on the local backend (in this process, bit-identical to two Ray
workers: tests/runtime/test_backends.py): each learns, reports finite metrics, and keeps its personal
part (BN layers, heads, bodies, personal models, BYOL targets) out of the server state and in the
client state store; FedBN resumes to the same metrics as an uninterrupted run. A personalised run's
resume and worker replacement on Ray are tests/e2e/test_e2e_personalized.py's."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from fedray.algorithms import get_algorithm_class
from fedray.algorithms.ssl import ONLINE_PREFIXES, TARGET_PREFIXES
from fedray import load_config
from fedray.data import build_federated_dataset
from fedray.models import num_flat_weights
from fedray.runtime import list_checkpoints, load_checkpoint, resume_experiment, run_experiment
from fedray.tracking import read_metrics
from fedray.runtime.state_store import decode_state

from e2e_helpers import CrashAfterRound, comparable_rows

pytestmark = pytest.mark.slow

SMALL = [
    "data.num_clients=4",
    "data.partition=shards",
    "data.classes_per_client=3",
    "data.client_test_fraction=0.25",
    "eval.personalized=true",
    "train.clients_per_round=4",
    "train.rounds=2",
    "train.local_epochs=1",
    "checkpoint.every=1",
    "output.tensorboard=false",
    "output.plots=false",
    "output.name=run",
    "resources.num_workers=2",
    "resources.backend=local",
]
SSL = [
    "algorithm.projection_dim=32",
    "algorithm.hidden_dim=64",
    "algorithm.probe_epochs=100",
    "algorithm.probe_lr=0.01",
    "train.momentum=0.9",
    "eval.every=2",
]
CASES = {
    "ditto": ["algorithm.mu=0.1"],
    "fedrep": ["algorithm.head_epochs=2"],
    "lg_fedavg": [],
    "fedbn": ["model.name=resnet8", "model.norm=batch"],
    "fedema": SSL,
    "fedu": SSL,
}


def config_for(out: Path, algorithm: str, extra: list[str] = ()):
    return load_config(None, SMALL + CASES[algorithm] + [f"algorithm.name={algorithm}", f"output.dir={out}", *extra])


def client_states(run_dir: Path) -> dict[int, dict[str, torch.Tensor]]:
    """Each client's newest stored state."""
    states = {}
    for directory in sorted((run_dir / "client_state").iterdir()):
        newest = sorted(directory.glob("r*.pt"))[-1]
        states[int(directory.name)] = decode_state(newest.read_bytes(), str(newest))
    return states


@pytest.fixture(scope="module")
def completed_run(tmp_path_factory):
    """``completed_run(name)``: the config and run directory of one uninterrupted run per algorithm
    (run on first use, shared by the tests of this module)."""
    runs: dict[str, tuple] = {}

    def get(algorithm: str):
        if algorithm not in runs:
            config = config_for(tmp_path_factory.mktemp(algorithm), algorithm)
            assert run_experiment(config, progress=False).rounds == 2
            runs[algorithm] = (config, Path(config.output.dir) / "run")
        return runs[algorithm]

    return get


@pytest.mark.parametrize("algorithm", list(CASES))
def test_baseline_runs_learns_and_keeps_personal_parts_local(completed_run, algorithm):
    config, run_dir = completed_run(algorithm)
    rows = read_metrics(run_dir)
    for row in rows:
        assert all(math.isfinite(v) for v in row.values() if isinstance(v, float)), row
    server_state = load_checkpoint(list_checkpoints(run_dir)[-1][1])["server_state"]
    states = client_states(run_dir)
    assert states  # every algorithm here keeps per-client state
    info = build_federated_dataset(config.data, config.seed).info
    algorithm_object = get_algorithm_class(algorithm)(config, info)
    model = algorithm_object.build_model("global")

    if algorithm in ("fedema", "fedu"):
        last = rows[-1]
        assert last["probe_accuracy"] == last["test_accuracy"] > 0.4  # chance is 0.1
        assert set(server_state) == {"weights"}
        assert server_state["weights"].numel() == num_flat_weights(model, ONLINE_PREFIXES)  # no target
        for state in states.values():
            assert state["target"].numel() == num_flat_weights(model, TARGET_PREFIXES)
            assert float(state["divergence"]) > 0
        return

    last = rows[-1]
    assert last["personal_accuracy"] > 0.4, last  # 3-class clients: chance for a personal model is ~1/3
    split = algorithm_object.split
    assert server_state["weights"].numel() == split.num_shared
    if algorithm == "ditto":
        assert split.num_personal == 0 and set(server_state) == {"weights", "initial_personal", "initial_model"}
        assert all(s["personal_model"].numel() == server_state["initial_model"].numel() for s in states.values())
        assert last["personal_accuracy"] > last["test_accuracy"]  # v_k beats the global FedAvg model on 3-class clients
        return
    assert split.num_personal > 0
    assert set(server_state) == {"weights", "initial_personal"}
    for state in states.values():
        assert state["personal"].numel() == split.num_personal  # what never reached the server
    if algorithm == "fedbn":
        assert all(k.rpartition(".")[2] in ("weight", "bias", "running_mean", "running_var") for k in split.personal_keys)
        personal = [s["personal"] for s in states.values()]
        assert not torch.equal(personal[0], personal[1])  # each client its own BN statistics


def test_fedbn_resume_restores_each_clients_batchnorm(completed_run, tmp_path):
    """FedBN (e): a run that crashes after round 1 and resumes ends with the same metrics as an
    uninterrupted run: each client's BN layers come back from the state store (Ditto's v_k and the
    heads and bodies use the same store)."""
    _, full = completed_run("fedbn")
    crashed = config_for(tmp_path, "fedbn")
    with pytest.raises(RuntimeError, match="simulated"):
        run_experiment(crashed, progress=False, extra_callbacks=[CrashAfterRound(1)])
    resume_experiment(tmp_path / "run", progress=False)
    assert comparable_rows(read_metrics(tmp_path / "run")) == comparable_rows(read_metrics(full))
    assert comparable_rows(read_metrics(tmp_path / "run", "client")) == comparable_rows(read_metrics(full, "client"))
