"""fedray's own one-line sweep progress (the default; ``fedray tune --verbose`` shows Tune's table):
a bar over the sweep's trials with how many run, how many errored and the best value so far."""

from __future__ import annotations

from typing import Any

from ray import tune
from tqdm.auto import tqdm

from fedray.layout import ERROR, RUNNING, STOPPED_EARLY, TERMINATED
from fedray.tune.results import SweepResults
from fedray.tune.summary import format_metric


class SweepProgress(tune.Callback):
    """Reads the statuses the :class:`SweepResults` callback (listed before it) has just written."""

    def __init__(self, results: SweepResults, num_trials: int) -> None:
        self.results = results
        self.num_trials = num_trials
        self.bar: tqdm | None = None
        self._shown: tuple | None = None

    def __getstate__(self) -> dict[str, Any]:  # rebuilt from its arguments on Tuner.restore (see SweepResults)
        return {"results": self.results, "num_trials": self.num_trials}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["results"], state["num_trials"])

    def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
        counts = self.results.counts()
        done = counts.get(TERMINATED, 0) + counts.get(STOPPED_EARLY, 0) + counts.get(ERROR, 0)
        best = self.results.best()
        shown = (done, counts.get(RUNNING, 0), counts.get(ERROR, 0), best)
        if shown == self._shown:
            return
        if self.bar is None:
            self.bar = tqdm(total=self.num_trials, desc="trials", unit="trial", dynamic_ncols=True)
        postfix = {"running": shown[1], "errored": shown[2]}
        if best is not None:
            postfix["best"] = f"{format_metric(self.results.spec.metric, best[1])} ({best[0]})"
        self.bar.set_postfix(postfix, refresh=False)
        self.bar.update(done - self.bar.n)
        self._shown = shown

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        self.on_step_end(0, trials)
        if self.bar is not None:
            self.bar.close()
            self.bar = None
