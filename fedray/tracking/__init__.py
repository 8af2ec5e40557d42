"""Run tracking: metrics Parquet, TensorBoard, plots and progress, each a callback."""

from fedray.tracking.callbacks import BUILTIN_CALLBACKS, Callback, RunContext, callback_class, config_callback_classes
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
    "BUILTIN_CALLBACKS",
    "METRICS_FILE",
    "Callback",
    "MetricsError",
    "MetricsParquet",
    "Plots",
    "ProgressBar",
    "RunContext",
    "TensorBoardLogger",
    "callback_class",
    "config_callback_classes",
    "plot_learning_curve",
    "plot_partition",
    "read_metrics",
    "read_metrics_table",
    "write_table_atomically",
]
