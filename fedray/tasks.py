"""What a run learns: the task, one object per run (``data.task``).

A task owns everything that depends on what the targets are, so that no algorithm, evaluation or
report branches on it (docs/guide/tasks.md):

- the **base loss** on (model output, batch targets), :meth:`Task.loss`: the term every algorithm's
  local objective starts from (FedProx adds its proximal term to it whatever the task). It is a pure
  tensor function of its two arguments, so the same code runs one client in a loop and a stacked
  group of clients under ``torch.func.vmap``;
- the **evaluation sums** of a batch (:meth:`Task.evaluation_sums`, additive over batches, shards and
  workers) and their reduction to metrics (:meth:`Task.metrics`);
- the **headline metric** (:attr:`Task.headline`) and whether higher is better (:attr:`Task.mode`),
  which the progress bar, ``summary.json``, ``comparison.md``, the dashboard and Tune's defaults use;
- the **targets' form** (:meth:`Task.check_targets`) and the model's output size (``DatasetInfo.num_classes``).

The built-in tasks (:data:`TASKS`):

=====================  ==============================  ==================================  =====================
``data.task``          targets ``y``                   loss                                headline
=====================  ==============================  ==================================  =====================
``classification``     int64 ``[N]`` in ``0..C-1``     cross-entropy                       ``test_accuracy`` ↑
``regression``         float32 ``[N, K]``              MSE, MAE or Huber (``train.loss``)  ``test_rmse`` ↓
``multilabel``         float32 ``[N, L]`` of 0/1       binary cross-entropy per label      ``test_micro_f1`` ↑
``language_modeling``  int64 ``[N, T]`` (next tokens)  next-token cross-entropy            ``test_perplexity`` ↓
=====================  ==============================  ==================================  =====================

``data.task: package.module:Name`` names the user's own :class:`Task` subclass (docs/guide/tasks.md).
"""

from __future__ import annotations

import math
from functools import cache
from typing import Any, ClassVar, Literal

import numpy as np
import torch
import torch.nn.functional as F

from fedray.config import ConfigError, RunConfig
from fedray.config.schema import TASK_REPORTS
from fedray.config.references import import_reference, is_reference

Tensor = torch.Tensor
Sums = dict[str, Any]  # float or float64 numpy arrays, added elementwise over batches and shards

#: Positions of a language-modelling target that no loss or metric counts (``F.cross_entropy``'s default).
IGNORE_INDEX = -100


class Task:
    """Base of every task. A subclass sets the class attributes and implements the four methods.

    ``info`` is the run's :class:`fedray.data.DatasetInfo` (``num_classes``: the model's output size
    per sample or per position; ``target_mean``/``target_std``: regression's target statistics)."""

    name: ClassVar[str] = ""
    headline: ClassVar[str] = "accuracy"  # the metric runs are ranked by; reported as test_<headline>
    mode: ClassVar[Literal["max", "min"]] = "max"  # whether a larger headline is better
    metric_names: ClassVar[tuple[str, ...]] = ("accuracy", "loss")  # what metrics() returns
    loss_term: str = "ce"  # the base loss's name among a client's metrics (beside an algorithm's own terms)
    # The keys evaluation_sums returns, which a user algorithm's evaluate_global must return too, and
    # those an evaluate_client must return (what headline_of reads).
    sum_keys: ClassVar[tuple[str, ...]] = ("correct", "loss_sum", "count")
    client_sum_keys: ClassVar[tuple[str, ...]] = ("correct", "count")
    # Whether each sample has one class label in 0..num_classes-1: what class-conditional algorithms
    # (prototypes, logit calibration, class-balanced losses) and label-skew partitions need.
    class_labels: ClassVar[bool] = True
    # Whether the model gives one output vector per sample (not one per position): what algorithms
    # that contrast or decorrelate per-sample features need.
    per_sample_outputs: ClassVar[bool] = True
    # What the groups of partition_labels are, for the partition plot's axis.
    partition_groups: ClassVar[str] = "class"

    def __init__(self, config: RunConfig, info: Any) -> None:
        self.config = config
        self.info = info

    def loss(self, output: Tensor, y: Tensor) -> Tensor:
        """The mean base loss of a batch: ``output`` as the model returns it, ``y`` as stored."""
        raise NotImplementedError

    def evaluation_sums(self, output: Tensor, y: Tensor) -> Sums:
        """Additive sums of one evaluation batch (including ``count``)."""
        raise NotImplementedError

    def metrics(self, sums: Sums) -> dict[str, float]:
        """``metric_names`` from sums added over a whole split (without the ``test_`` prefix)."""
        raise NotImplementedError

    def headline_of(self, sums: Sums) -> float:
        """The headline metric from ``sums`` (one client's, or several clients' added)."""
        return self.metrics(sums)[self.headline]

    @classmethod
    def check_targets(cls, y: np.ndarray, where: str) -> np.ndarray:
        """``y`` in this task's stored form, or :class:`ValueError` with one line saying what is wrong
        (a class method: data loading checks targets before the dataset's info exists)."""
        raise NotImplementedError

    @classmethod
    def partition_labels(cls, y: np.ndarray) -> np.ndarray | None:
        """One int label per sample for the label-skew partitions (``dirichlet``, ``shards``), or
        ``None`` where the targets have none (those partitions are then refused)."""
        return y if cls.class_labels else None

    def chance_loss(self) -> float | None:
        """The loss of a model that knows nothing (ln C for C classes), the floor of the health
        monitor's outlier test; ``None``: no such reference."""
        return None


