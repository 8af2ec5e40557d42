"""Ray-free tests of the runtime's pieces: seeding, scheduling, reduction, client state, checkpoints."""

from __future__ import annotations

import os
import pickle
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fedray import load_config
from fedray.algorithms.base import ClientUpdate
from fedray.data import build_federated_dataset
from fedray.runtime import TrainingDiverged
from fedray.runtime.checkpoint import CheckpointError, list_checkpoints, load_checkpoint, load_latest_checkpoint, save_checkpoint
from fedray.runtime.reduction import PartialResult, merge_partials
from fedray.algorithms.costs import client_forward_flops
from fedray.runtime.scheduler import assign_clients
from fedray.seeding import derive_seed, sample_cohort, seed_client
from fedray.runtime.state_store import NO_STATE, ClientStateStore
from fedray.runtime.worker import build_algorithm

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
from schedule_balance import slowest_over_mean  # noqa: E402


def test_cohort_depends_on_seed_and_round_only():
    a = sample_cohort(0, 3, 1000, 100)
    assert np.array_equal(a, sample_cohort(0, 3, 1000, 100))
    assert not np.array_equal(a, sample_cohort(0, 4, 1000, 100))
    assert not np.array_equal(a, sample_cohort(1, 3, 1000, 100))
    assert len(np.unique(a)) == 100 and np.all(np.diff(a) > 0)


def test_client_seed_is_independent_of_call_order():
    first = torch.rand(3, generator=seed_client(0, 2, 7))
    seed_client(0, 2, 8)
    assert torch.equal(first, torch.rand(3, generator=seed_client(0, 2, 7)))
    assert derive_seed(0, 2, 7) != derive_seed(0, 7, 2)


def test_schedule_covers_cohort_balances_and_is_sticky():
    ids = np.arange(0, 40)
    costs = np.full(40, 10.0)
    assignment = assign_clients(ids, costs, 4)
    assert sorted(c for part in assignment for c in part) == list(range(40))
    assert all(c % 4 == w for w, part in enumerate(assignment) for c in part)  # equal costs: all at home
    skewed = np.array([100.0] + [1.0] * 39)
    loads = [sum(skewed[c] for c in part) for part in assign_clients(ids, skewed, 4)]
    assert max(loads) == 100.0  # the big client alone; the small ones spread over the others
    assert assign_clients(ids, skewed, 4) == assign_clients(ids, skewed, 4)


def test_schedule_without_stickiness_places_each_client_on_the_least_loaded_worker():
    ids = np.arange(10)
    costs = np.array([1485.0, 1200, 900, 874, 700, 650, 574, 400, 300, 157])
    sticky = [costs[part].sum() for part in assign_clients(ids, costs, 2)]
    balanced = [costs[part].sum() for part in assign_clients(ids, costs, 2, sticky=False)]
    assert max(balanced) - min(balanced) < max(sticky) - min(sticky)
    assert max(balanced) - min(balanced) <= costs.min()  # LPT: within the smallest client
    assert sorted(c for part in assign_clients(ids, costs, 2, sticky=False) for c in part) == list(range(10))


def test_schedule_moves_clients_off_an_overloaded_home():
    ids = np.array([0, 4, 8, 12])  # all at home on worker 0 of 4
    parts = assign_clients(ids, np.ones(4), 4)
    assert [len(p) for p in parts] == [1, 1, 1, 1]


def test_clients_with_wider_models_cost_more_and_are_spread_over_the_workers():
    """Hetero-SSFL's round-robin widths 16/32 share their parity with the home worker (client id mod
    2): costed by samples alone, every wide client went to one worker while the other waited."""
    config = load_config(REPO / "examples" / "hetero_ssfl_digits.yaml", ["data.num_clients=40"])
    data = build_federated_dataset(config.data, config.seed)
    flops = client_forward_flops(build_algorithm(config, data), data)
    assert (
        flops[1] / flops[0] > 3
        and np.array_equal(flops[0::2], np.full(20, flops[0]))
        and np.array_equal(flops[1::2], np.full(20, flops[1]))
    )

    work = data.clients.sizes * flops  # what a worker's time is proportional to
    assert slowest_over_mean(config, data.clients.sizes * 1.0, work, rounds=20, sticky=True) > 1.3  # samples only
    assert slowest_over_mean(config, work, work, rounds=20, sticky=True) < 1.12

    one_model = load_config(None, ["data.num_clients=40"])
    assert np.array_equal(client_forward_flops(build_algorithm(one_model, data), data), np.ones(40))  # assignments as before


def update(value: float, n: int) -> ClientUpdate:
    return ClientUpdate(
        sums={"weights": torch.full((3,), value * n, dtype=torch.float64), "num_samples": torch.tensor(float(n))},
        metrics={"train_loss": value},
    )


def test_reduction_sums_in_float64_and_excludes_non_finite():
    partial = PartialResult()
    assert partial.add(1, update(1.0, 2)) and partial.add(2, update(3.0, 6))
    assert not partial.add(3, update(float("nan"), 1))
    other = PartialResult()
    other.add(5, update(2.0, 4))
    merged = merge_partials([partial, other])
    assert merged.num_clients == 3 and merged.excluded_clients == [3]
    assert merged.sums["weights"].dtype == torch.float64
    assert torch.allclose(merged.sums["weights"] / merged.sums["num_samples"], torch.full((3,), (2 + 18 + 8) / 12, dtype=torch.float64))
    assert set(merged.client_metrics) == {1, 2, 3, 5}


