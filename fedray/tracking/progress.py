"""A progress bar over rounds (round, accuracy, loss, seconds, the privacy ε spent), with the run's health warnings
(:mod:`fedray.tracking.health`) written above it."""

from __future__ import annotations

import logging
from contextlib import ExitStack
from typing import Any

from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from fedray.tracking.callbacks import Callback, RunContext


#: The evaluated metrics the bar shows when a row has them, with their labels (data.task decides which a row has).
SHOWN_METRICS = (
    ("test_accuracy", "acc"),
    ("personal_accuracy", "p-acc"),
    ("test_rmse", "rmse"),
    ("test_r2", "r2"),
    ("personal_rmse", "p-rmse"),
    ("test_micro_f1", "f1"),
    ("personal_micro_f1", "p-f1"),
    ("test_perplexity", "ppl"),
    ("personal_perplexity", "p-ppl"),
)


def round_postfix(row: dict[str, Any]) -> dict[str, str]:
    """What the progress bar shows of a round's row (and a sweep trial's ``log.txt``, :mod:`fedray.tune.trial_log`):
    the training loss, the seconds it took, the task's headline metrics evaluated (accuracy, RMSE and R²,
    micro-F1, perplexity; global and personalised) and the privacy ε spent so far."""
    postfix = {"loss": f"{row['train_loss']:.3f}", "s/round": f"{row['seconds']:.2f}"}
    for key, label in SHOWN_METRICS:
        if row.get(key) is not None:
            postfix[label] = f"{row[key]:.4f}"
    if "dp_epsilon" in row:  # privacy.mechanism: the ε spent so far (docs/guide/privacy.md)
        postfix["ε"] = f"{row['dp_epsilon']:.3g}"
    return postfix


class ProgressBar(Callback):
    def __init__(self) -> None:
        self.bar: tqdm | None = None
        self.redirect = ExitStack()

    def on_run_start(self, run: RunContext) -> None:
        self.bar = tqdm(total=run.config.train.rounds, initial=run.start_round, desc="rounds", unit="round", dynamic_ncols=True)
        self.redirect.enter_context(logging_redirect_tqdm([logging.getLogger("fedray.health")]))

    def on_round_end(self, run: RunContext, row: dict[str, Any], client_rows: list[dict[str, Any]]) -> None:
        self.bar.set_postfix(round_postfix(row), refresh=False)
        self.bar.update(1)

    def on_run_end(self, run: RunContext) -> None:
        self.redirect.close()
        self.bar.close()