class Classification(Task):
    """One class label per sample; cross-entropy; accuracy."""

    name = "classification"
    headline, mode, metric_names = TASK_REPORTS[name]

    def loss(self, output: Tensor, y: Tensor) -> Tensor:
        return F.cross_entropy(output, y)

    def evaluation_sums(self, output: Tensor, y: Tensor) -> Sums:
        return {
            "correct": float(int((output.argmax(dim=1) == y).sum())),
            "loss_sum": float(F.cross_entropy(output, y, reduction="sum")),
            "count": float(y.shape[0]),
        }

    def metrics(self, sums: Sums) -> dict[str, float]:
        return {"accuracy": sums["correct"] / sums["count"], "loss": sums["loss_sum"] / sums["count"]}

    def headline_of(self, sums: Sums) -> float:
        return sums["correct"] / sums["count"]  # needs no loss_sum: an evaluate_client may return correct and count only

    @classmethod
    def check_targets(cls, y: np.ndarray, where: str) -> np.ndarray:
        if y.ndim != 1:
            raise ValueError(f"{where}: classification needs one label per sample, got targets of shape {y.shape}")
        if not np.issubdtype(y.dtype, np.integer) and not np.issubdtype(y.dtype, np.bool_):
            if np.issubdtype(y.dtype, np.floating) and np.all(np.isfinite(y)) and np.all(y == np.round(y)):
                return y.astype(np.int64)
            hint = " (float targets are a regression: set data.task=regression)" if np.issubdtype(y.dtype, np.floating) else ""
            raise ValueError(f"{where}: labels must be integers, got {y.dtype}{hint}")
        y = y.astype(np.int64)
        if y.size and int(y.min()) < 0:
            raise ValueError(f"{where}: label {int(y.min())} is out of range (labels must be >= 0)")
        return y

    def chance_loss(self) -> float | None:
        return math.log(self.info.num_classes)


