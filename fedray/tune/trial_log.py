"""Each sweep trial's ``log.txt`` in its run directory: what ``fedray run`` shows of a run, kept in a file,
because a trial runs in a Ray actor whose output the user never sees whole.

One line per event, each with its time: the trial's start (or its restart from a checkpoint), one line per
round with what the progress bar shows (:func:`fedray.tracking.progress.round_postfix`), the run's health
warnings (the ``fedray.health`` logger), the warnings of fedray's other loggers in the trial's process (the
``fedray`` logger: a round nobody could join, ..., the server actor's relayed to it by
:class:`~fedray.runtime.server.RemoteServer`) and Python warnings, the end of the simulation, and, when
the trial fails, the whole traceback. Warnings still reach stderr as before. The file is appended to, so a retried or resumed trial keeps its earlier lines,
and every line is flushed when written, so ``fedray dashboard`` shows it while the trial runs.
"""

from __future__ import annotations

import logging
import traceback
import warnings
from pathlib import Path
from types import TracebackType
from typing import Any

from fedray.layout import LOG_FILE
from fedray.tracking import Callback, RunContext
from fedray.tracking.health import logger as health_logger
from fedray.tracking.progress import round_postfix

#: The trial's own lines; not propagated, so they reach only the trial's file.
logger = logging.getLogger("fedray.trial")
logger.propagate = False
package_logger = logging.getLogger("fedray")
LINE_FORMAT = logging.Formatter("%(asctime)s %(message)s", "%Y-%m-%d %H:%M:%S")


class TrialLog(Callback):
    """A callback that writes the trial's rounds to ``run_dir/log.txt``, and a context manager that, while
    open, also writes the run's health warnings and Python warnings there, and the traceback of an
    exception that leaves it."""

    def __init__(self, run_dir: Path, trial_id: str) -> None:
        self.path = Path(run_dir) / LOG_FILE
        self.trial_id = trial_id
        self.handler: logging.Handler | None = None
        self.last_resort: logging.Handler | None = None
        self.shown_warning: Any = None

    def __enter__(self) -> TrialLog:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.handler = logging.FileHandler(self.path, mode="a", encoding="utf-8")
        self.handler.setFormatter(LINE_FORMAT)
        self.last_resort = None if package_logger.hasHandlers() else logging.lastResort
        if self.last_resort is not None:  # what printed fedray's warnings on stderr when no handler was set: keep it so
            package_logger.addHandler(self.last_resort)
        for source in (logger, health_logger, package_logger):
            source.addHandler(self.handler)
        logger.setLevel(logging.INFO)
        self.shown_warning = warnings.showwarning
        warnings.showwarning = self._show_warning
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        if isinstance(error, SystemExit):  # how Ray Tune ends a trial its scheduler stops (tune.report exits)
            logger.info("Ray Tune ended the trial (its scheduler stopped it, or the sweep is ending)")
        elif error is not None:
            self.failed(error)
        warnings.showwarning = self.shown_warning
        for source in (logger, health_logger, package_logger):
            source.removeHandler(self.handler)
        if self.last_resort is not None:
            package_logger.removeHandler(self.last_resort)
        self.handler.close()

    def failed(self, error: BaseException) -> None:
        """Write the traceback of ``error``, the exception that ends the trial."""
        lines = "".join(traceback.format_exception(type(error), error, error.__traceback__)).rstrip()
        logger.error("the trial failed:\n%s", lines)

    def _show_warning(self, message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        logger.warning("warning: %s", warnings.formatwarning(message, category, filename, lineno, line).strip())
        self.shown_warning(message, category, filename, lineno, file, line)

    def on_run_start(self, run: RunContext) -> None:
        where = f"from its checkpoint of round {run.start_round}" if run.start_round else "from round 1"
        logger.info("trial %s started %s of %d, in %s", self.trial_id, where, run.config.train.rounds, run.run_dir.name)

    def on_round_end(self, run: RunContext, row: dict[str, Any], client_rows: list[dict[str, Any]]) -> None:
        postfix = ", ".join(f"{name}={value}" for name, value in round_postfix(row).items())
        logger.info("round %d/%d: %s", row["round"], run.config.train.rounds, postfix)

    def on_run_end(self, run: RunContext) -> None:
        last = run.history[-1]["round"] if run.history else run.start_round
        logger.info("the simulation ended after round %d of %d", last, run.config.train.rounds)

    def summary(self, summary: Any) -> None:
        """The last line: the final and best test accuracy (as ``fedray run`` prints them) and the run's seconds."""

        def percent(value: float | None) -> str:
            return "n/a" if value is None else f"{100 * value:.2f}%"

        logger.info(
            "finished: final test acc. %s, best %s (round %s), %.1f s",
            percent(summary.final_test_accuracy),
            percent(summary.best_test_accuracy),
            summary.best_round,
            summary.seconds,
        )