def test_state_store_versions_and_cleanup(tmp_path):
    store = ClientStateStore(tmp_path, cache_size=1)
    assert store.load(3, NO_STATE, torch.device("cpu")) is None
    store.save(3, 1, {"w": torch.ones(2)}, keep=(NO_STATE, NO_STATE))
    store.save(3, 4, {"w": torch.full((2,), 4.0)}, keep=(1, 1))
    store.save(3, 6, {"w": torch.full((2,), 6.0)}, keep=(4, 1))  # round 4 loaded, round 1 checkpointed
    fresh = ClientStateStore(tmp_path)  # another worker: reads from disk
    assert torch.equal(fresh.load(3, 1, torch.device("cpu"))["w"], torch.ones(2))
    assert torch.equal(fresh.load(3, 6, torch.device("cpu"))["w"], torch.full((2,), 6.0))
    store.save(3, 7, {"w": torch.zeros(2)}, keep=(6, 6))
    assert sorted(p.name for p in (tmp_path / "0000003").iterdir()) == ["r000006.pt", "r000007.pt"]
    with pytest.raises(FileNotFoundError, match="client 3"):
        fresh.load(3, 1, torch.device("cpu"))


def test_checkpoints_are_kept_pruned_and_round_trip(tmp_path):
    for round in (2, 4, 6):
        save_checkpoint(
            tmp_path,
            round,
            {"server_state": {"weights": torch.full((2,), float(round))}, "state_versions": torch.zeros(3, dtype=torch.int64)},
            keep=2,
        )
    assert [r for r, _ in list_checkpoints(tmp_path)] == [4, 6]
    latest = load_latest_checkpoint(tmp_path)
    assert latest["round"] == 6 and torch.equal(latest["server_state"]["weights"], torch.full((2,), 6.0))


def test_corrupt_checkpoint_is_reported_with_the_fallback(tmp_path):
    for round in (2, 4):
        save_checkpoint(tmp_path, round, {"server_state": {}, "state_versions": torch.zeros(1)}, keep=3)
    path = list_checkpoints(tmp_path)[-1][1]
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    with pytest.raises(CheckpointError, match=r"corrupt.*round_000002\.pt"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="corrupt"):  # resuming never silently skips a bad file
        load_latest_checkpoint(tmp_path)


HEAP_KEPT_AFTER_FREEING_64_MB = """
import ctypes, torch
from fedray.runtime.worker import keep_freed_memory

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2

def free_bytes_kept() -> int:
    torch.ones(16 * 2**20)  # 64 MB, freed at once
    return libc.mallinfo2().fordblks  # free bytes malloc keeps in its heap for the next allocation

default = free_bytes_kept()
keep_freed_memory()
print(default, free_bytes_kept())
"""


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="tunes glibc's malloc")
@pytest.mark.slow
def test_worker_keeps_freed_memory_instead_of_handing_it_back():
    """By default glibc maps a 64 MB block on its own and unmaps it on free, so the next one faults all
    its pages in again; a worker keeps it in the heap. (Counting the page faults themselves is not
    reliable: where the next block lands in the heap varies from run to run.)"""
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])}
    output = subprocess.run(
        [sys.executable, "-c", HEAP_KEPT_AFTER_FREEING_64_MB], env=env, capture_output=True, text=True, check=True
    ).stdout
    default, kept = map(int, output.split())
    assert default < 16 * 2**20  # handed back to the OS
    assert kept >= 64 * 2**20  # kept for reuse


def test_training_diverged_keeps_its_round_through_pickling():
    """Ray pickles a trial's exception out of the trial process (a diverged Tune trial)."""
    error = pickle.loads(pickle.dumps(TrainingDiverged("round 3: all 10 client updates were non-finite", 3)))
    assert isinstance(error, TrainingDiverged) and error.round == 3
    assert str(error) == "round 3: all 10 client updates were non-finite"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_worker_copies_the_broadcast_to_the_gpu_once_a_round_and_trains_as_on_cpu(tmp_path):
    from fedray.models import get_flat_weights
    from fedray.runtime.worker import ClientWorker

    config = load_config(None, ["data.num_clients=6", "train.clients_per_round=3", "train.local_epochs=1"])
    data = build_federated_dataset(config.data, config.seed)
    gpu, cpu = (ClientWorker(config.to_dict(), data, str(tmp_path / name), use_gpu=name == "gpu") for name in ("gpu", "cpu"))
    broadcast = {"weights": get_flat_weights(cpu.model_for(None))}  # on the CPU, as Ray hands it to a worker
    received = []
    client_update = gpu.algorithm.client_update
    gpu.algorithm.client_update = lambda ctx, sent: received.append(sent["weights"]) or client_update(ctx, sent)
    tasks = [(client, NO_STATE, ()) for client in (0, 2, 4)]
    on_gpu, on_cpu = gpu.run_clients(1, tasks, broadcast), cpu.run_clients(1, tasks, broadcast)
    assert len(received) == 3 and all(w.is_cuda and w.data_ptr() == received[0].data_ptr() for w in received)
    assert not on_gpu.sums["weights"].is_cuda  # back on the CPU for transport
    torch.testing.assert_close(on_gpu.sums["weights"], on_cpu.sums["weights"], rtol=1e-3, atol=1e-3)