class Regression(Task):
    """Float targets, one or several outputs ``[N, K]``; the loss is ``train.loss`` (MSE, MAE or Huber
    with ``train.huber_delta``) on targets standardised with the training set's per-output mean and std
    (``DatasetInfo.target_mean``/``target_std``), so one learning rate suits targets of any scale.
    RMSE, MAE (in the targets' own units) and R² (the mean over outputs of ``1 − SSE/SST``, SST about
    the test split's mean) are reported; ``test_loss`` is in standardised units."""

    name = "regression"
    headline, mode, metric_names = TASK_REPORTS[name]
    class_labels = False

    sum_keys = client_sum_keys = ("squared_error", "absolute_error", "target_sum", "target_square_sum", "loss_sum", "count")
    #: Equal-count bins of the first target that the label-skew partitions skew over.
    PARTITION_BINS = 10
    partition_groups = "decile of the first target"

    def __init__(self, config: RunConfig, info: Any) -> None:
        super().__init__(config, info)
        self.loss_term = "mse" if config.train.loss == "auto" else config.train.loss
        self.delta = config.train.huber_delta
        self.mean = torch.tensor(info.target_mean or (0.0,) * info.num_classes, dtype=torch.float32)
        self.std = torch.tensor(info.target_std or (1.0,) * info.num_classes, dtype=torch.float32)

    def _standardised(self, y: Tensor) -> Tensor:
        return (y - self.mean.to(y.device)) / self.std.to(y.device)

    def _elementwise(self, output: Tensor, target: Tensor) -> Tensor:
        if self.loss_term == "mae":
            return (output - target).abs()
        if self.loss_term == "huber":
            return F.huber_loss(output, target, reduction="none", delta=self.delta)
        return (output - target) ** 2

    def loss(self, output: Tensor, y: Tensor) -> Tensor:
        return self._elementwise(output, self._standardised(y)).mean()

    def evaluation_sums(self, output: Tensor, y: Tensor) -> Sums:
        prediction = output * self.std.to(output.device) + self.mean.to(output.device)
        error = (prediction - y).double()
        y64 = y.double()
        return {
            "squared_error": error.pow(2).sum(dim=0).cpu().numpy(),
            "absolute_error": error.abs().sum(dim=0).cpu().numpy(),
            "target_sum": y64.sum(dim=0).cpu().numpy(),
            "target_square_sum": y64.pow(2).sum(dim=0).cpu().numpy(),
            "loss_sum": float(self._elementwise(output, self._standardised(y)).mean(dim=1).sum()),
            "count": float(y.shape[0]),
        }

    def metrics(self, sums: Sums) -> dict[str, float]:
        n = sums["count"]
        total_variance = sums["target_square_sum"] - sums["target_sum"] ** 2 / n  # Σ (y − ȳ)² per output
        r2 = 1.0 - sums["squared_error"] / np.where(total_variance > 0, total_variance, np.nan)
        return {
            "rmse": float(np.sqrt(sums["squared_error"].sum() / (n * len(sums["squared_error"])))),
            "mae": float(sums["absolute_error"].sum() / (n * len(sums["absolute_error"]))),
            "r2": float(np.nanmean(r2)) if np.isfinite(r2).any() else float("nan"),
            "loss": sums["loss_sum"] / n,
        }

    @classmethod
    def check_targets(cls, y: np.ndarray, where: str) -> np.ndarray:
        if y.ndim == 1:
            y = y[:, None]
        if y.ndim != 2:
            raise ValueError(f"{where}: regression targets must be [N] or [N, outputs], got shape {y.shape}")
        if not (np.issubdtype(y.dtype, np.number) or np.issubdtype(y.dtype, np.bool_)):
            raise ValueError(f"{where}: regression targets must be numbers, got {y.dtype}")
        y = y.astype(np.float32)
        if not np.all(np.isfinite(y)):
            row = int(np.flatnonzero(~np.isfinite(y).all(axis=1))[0])
            raise ValueError(f"{where}: target of row {row} is not finite ({y[row].tolist()}); drop such rows with data.missing=drop")
        return y

    @classmethod
    def partition_labels(cls, y: np.ndarray) -> np.ndarray | None:
        """The decile (``PARTITION_BINS`` equal-count bins) of each sample's first target: label skew
        over deciles is target skew, the regression form of non-IID clients."""
        edges = np.quantile(y[:, 0], np.linspace(0, 1, cls.PARTITION_BINS + 1)[1:-1])
        return np.searchsorted(edges, y[:, 0], side="right").astype(np.int64)


class Multilabel(Task):
    """Several binary labels per sample ``[N, L]``; binary cross-entropy on the logits, averaged over
    labels and samples. A label is predicted where its logit is positive (probability > ½).

    micro-F1 pools every (sample, label) decision; macro-F1 is the mean over labels of each label's
    F1 (labels with no positive and no prediction in the split are left out); mAP is the mean over
    labels with a positive of the average precision, computed from ``SCORE_BINS`` equal-width bins of
    the predicted probability (exact but for ties inside a bin, which count as one threshold)."""

    name = "multilabel"
    headline, mode, metric_names = TASK_REPORTS[name]
    class_labels = False

    SCORE_BINS = 1000
    loss_term = "bce"
    sum_keys = client_sum_keys = (
        "true_positives",
        "false_positives",
        "false_negatives",
        "positive_scores",
        "negative_scores",
        "loss_sum",
        "count",
    )

    def loss(self, output: Tensor, y: Tensor) -> Tensor:
        return F.binary_cross_entropy_with_logits(output, y)

    def evaluation_sums(self, output: Tensor, y: Tensor) -> Sums:
        predicted = output > 0
        positive = y > 0.5
        bins = (torch.sigmoid(output.double()) * self.SCORE_BINS).long().clamp_(max=self.SCORE_BINS - 1)
        labels = y.shape[1]
        offsets = torch.arange(labels, device=output.device) * self.SCORE_BINS
        flat = (bins + offsets).reshape(-1)

        def histogram(mask: Tensor) -> np.ndarray:
            counts = torch.bincount(flat[mask.reshape(-1)], minlength=labels * self.SCORE_BINS)
            return counts.view(labels, self.SCORE_BINS).double().cpu().numpy()

        return {
            "true_positives": (predicted & positive).sum(dim=0).double().cpu().numpy(),
            "false_positives": (predicted & ~positive).sum(dim=0).double().cpu().numpy(),
            "false_negatives": (~predicted & positive).sum(dim=0).double().cpu().numpy(),
            "positive_scores": histogram(positive),
            "negative_scores": histogram(~positive),
            "loss_sum": float(F.binary_cross_entropy_with_logits(output, y, reduction="none").mean(dim=1).sum()),
            "count": float(y.shape[0]),
        }

    def metrics(self, sums: Sums) -> dict[str, float]:
        tp, fp, fn = sums["true_positives"], sums["false_positives"], sums["false_negatives"]
        micro_denominator = 2 * tp.sum() + fp.sum() + fn.sum()
        per_label_denominator = 2 * tp + fp + fn
        present = per_label_denominator > 0
        macro = (2 * tp[present] / per_label_denominator[present]).mean() if present.any() else float("nan")
        return {
            "micro_f1": float(2 * tp.sum() / micro_denominator) if micro_denominator > 0 else float("nan"),
            "macro_f1": float(macro),
            "map": _mean_average_precision(sums["positive_scores"], sums["negative_scores"]),
            "loss": sums["loss_sum"] / sums["count"],
        }

    @classmethod
    def check_targets(cls, y: np.ndarray, where: str) -> np.ndarray:
        if y.ndim != 2:
            raise ValueError(f"{where}: multilabel targets must be [N, labels] of 0/1, got shape {y.shape}")
        if not np.isin(y, (0, 1)).all():
            bad = np.argwhere(~np.isin(y, (0, 1)))[0]
            raise ValueError(f"{where}: multilabel targets must be 0 or 1, got {y[tuple(bad)].item()!r} in row {int(bad[0])}")
        return y.astype(np.float32)


