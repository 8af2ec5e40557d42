"""A progress bar over rounds (round, accuracy, loss, seconds) and warnings the user must see."""

from __future__ import annotations

from typing import Any

from tqdm.auto import tqdm

from fedray.tracking.callbacks import Callback, RunContext

#: The evaluated metrics whose collapse the progress bar warns about.
ACCURACY_METRICS = ("test_accuracy", "personal_accuracy")


def collapsed(value: float, best: float) -> bool:
    """Whether an evaluation of ``value`` after a best of ``best`` is a collapse: half the best or
    below. A client update that blows up but stays finite gets past the non-finite guard and is
    aggregated; the next evaluation then shows it."""
    return value <= best / 2


class ProgressBar(Callback):
    def __init__(self) -> None:
        self.bar: tqdm | None = None
        self.best: dict[str, tuple[float, int]] = {}  # metric -> (best value, its round) in this process
        self.collapsed: set[str] = set()  # metrics whose last evaluation was a collapse (warned once)

    def on_run_start(self, run: RunContext) -> None:
        self.bar = tqdm(total=run.config.train.rounds, initial=run.start_round, desc="rounds", unit="round", dynamic_ncols=True)

    def on_round_end(self, run: RunContext, row: dict[str, Any], client_rows: list[dict[str, Any]]) -> None:
        postfix = {"loss": f"{row['train_loss']:.3f}", "s/round": f"{row['seconds']:.2f}"}
        if "test_accuracy" in row:
            postfix["acc"] = f"{row['test_accuracy']:.4f}"
        if "personal_accuracy" in row:
            postfix["p-acc"] = f"{row['personal_accuracy']:.4f}"
        self.bar.set_postfix(postfix, refresh=False)
        self.bar.update(1)
        if row["excluded_updates"]:
            self.bar.write(f"warning: round {row['round']}: {row['excluded_updates']} non-finite client update(s) excluded from aggregation")
        for metric in ACCURACY_METRICS:
            if row.get(metric) is not None:
                self._check_collapse(run, row["round"], metric, row[metric])

    def _check_collapse(self, run: RunContext, round: int, metric: str, value: float) -> None:
        best, best_round = self.best.get(metric, (value, round))
        if not collapsed(value, best):
            self.collapsed.discard(metric)
        elif metric not in self.collapsed:
            self.collapsed.add(metric)
            self.bar.write(
                f"warning: round {round}: {metric} fell to {value:.4f} from {best:.4f} (round {best_round}): training "
                f"collapsed; a lower train.lr (now {run.config.train.lr:g}) or a train.grad_clip may keep it stable"
            )
        if value >= best:
            self.best[metric] = (value, round)

    def on_run_end(self, run: RunContext) -> None:
        self.bar.close()
