"""pfl-research (PyPI ``pfl``, PyTorch, its one-process ``SimulatedBackend``) training a workload of
benchmarks/peers exactly as the plain loop of benchmarks/w1_overhead.py (``run_plain``) does:

- fedray's partition and seeded cohorts: the user sampler hands pfl the clients of
  ``sample_cohort(seed, round, num_clients, clients_per_round)``, round after round;
- the plain loop's batches: a user's dataset is its client's data in the plain loop's order for that
  round (``batch_order_generator``), which pfl iterates in order, ``train.batch_size`` at a time
  (hence one local epoch only: pfl would repeat the same order in a second one);
- plain SGD at ``train.lr`` on the user, FedAvg weighted by the users' data points
  (``WeightByDatapoints``), applied by a central SGD of learning rate 1;
- the global model scored on the test set after the rounds the others score (``evaluates_after``).
  pfl's ``CentralEvaluationCallback`` counts central iterations from 0 and scores before training
  (with frequency 10 and 10 rounds it never scores the trained model), hence the callback below.

pfl scores each user before and after its local training in central iteration 0 whatever
``evaluation_frequency`` (its ``do_evaluation``), so round 1 does a little more work than the plain
loop's; round 1 is outside the steady state. Run by run_peers.py in pfl's virtual environment.
"""

from __future__ import annotations

import time
from importlib.metadata import version

import torch
import torch.nn.functional as F
from pfl.aggregate.simulate import SimulatedBackend
from pfl.aggregate.weighting import WeightByDatapoints
from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
from pfl.callback.base import TrainingProcessCallback
from pfl.data.dataset import Dataset
from pfl.data.federated_dataset import FederatedDataset
from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
from pfl.metrics import Metrics, StringMetricName, Weighted
from pfl.model.pytorch import PyTorchModel
from w1_overhead import PlainWorkload, batch_order_generator, evaluates_after, prepare_workload
from workloads import peer_main, peer_result

from fedray.seeding import sample_cohort


class Classifier(torch.nn.Module):
    """fedray's model with the ``loss`` and ``metrics`` methods pfl's ``PyTorchModel`` calls."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def loss(self, x: torch.Tensor, y: torch.Tensor, eval: bool = False) -> torch.Tensor:
        self.eval() if eval else self.train()
        return F.cross_entropy(self(x), y)

    @torch.no_grad()
    def metrics(self, x: torch.Tensor, y: torch.Tensor, eval: bool = True) -> dict[str, Weighted]:
        self.eval()
        return {"accuracy": Weighted(float((self(x).argmax(1) == y).sum()), len(y))}


class ScoreAfterRounds(TrainingProcessCallback):
    """Scores the global model on the test set after the rounds run_plain scores it, and clocks the rounds."""

    def __init__(self, workload: PlainWorkload) -> None:
        self.workload = workload
        self.test_set = Dataset((workload.x_test, workload.y_test))
        self.marks: list[float] = []  # time.perf_counter() at round 1's start and at the end of each round
        self.accuracy = float("nan")

    def on_train_begin(self, *, model: PyTorchModel) -> Metrics:
        self.marks.append(time.perf_counter())
        return Metrics()

    def after_central_iteration(self, aggregate_metrics: Metrics, model: PyTorchModel, *, central_iteration: int) -> tuple[bool, Metrics]:
        metrics = Metrics()
        if evaluates_after(central_iteration + 1, self.workload.config):
            metrics = model.evaluate(self.test_set, eval_params=NNEvalHyperParams(local_batch_size=None))
            self.accuracy = metrics[StringMetricName("accuracy")].overall_value
        self.marks.append(time.perf_counter())
        return False, metrics


def run(overrides: list[str], workers: int) -> dict:
    if workers != 1:
        raise SystemExit("pfl_peer: pfl's SimulatedBackend runs in one process (--workers 1)")
    started = time.perf_counter()
    torch.set_num_threads(1)  # as the plain loop (benchmarks/w1_overhead.py run_plain)
    workload = prepare_workload(overrides)
    config, train = workload.config, workload.config.train
    if train.local_epochs != 1:
        raise SystemExit("pfl_peer: one local epoch only (pfl iterates a user's data in the same order every epoch)")
    cohorts = iter(
        [
            (round, int(client))
            for round in range(1, train.rounds + 1)
            for client in sample_cohort(config.seed, round, workload.data.num_clients, train.clients_per_round)
        ]
    )

    def user_dataset(user: tuple[int, int]) -> Dataset:
        round, client = user
        x, y = workload.client_data(client)
        order = torch.randperm(len(y), generator=batch_order_generator(client, round))
        return Dataset((workload.data.info.normalize(x[order]), y[order]), user_id=str(client))

    backend = SimulatedBackend(
        training_data=FederatedDataset(user_dataset, user_sampler=lambda: next(cohorts)),
        val_data=None,
        postprocessors=[WeightByDatapoints()],
    )
    model = PyTorchModel(
        Classifier(workload.model),
        local_optimizer_create=torch.optim.SGD,
        central_optimizer=torch.optim.SGD(workload.model.parameters(), lr=1.0),
    )
    clock = ScoreAfterRounds(workload)
    FederatedAveraging().run(
        algorithm_params=NNAlgorithmParams(
            central_num_iterations=train.rounds,
            evaluation_frequency=train.rounds + 1,  # no per-user scoring after central iteration 0 (see the module's docstring)
            train_cohort_size=train.clients_per_round,
            val_cohort_size=0,
        ),
        backend=backend,
        model=model,
        model_train_params=NNTrainHyperParams(
            local_num_epochs=train.local_epochs, local_learning_rate=train.lr, local_batch_size=train.batch_size
        ),
        model_eval_params=NNEvalHyperParams(local_batch_size=None),
        callbacks=[clock],
    )
    return peer_result(started, clock.marks, clock.accuracy, {"pfl": version("pfl"), "torch": torch.__version__})


def main(argv: list[str]) -> int:
    return peer_main(run, argv)