def _mean_average_precision(positive: np.ndarray, negative: np.ndarray) -> float:
    """Mean over labels with a positive of AP = Σ_t precision(t) · Δrecall(t), thresholds t at the
    score bins from the highest down (``positive``/``negative``: [labels, bins] score histograms)."""
    true_positives = np.cumsum(positive[:, ::-1], axis=1)
    predicted = true_positives + np.cumsum(negative[:, ::-1], axis=1)
    precision = np.divide(true_positives, predicted, out=np.zeros_like(true_positives), where=predicted > 0)
    totals = positive.sum(axis=1)
    with_positives = totals > 0
    if not with_positives.any():
        return float("nan")
    ap = (precision * positive[:, ::-1]).sum(axis=1)[with_positives] / totals[with_positives]
    return float(ap.mean())


class LanguageModeling(Task):
    """Token sequences; the target of position t is the token at t + 1 (``y`` int64 ``[N, T]``,
    :data:`IGNORE_INDEX` where there is none). The model returns logits ``[B, T, V]``. The loss is
    the mean next-token cross-entropy over counted positions; perplexity is ``exp`` of the test
    split's mean token loss, next-token accuracy the share of counted positions predicted exactly."""

    name = "language_modeling"
    headline, mode, metric_names = TASK_REPORTS[name]
    class_labels = False
    per_sample_outputs = False
    sum_keys = client_sum_keys = ("loss_sum", "correct", "tokens", "count")

    def loss(self, output: Tensor, y: Tensor) -> Tensor:
        return F.cross_entropy(output.flatten(0, 1), y.flatten(), ignore_index=IGNORE_INDEX)

    def evaluation_sums(self, output: Tensor, y: Tensor) -> Sums:
        counted = y != IGNORE_INDEX
        return {
            "loss_sum": float(F.cross_entropy(output.flatten(0, 1), y.flatten(), ignore_index=IGNORE_INDEX, reduction="sum")),
            "correct": float(int(((output.argmax(dim=-1) == y) & counted).sum())),
            "tokens": float(int(counted.sum())),
            "count": float(y.shape[0]),
        }

    def metrics(self, sums: Sums) -> dict[str, float]:
        loss = sums["loss_sum"] / sums["tokens"]
        return {"perplexity": math.exp(min(loss, 700.0)), "accuracy": sums["correct"] / sums["tokens"], "loss": loss}

    @classmethod
    def check_targets(cls, y: np.ndarray, where: str) -> np.ndarray:
        if y.ndim != 2 or not np.issubdtype(y.dtype, np.integer):
            raise ValueError(f"{where}: language-modelling targets must be int64 [N, T] token ids, got {y.dtype} {y.shape}")
        return y.astype(np.int64)

    def chance_loss(self) -> float | None:
        return math.log(self.info.num_classes)


TASKS: dict[str, type[Task]] = {task.name: task for task in (Classification, Regression, Multilabel, LanguageModeling)}


@cache
def task_class(name: str) -> type[Task]:
    """The :class:`Task` subclass ``data.task`` names (built-in or ``package.module:Name``)."""
    if name in TASKS:
        return TASKS[name]
    if not is_reference(name):
        raise ConfigError("data.task", f"unknown task {name!r}; choose one of {', '.join(TASKS)} or package.module:Name")
    value = import_reference(name, "data.task")
    if not (isinstance(value, type) and issubclass(value, Task)):
        raise ConfigError("data.task", f"{name} is not a subclass of fedray.Task (got {value!r})")
    return value


def build_task(config: RunConfig, info: Any) -> Task:
    """The run's task for dataset ``info``."""
    return task_class(config.data.task)(config, info)
