"""The Ray runtime: a server actor and a pool of client-worker actors (see docs/architecture.md).

Each name is imported on first use: ``fedray.runtime.ray_start`` (torch-free) can then be imported,
and a local Ray begun, before the rest of the runtime imports torch."""

from __future__ import annotations

from fedray import lazy_exports

#: Public name -> the module that defines it.
_API = {
    "CheckpointError": "fedray.runtime.checkpoint",
    "list_checkpoints": "fedray.layout",
    "load_checkpoint": "fedray.runtime.checkpoint",
    "RunError": "fedray.runtime.errors",
    "RunInterrupted": "fedray.runtime.errors",
    "TrainingDiverged": "fedray.runtime.errors",
    "UserCodeError": "fedray.runtime.errors",
    "RunSummary": "fedray.runtime.experiment",
    "prepare_data": "fedray.runtime.experiment",
    "resume_experiment": "fedray.runtime.experiment",
    "run_experiment": "fedray.runtime.experiment",
    "replay_client": "fedray.runtime.replay",  # re-execute one client's update of a round (fedray replay)
}

__all__ = sorted(_API)


__getattr__, __dir__ = lazy_exports(globals(), _API)
