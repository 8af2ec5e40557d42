"""Runs on a CUDA device: the local pool's worker on the GPU (the loop and vectorised), and fractional GPUs on Ray
(``pytest -m cuda``; benchmarks/gpu_check.py runs these). They skip where torch sees no GPU."""

from __future__ import annotations

import pytest
import torch

from fedray import load_config
from fedray.algorithms.vectorized import VECTORIZED
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


@pytest.mark.parametrize("model", ["cnn_small", "mlp"])
def test_a_vectorised_round_on_the_gpu_equals_the_loop_on_the_gpu(tmp_path, monkeypatch, model):
    # cuDNN convolutions may use TF32 (a 10-bit mantissa) by default: compare the maths in float32.
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    overrides = [*ROUNDS, "resources.gpus_per_worker=1", f"model.name={model}", "model.width=8", "train.momentum=0.9"]
    vectorised = Federation(tmp_path / "on", [*overrides, "train.vectorize=on"])
    loop = Federation(tmp_path / "off", [*overrides, "train.vectorize=off"])
    vectorised.run(2), loop.run(2)
    assert vectorised.worker.device.type == "cuda" and vectorised.worker.training_path == VECTORIZED
    # Two rounds of 2 local epochs: more steps than tests/runtime/test_vectorized.py's one round, so a
    # looser tolerance, still far below a changed step, batch or mask (> 1e-3).
    torch.testing.assert_close(vectorised.state["weights"], loop.state["weights"], rtol=1e-4, atol=1e-5)
    assert not torch.equal(vectorised.state["weights"], Federation(tmp_path / "fresh", overrides).state["weights"])
