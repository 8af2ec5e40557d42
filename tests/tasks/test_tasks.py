"""The tasks (fedray.tasks): each loss against PyTorch's, each metric against scikit-learn's computed on
the whole split while fedray adds sums batch by batch, the targets' checks, and which algorithms serve
which task (checked before Ray)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn import metrics as sk

from fedray.algorithms.base import add_sums
from fedray.algorithms.requirements import CLASS_LABELS, check_requirements, supported_tasks
from fedray.config import ConfigError, RunConfig
from fedray.data import DatasetInfo
from fedray.models import build_model
from fedray.tasks import IGNORE_INDEX, TASKS, Classification, LanguageModeling, Multilabel, Regression, build_task, task_class


def info(outputs: int, **extra) -> DatasetInfo:
    return DatasetInfo("t", outputs, 0, 0, (), (), "none", modality="features", input_shape=(4,), **extra)


def config(**sections) -> RunConfig:
    return RunConfig.model_validate(sections)


def summed_in_batches(task, output: torch.Tensor, y: torch.Tensor, batch: int = 7) -> dict:
    total: dict = {}
    for start in range(0, len(y), batch):
        total = add_sums(total, task.evaluation_sums(output[start : start + batch], y[start : start + batch]))
    return total


def test_classification_is_cross_entropy_and_accuracy():
    generator = torch.Generator().manual_seed(0)
    logits, y = torch.randn(50, 5, generator=generator), torch.randint(0, 5, (50,), generator=generator)
    task = build_task(config(), info(5))
    assert torch.equal(task.loss(logits, y), F.cross_entropy(logits, y))
    metrics = task.metrics(summed_in_batches(task, logits, y))
    assert metrics["accuracy"] == pytest.approx(sk.accuracy_score(y, logits.argmax(1)))
    assert metrics["loss"] == pytest.approx(float(F.cross_entropy(logits, y)), rel=1e-6)
    assert task.headline_of({"correct": 3.0, "count": 4.0}) == 0.75  # an evaluate_client may return only these


@pytest.mark.parametrize("loss", ["mse", "mae", "huber"])
def test_regression_loss_is_on_standardised_targets(loss):
    generator = torch.Generator().manual_seed(1)
    y = 100 + 20 * torch.randn(30, 2, generator=generator)
    output = torch.randn(30, 2, generator=generator)
    task = build_task(
        config(data={"task": "regression"}, train={"loss": loss, "huber_delta": 0.5}),
        info(2, target_mean=(100.0, 100.0), target_std=(20.0, 20.0)),
    )
    standard = (y - 100) / 20
    expected = {
        "mse": F.mse_loss(output, standard),
        "mae": F.l1_loss(output, standard),
        "huber": F.huber_loss(output, standard, delta=0.5),
    }[loss]
    torch.testing.assert_close(task.loss(output, y), expected)
    assert task.loss_term == loss


def test_regression_metrics_equal_scikit_learn_in_the_targets_units():
    generator = torch.Generator().manual_seed(2)
    y = 50 + 10 * torch.randn(41, 3, generator=generator)
    output = torch.randn(41, 3, generator=generator)  # standardised predictions
    task = build_task(config(data={"task": "regression"}), info(3, target_mean=(50.0,) * 3, target_std=(10.0,) * 3))
    prediction = (output * 10 + 50).numpy()
    metrics = task.metrics(summed_in_batches(task, output, y))
    assert metrics["rmse"] == pytest.approx(math.sqrt(sk.mean_squared_error(y.numpy(), prediction)), rel=1e-6)
    assert metrics["mae"] == pytest.approx(sk.mean_absolute_error(y.numpy(), prediction), rel=1e-6)
    assert metrics["r2"] == pytest.approx(sk.r2_score(y.numpy(), prediction), rel=1e-5)


def test_multilabel_f1_and_map_equal_scikit_learn():
    rng = np.random.default_rng(3)
    y = (rng.random((60, 4)) < 0.4).astype(np.float32)
    # probabilities in distinct score bins, where the binned average precision is exact
    bins = rng.permutation(Multilabel.SCORE_BINS)[: 60 * 4].reshape(60, 4)
    probabilities = (bins + 0.5) / Multilabel.SCORE_BINS
    logits = torch.tensor(np.log(probabilities / (1 - probabilities)), dtype=torch.float32)
    task = build_task(config(data={"task": "multilabel"}), info(4))
    metrics = task.metrics(summed_in_batches(task, logits, torch.tensor(y)))
    predicted = (probabilities > 0.5).astype(int)
    assert metrics["micro_f1"] == pytest.approx(sk.f1_score(y, predicted, average="micro"))
    assert metrics["macro_f1"] == pytest.approx(sk.f1_score(y, predicted, average="macro"))
    assert metrics["map"] == pytest.approx(sk.average_precision_score(y, probabilities, average="macro"))
    torch.testing.assert_close(task.loss(logits, torch.tensor(y)), F.binary_cross_entropy_with_logits(logits, torch.tensor(y)))


def test_language_modeling_perplexity_skips_ignored_positions():
    generator = torch.Generator().manual_seed(4)
    logits = torch.randn(6, 5, 11, generator=generator)
    y = torch.randint(0, 11, (6, 5), generator=generator)
    y[0, -2:] = IGNORE_INDEX
    task = build_task(config(data={"task": "language_modeling"}), info(11))
    counted = y != IGNORE_INDEX
    token_loss = F.cross_entropy(logits[counted], y[counted])
    metrics = task.metrics(summed_in_batches(task, logits, y, batch=4))
    assert metrics["loss"] == pytest.approx(float(token_loss), rel=1e-6)
    assert metrics["perplexity"] == pytest.approx(math.exp(float(token_loss)), rel=1e-6)
    assert metrics["accuracy"] == pytest.approx(float((logits.argmax(-1)[counted] == y[counted]).float().mean()))
    torch.testing.assert_close(task.loss(logits, y), token_loss)


def test_each_task_states_its_headline_and_direction():
    assert {name: (task.headline, task.mode) for name, task in TASKS.items()} == {
        "classification": ("accuracy", "max"),
        "regression": ("rmse", "min"),
        "multilabel": ("micro_f1", "max"),
        "language_modeling": ("perplexity", "min"),
    }


def test_a_float_label_on_classification_says_that_regression_exists():
    with pytest.raises(ValueError, match="data.task=regression"):
        Classification.check_targets(np.array([0.5, 1.25]), "data.label_column")
    assert Classification.check_targets(np.array([1.0, 2.0]), "y").dtype == np.int64  # integral floats are labels


def test_target_checks_name_the_problem():
    with pytest.raises(ValueError, match="row 1 is not finite"):
        Regression.check_targets(np.array([1.0, np.nan]), "y")
    with pytest.raises(ValueError, match="0 or 1, got 2"):
        Multilabel.check_targets(np.array([[0, 1], [2, 0]]), "y")
    with pytest.raises(ValueError, match=r"int64 \[N, T\]"):
        LanguageModeling.check_targets(np.zeros((3,), dtype=np.int64), "y")
    assert Regression.check_targets(np.arange(4.0), "y").shape == (4, 1)


def test_regression_partitions_skew_over_deciles_of_the_target():
    y = np.arange(1000, dtype=np.float32)[:, None]
    labels = Regression.partition_labels(y)
    assert np.bincount(labels).tolist() == [100] * 10 and np.all(np.diff(labels) >= 0)
    assert LanguageModeling.partition_labels(np.zeros((3, 4), np.int64)) is None


def test_a_user_task_is_found_by_reference(tmp_path, monkeypatch):
    (tmp_path / "mytask.py").write_text(
        "import torch\nfrom fedray.tasks import Regression\n\n"
        "class LogCosh(Regression):\n    def loss(self, output, y):\n"
        "        return torch.log(torch.cosh(output - self._standardised(y))).mean()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    cls = task_class("mytask:LogCosh")
    assert cls.__name__ == "LogCosh" and cls.headline == "rmse"
    with pytest.raises(ConfigError, match="not a subclass of fedray.Task"):
        task_class("math:pi")


def test_algorithms_state_the_tasks_they_serve():
    from fedray.algorithms import get_algorithm_class

    assert supported_tasks(get_algorithm_class("fedavg")) == tuple(TASKS)
    assert supported_tasks(get_algorithm_class("fedprox")) == tuple(TASKS)
    assert supported_tasks(get_algorithm_class("fedsc")) == ("classification",)
    assert supported_tasks(get_algorithm_class("moon")) == ("classification", "regression", "multilabel")


def test_a_class_conditional_algorithm_on_a_regression_is_refused_with_the_reason():
    from fedray.algorithms import get_algorithm_class

    run = config(data={"task": "regression"}, algorithm={"name": "fedproto"})
    data_info = info(1, target_mean=(0.0,), target_std=(1.0,))
    algorithm = get_algorithm_class("fedproto")(run, data_info)
    with pytest.raises(ConfigError, match="one class label per sample") as error:
        check_requirements(algorithm, build_model(run.model.model_copy(update={"name": "mlp"}), data_info))
    assert error.value.key == CLASS_LABELS.keys
