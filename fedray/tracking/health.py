"""Warnings the user must see, whatever shows the run: a round's non-finite updates, a client whose
training loss blows up while staying finite, a collapse of the evaluated accuracy (with differential
privacy on, naming its noise as a likely cause), and a run in which the systems model let no client
update through in any round (the model is the initial one).

:class:`HealthMonitor` (a default callback of every run) writes each as one ``warning: round N: ...``
line to the ``fedray.health`` logger: on stderr in a ``--quiet`` run and in a Ray Tune trial's log, and
above the progress bar when there is one (:class:`~fedray.tracking.progress.ProgressBar` routes the
logger through it).
"""

from __future__ import annotations

import logging
import math
import statistics
import sys
from typing import Any, Iterable

from fedray.config import RunConfig
from fedray.tracking.callbacks import Callback, RunContext


class _StderrNow(logging.StreamHandler):
    """A handler that writes to whatever ``sys.stderr`` is when a record comes (a notebook's, pytest's)."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _: Any) -> None:
        pass


#: Its own handler, not propagated: the warnings reach stderr whether or not (and however) the
#: process configured logging, in the CLI, a notebook or a Ray Tune trial.
logger = logging.getLogger("fedray.health")
logger.addHandler(_StderrNow())
logger.propagate = False

#: The evaluated metrics whose collapse the progress bar warns about.
ACCURACY_METRICS = ("test_accuracy", "personal_accuracy")


def collapsed(value: float, best: float) -> bool:
    """Whether an evaluation of ``value`` after a best of ``best`` is a collapse: half the best or
    below. A client update that blows up but stays finite gets past the non-finite guard and is
    aggregated; the next evaluation then shows it."""
    return value <= best / 2


#: A client's training loss this many times the cohort's median, and above
#: ``OUTLIER_GUESS_MULTIPLE`` × the loss of a uniform guess (ln C), is a blow-up the user must hear of.
OUTLIER_MEDIAN_RATIO = 10.0
OUTLIER_GUESS_MULTIPLE = 3.0


def client_loss_key(metric_names: Iterable[str], loss_term: str = "ce") -> str:
    """The client metric that is its training loss: the task's base loss ``loss_term`` (``ce`` for
    classification, :attr:`fedray.tasks.Task.loss_term`) where the algorithm reports it (its
    ``train_loss`` may hold terms that are no loss, such as FedDyn's proximal term), else ``train_loss``."""
    return loss_term if loss_term in set(metric_names) else "train_loss"


def loss_outliers(
    client_rows: list[dict[str, Any]], chance_loss: float | None, loss_term: str = "ce"
) -> tuple[str, float, list[tuple[int, float]]]:
    """The clients of one round whose local training loss is far above the rest: above
    ``OUTLIER_MEDIAN_RATIO`` × the median client's and above ``OUTLIER_GUESS_MULTIPLE`` × the task's
    ``chance_loss`` (ln C for C classes: an average probability under 1/C³ on the true class; None for
    tasks without one, :meth:`fedray.tasks.Task.chance_loss`), in the metric :func:`client_loss_key` names.
    Returns (that key, the median, [(client id, loss)], largest first).

    A client update that blows up but stays finite passes the non-finite guard and is aggregated;
    its client's loss shows it first. Chosen on 2,341 rounds of Fashion-MNIST runs: it fired only in
    the 6 runs that later collapsed or diverged, 2 to 20 rounds before. On 18 later runs it fired
    before each of their 6 failures and in 3 runs that recovered (docs/results/fmnist.md, "Warnings
    for finite blow-ups")."""
    key = client_loss_key((name for row in client_rows for name in row), loss_term)
    losses = [(int(row["client_id"]), float(row[key])) for row in client_rows if row.get(key) is not None and math.isfinite(row[key])]
    if len(losses) < 3:
        return key, math.nan, []
    median = statistics.median(loss for _, loss in losses)
    floor = max(OUTLIER_MEDIAN_RATIO * median, OUTLIER_GUESS_MULTIPLE * (chance_loss or 0.0))
    return key, median, sorted(((client, loss) for client, loss in losses if loss > floor), key=lambda item: -item[1])


class HealthMonitor(Callback):
    """Logs the warnings of each round (see the module docstring); reads the rows, changes nothing."""

    def __init__(self) -> None:
        self.best: dict[str, tuple[float, int]] = {}  # metric -> (best value, its round) in this process
        self.collapsed: set[str] = set()  # metrics whose last evaluation was a collapse (warned once)
        self.chance_loss: float | None = None
        self.loss_term = "ce"

    def on_run_start(self, run: RunContext) -> None:
        from fedray.tasks import build_task  # torch: imported by the run already, not by fedray.tracking

        task = build_task(run.config, run.data.info)
        self.chance_loss, self.loss_term = task.chance_loss(), task.loss_term

    def on_round_end(self, run: RunContext, row: dict[str, Any], client_rows: list[dict[str, Any]]) -> None:
        if row["excluded_updates"]:
            logger.warning(
                "warning: round %d: %d non-finite client update(s) excluded from aggregation", row["round"], row["excluded_updates"]
            )
        key, median, outliers = loss_outliers(client_rows, self.chance_loss, self.loss_term)
        if outliers:
            named = ", ".join(f"client {client} ({loss:.3g})" for client, loss in outliers[:3])
            logger.warning(
                f"warning: round {row['round']}: training {key} far above the median client's {median:.3g}: {named}"
                f"{' and more' if len(outliers) > 3 else ''}. A client update that blows up but stays finite is "
                f"aggregated and can derail the model; a lower train.lr (now {run.config.train.lr:g}) or a "
                f"train.grad_clip may keep it stable"
            )
        for metric in ACCURACY_METRICS:
            if row.get(metric) is not None:
                self._check_collapse(run, row, metric, row[metric])

    def _check_collapse(self, run: RunContext, row: dict[str, Any], metric: str, value: float) -> None:
        round = row["round"]
        best, best_round = self.best.get(metric, (value, round))
        if not collapsed(value, best):
            self.collapsed.discard(metric)
        elif metric not in self.collapsed:
            self.collapsed.add(metric)
            logger.warning(
                f"warning: round {round}: {metric} fell to {value:.4f} from {best:.4f} (round {best_round}): training "
                f"collapsed; {collapse_advice(run.config, row.get('dp_noise_multiplier'))}"
            )
        if value >= best:
            self.best[metric] = (value, round)

    def on_run_end(self, run: RunContext) -> None:
        rows = [row for row in run.history if "aggregated" in row]  # the systems model's rounds
        if rows and not any(row["aggregated"] for row in rows):
            logger.warning(
                f"warning: no client update was aggregated in any of the {len(rows)} rounds (nobody was online, or every "
                "selected client dropped out or was late): the model is the initial one; see systems.availability and systems.selection"
            )


def collapse_advice(config: RunConfig, noise_multiplier: float | None) -> str:
    """What may keep training stable. With differential privacy on, the noise added to the updates is
    as likely a cause as the learning rate: its multiplier z (the round row's, which a run calibrated
    to privacy.target_epsilon chose) and what lowers it are named first."""
    advice = f"a lower train.lr (now {config.train.lr:g}) or a train.grad_clip may keep it stable"
    if not config.privacy.enabled:
        return advice
    multiplier = "" if noise_multiplier is None else f" (noise multiplier z = {noise_multiplier:.3g})"
    return (
        f"differential privacy is on ({config.privacy.mechanism}): its noise{multiplier} may be the cause; a smaller "
        "privacy.noise_multiplier (or, when z is calibrated, a larger privacy.target_epsilon) or more clients per round "
        f"(train.clients_per_round, now {config.train.clients_per_round}) lowers it relative to the update; else {advice}"
    )
