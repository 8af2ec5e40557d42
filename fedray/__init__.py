"""fedray: federated-learning simulation on Ray.

The Python API, for notebooks and scripts (``import fedray`` is cheap: each name is imported on
first use, so neither torch nor Ray is loaded before you need them)::

    import fedray

    config = fedray.load_config("examples/fedprox_digits.yaml", ["train.rounds=10"])  # or:
    config = fedray.build_config({"algorithm": {"name": "mylab.fedavgm:FedAvgM", "server_momentum": 0.9}})
    summary = fedray.run_experiment(config)                 # one simulation -> RunSummary
    rounds = fedray.read_metrics(summary.run_dir)           # its metrics.parquet rows (scope "round")
    outcome = fedray.run_sweep(fedray.load_sweep("tune_configs/fedprox.yaml"))   # a Ray Tune sweep

Writing an algorithm: subclass :class:`Algorithm` (with its ``Params``, :class:`ClientContext`,
:class:`ClientUpdate`, :class:`RoundResults`); plugging in logging: subclass :class:`Callback`. See
docs/writing_an_algorithm.md. Your own model: any ``nn.Module`` as ``model.name: package.module:Name``,
or a :class:`FedModel` subclass for full control (docs/guide/your_model.md). Your own loss and metrics:
a :class:`Task` subclass as ``data.task: package.module:Name`` (docs/guide/tasks.md).
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

__version__ = "0.1.0"

#: Public name -> the module that defines it.
_API = {
    "load_config": "fedray.plugins",  # read a YAML config + overrides, validate all of it
    "build_config": "fedray.plugins",  # the same from a mapping
    "RunConfig": "fedray.config",
    "ConfigError": "fedray.config",
    "run_experiment": "fedray.runtime",  # run one simulation
    "resume_experiment": "fedray.runtime",  # continue one from its last checkpoint
    "RunSummary": "fedray.runtime",
    "load_sweep": "fedray.tune",  # read and validate a sweep file
    "run_sweep": "fedray.tune",  # run it with Ray Tune
    "read_metrics": "fedray.tracking",  # a run's metrics.parquet rows
    "Algorithm": "fedray.algorithms",
    "AlgorithmParams": "fedray.algorithms",
    "ClientContext": "fedray.algorithms",
    "ClientUpdate": "fedray.algorithms",
    "RoundResults": "fedray.algorithms",
    "FedModel": "fedray.models",  # subclass it for full control of a model (docs/guide/your_model.md)
    "Task": "fedray.tasks",  # subclass it for your own loss and metrics, data.task (docs/guide/tasks.md)
    "Callback": "fedray.tracking",
    "RunContext": "fedray.tracking",
}

__all__ = ["__version__", *_API]


def lazy_exports(namespace: dict[str, Any], api: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__`` for ``api`` (public name -> the module that defines
    it): a name is imported on first use and kept in the package's ``namespace`` (so later look-ups
    skip ``__getattr__``)."""

    def __getattr__(name: str) -> Any:
        if name in api:
            value = getattr(importlib.import_module(api[name]), name)
            namespace[name] = value
            return value
        raise AttributeError(f"module {namespace['__name__']!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(namespace["__all__"])

    return __getattr__, __dir__


__getattr__, __dir__ = lazy_exports(globals(), _API)
