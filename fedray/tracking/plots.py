"""PNG figures of a run: the partition's per-client label distribution (at the start) and the
learning curves (refreshed at every checkpoint and at the end)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from fedray.config.schema import DataConfig
from fedray.layout import LEARNING_CURVE_PLOT, PARTITION_PLOT
from fedray.tasks import task_class
from fedray.tracking.callbacks import Callback, RunContext


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


PARTITION_PLOT_CLIENTS = 100  # clients shown in partition.png


def plot_partition(label_counts: np.ndarray, path: Path, title: str, num_clients: int | None = None, groups: str = "class") -> None:
    """Heat-map of ``label_counts`` [clients, groups] (at most 100 clients shown) of the first
    clients of ``num_clients`` (by default, of ``len(label_counts)``); ``groups`` names the columns
    (classes, or a regression's target deciles)."""
    plt = _pyplot()
    shown = label_counts[:PARTITION_PLOT_CLIENTS]
    num_clients = len(label_counts) if num_clients is None else num_clients
    fig, ax = plt.subplots(figsize=(8, max(3, 0.12 * len(shown) + 1.5)))
    image = ax.imshow(shown, aspect="auto", cmap="viridis", interpolation="nearest")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(groups)
    ax.set_ylabel("client" + (f" (first {len(shown)} of {num_clients})" if num_clients > len(shown) else ""))
    ax.set_title(title)
    fig.colorbar(image, ax=ax, label="samples")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_learning_curve(rows: list[dict[str, Any]], path: Path, title: str, headline: str = "accuracy") -> None:
    """The task's headline metric (``headline``: accuracy, rmse, micro_f1, perplexity), global and
    personalised, and train/test loss against the round."""
    plt = _pyplot()
    fig, (metric_ax, loss_ax) = plt.subplots(1, 2, figsize=(10, 4))
    curves = ((f"test_{headline}", metric_ax), (f"personal_{headline}", metric_ax), ("train_loss", loss_ax), ("test_loss", loss_ax))
    for key, ax in curves:
        points = [(r["round"], r[key]) for r in rows if r.get(key) is not None and np.isfinite(r[key])]
        if points:
            ax.plot(*zip(*points), label=key, marker="." if len(points) < 50 else None)
    for ax, label in ((metric_ax, headline), (loss_ax, "loss")):
        ax.set_xlabel("round")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def partition_description(data: DataConfig) -> str:
    """The partition and the parameter that shapes it, for a figure's title: ``α`` only where the
    partition draws from a Dirichlet (a natural or iid partition has none: its default ``data.alpha``
    would be misread as the run's)."""
    if data.partition in ("dirichlet", "dirichlet_equal_size"):
        long_tail = f", ρ={data.imbalance_ratio:g}" if data.partition == "dirichlet_equal_size" and data.imbalance_ratio > 1 else ""
        return f"{data.partition}, α={data.alpha:g}{long_tail}"
    if data.partition == "shards":
        return f"shards, {data.classes_per_client} classes per client"
    if data.partition == "quantity":
        return f"quantity, σ={data.quantity_sigma:g}"
    return data.partition


class Plots(Callback):
    def _title(self, run: RunContext) -> str:
        cfg = run.config
        return f"{cfg.algorithm.name} on {cfg.data.name} ({partition_description(cfg.data)}, {cfg.data.num_clients} clients)"

    def on_run_start(self, run: RunContext) -> None:
        counts = run.data.label_distribution(PARTITION_PLOT_CLIENTS)  # only those shown: 1,000,000 clients would take 80 MB
        if counts is not None:  # None: the task's targets have no labels to count (multilabel, language modelling)
            groups = task_class(run.config.data.task).partition_groups
            plot_partition(counts, run.run_dir / PARTITION_PLOT, self._title(run), run.data.num_clients, groups)

    def on_round_end(self, run: RunContext, row: dict[str, Any], client_rows: list[dict[str, Any]]) -> None:
        if row["round"] % run.config.checkpoint.every == 0:
            self._plot_curve(run)

    def on_run_end(self, run: RunContext) -> None:
        self._plot_curve(run)

    def _plot_curve(self, run: RunContext) -> None:
        plot_learning_curve(run.history, run.run_dir / LEARNING_CURVE_PLOT, self._title(run), task_class(run.config.data.task).headline)
