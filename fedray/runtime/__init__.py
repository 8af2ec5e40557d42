"""The Ray runtime: a server actor and a pool of client-worker actors (see docs/architecture.md)."""

from fedray.runtime.checkpoint import CheckpointError, list_checkpoints, load_checkpoint
from fedray.runtime.experiment import (
    RunError,
    RunInterrupted,
    RunSummary,
    TrainingDiverged,
    prepare_data,
    resume_experiment,
    run_experiment,
)

__all__ = [
    "CheckpointError",
    "RunError",
    "RunInterrupted",
    "RunSummary",
    "TrainingDiverged",
    "list_checkpoints",
    "load_checkpoint",
    "prepare_data",
    "resume_experiment",
    "run_experiment",
]
