"""Run tracking: metrics Parquet, TensorBoard, plots and progress, each a callback."""

from fedray.tracking.callbacks import Callback, RunContext
from fedray.tracking.metrics_file import (
    METRICS_FILE,
    MetricsError,
    MetricsParquet,
    read_metrics,
    read_metrics_table,
    write_table_atomically,
)
from fedray.tracking.plots import Plots, plot_learning_curve, plot_partition
from fedray.tracking.progress import ProgressBar
from fedray.tracking.tensorboard import TensorBoardLogger

__all__ = [
    "METRICS_FILE",
    "Callback",
    "MetricsError",
    "MetricsParquet",
    "Plots",
    "ProgressBar",
    "RunContext",
    "TensorBoardLogger",
    "plot_learning_curve",
    "plot_partition",
    "read_metrics",
    "read_metrics_table",
    "write_table_atomically",
]
