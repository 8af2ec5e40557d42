"""Runs on a CUDA device: the local pool's worker on the GPU, and fractional GPUs on Ray
(``pytest -m cuda``; benchmarks/gpu_check.py runs these). They skip where torch sees no GPU."""

from __future__ import annotations

import pytest
import torch

from fedray import load_config
from fedray.runtime import run_experiment
from fedray.testing import Federation

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

# Digits, 12 clients, 6 a round, 5 rounds of 2 local epochs: 72.5 % on the CPU.
ROUNDS = ["train.rounds=5", "data.num_clients=12", "train.clients_per_round=6", "train.local_epochs=2", "eval.every=1"]


def test_a_gpu_worker_keeps_its_data_and_model_on_the_gpu_and_learns_as_on_the_cpu(tmp_path):
    gpu = Federation(tmp_path / "gpu", [*ROUNDS, "resources.gpus_per_worker=1"])
    cpu = Federation(tmp_path / "cpu", ROUNDS)
    assert gpu.worker.device.type == "cuda" and gpu.worker.x_train.is_cuda
    gpu.run(5), cpu.run(5)
    assert gpu.rows[-1]["test_accuracy"] > 0.5  # digits: 10 classes
    # The same seeded training on another device: float sums in another order, the same learning.
    assert abs(gpu.rows[-1]["test_accuracy"] - cpu.rows[-1]["test_accuracy"]) < 0.05


@pytest.mark.parametrize("workers", [2, 4])
def test_fractional_gpu_workers_on_ray_train_as_one_worker_on_a_whole_gpu(tmp_path, workers):
    def final_accuracy(num_workers: int) -> float:
        overrides = [*ROUNDS, "resources.backend=ray", f"resources.num_workers={num_workers}", "resources.cpus_per_worker=1"]
        overrides += [f"resources.gpus_per_worker={1 / num_workers}", f"output.dir={tmp_path}", f"output.name=w{num_workers}"]
        summary = run_experiment(load_config(None, overrides), progress=False)
        assert summary.rounds == 5
        return summary.final_test_accuracy

    one, many = final_accuracy(1), final_accuracy(workers)
    assert one > 0.5 and abs(many - one) < 0.05
