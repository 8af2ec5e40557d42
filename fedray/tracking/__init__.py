"""Run tracking: metrics Parquet, TensorBoard, plots and progress, each a callback.

Each name is imported on first use, so ``from fedray.tracking import Callback`` does not load
pyarrow, tqdm or the plotting code."""

from __future__ import annotations

from fedray import lazy_exports

#: Public name -> the module that defines it.
_API = {
    "BUILTIN_CALLBACKS": "fedray.tracking.callbacks",
    "Callback": "fedray.tracking.callbacks",
    "RunContext": "fedray.tracking.callbacks",
    "callback_class": "fedray.tracking.callbacks",
    "config_callback_classes": "fedray.tracking.callbacks",
    "METRICS_FILE": "fedray.tracking.metrics_file",
    "MetricsError": "fedray.tracking.metrics_file",
    "MetricsParquet": "fedray.tracking.metrics_file",
    "read_metrics": "fedray.tracking.metrics_file",
    "read_metrics_table": "fedray.tracking.metrics_file",
    "write_table_atomically": "fedray.tracking.metrics_file",
    "Plots": "fedray.tracking.plots",
    "plot_learning_curve": "fedray.tracking.plots",
    "plot_partition": "fedray.tracking.plots",
    "HealthMonitor": "fedray.tracking.health",
    "ProgressBar": "fedray.tracking.progress",
    "TensorBoardLogger": "fedray.tracking.tensorboard",
}

__all__ = sorted(_API)


__getattr__, __dir__ = lazy_exports(globals(), _API)
