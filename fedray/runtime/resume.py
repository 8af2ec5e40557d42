"""What ``fedray run --resume`` lets change in a run's saved ``config.yaml``.

Every checkpoint holds the config it was written with. :func:`resume_experiment
<fedray.runtime.experiment.resume_experiment>` compares the run's ``config.yaml`` with the newest
checkpoint's config and refuses (:class:`~fedray.config.ConfigError`, naming the keys) a change to any
key that decides what the rounds compute: the data, model, algorithm, seed, training and
personalised-evaluation settings, and where the run's files and client state live. Those would
alter what already happened (rounds 1..r ran with the old values, and the metrics and the summary
would record the new ones as if they had applied from round 1) or what the checkpoint holds (a
model of another shape, client state the new location lacks).

Allowed are the keys of :data:`RESUMABLE_KEYS`: how far the run goes (``train.rounds``, up only),
how often it is evaluated and checkpointed, what it logs, and where it runs (``resources.*``: the
same config gives bit-identical results on either backend; another worker count or a GPU can change
the float rounding of the rounds after the resume, which is why every change is recorded). Each
resume that changed the config appends ``{"round", "time", "changes": {key: [before, after]}}`` to
the run directory's ``resumes.json``.
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from fedray.cluster import SUBMIT_ADDRESS_VARIABLE
from fedray.config import ConfigError
from fedray.layout import RESUMES_FILE, SUMMARY_FILE, list_checkpoints
from fedray.tracking import Callback, RunContext


#: Keys (or, ending in ".", sections) a resume may change; ``train.rounds`` may only grow.
RESUMABLE_KEYS = (
    "train.rounds",
    "eval.every",
    "checkpoint.every",
    "checkpoint.keep",
    "resources.",
    "output.tensorboard",
    "output.plots",
    "output.callbacks",
)
_UNSET = "(unset)"


@dataclass(frozen=True)
class ConfigChange:
    """One key whose value differs between a checkpoint's config and the run's ``config.yaml``."""

    key: str
    before: Any
    after: Any

    @property
    def allowed(self) -> bool:
        if self.key == "train.rounds":
            return self.before != _UNSET and self.after > self.before
        return any(self.key == key or (key.endswith(".") and self.key.startswith(key)) for key in RESUMABLE_KEYS)

    def describe(self) -> str:
        before, after = (str(value)[:60] for value in (self.before, self.after))
        return f"{self.key} ({before} → {after})"


def _flatten(mapping: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"train": {"lr": 0.1}}`` → ``{"train.lr": 0.1}`` (lists stay values)."""
    flat: dict[str, Any] = {}
    for key, value in mapping.items():
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def config_changes(checkpoint_config: dict[str, Any], config: dict[str, Any]) -> list[ConfigChange]:
    """The keys whose values differ between two configs (``RunConfig.to_dict()`` form), in order."""
    before, after = _flatten(checkpoint_config), _flatten(config)
    keys = list(dict.fromkeys([*before, *after]))
    return [
        ConfigChange(key, before.get(key, _UNSET), after.get(key, _UNSET))
        for key in keys
        if before.get(key, _UNSET) != after.get(key, _UNSET)
    ]


def resume_command(run_dir: str | Path) -> str:
    """The command that continues the run in ``run_dir``: ``fedray run --resume RUN_DIR``, or, in a job
    that ``fedray submit`` submitted, that command submitted to the same cluster, with the run
    directory's absolute path on the node the job ran on (the head node, which the next job runs on)."""
    address = os.environ.get(SUBMIT_ADDRESS_VARIABLE)
    if not address:
        return shlex.join(["fedray", "run", "--resume", str(run_dir)])
    return shlex.join(["fedray", "submit", "--address", address, "--", "run", "--resume", str(Path(run_dir).absolute())])


def check_unfinished(run_dir: str | Path, rounds: int) -> None:
    """Refuse to resume a run that already finished its ``rounds`` (``train.rounds`` of its
    ``config.yaml``): it has a checkpoint and a summary of that many rounds. Torch-free, so that
    ``fedray run --resume`` refuses it before importing torch or starting Ray."""
    run_dir = Path(run_dir)
    summary = run_dir / SUMMARY_FILE
    if list_checkpoints(run_dir) and summary.is_file() and json.loads(summary.read_text()).get("rounds") == rounds:
        raise ConfigError(None, f"{run_dir} already finished all {rounds} rounds", within=None)


def check_resumable(changes: list[ConfigChange], run_dir: Path, round: int) -> None:
    """Raise :class:`ConfigError` (one line, naming the keys) if a change may not be resumed."""
    refused = [change for change in changes if not change.allowed]
    if not refused:
        return
    shown = ", ".join(change.describe() for change in refused[:4]) + (f" and {len(refused) - 4} more" if len(refused) > 4 else "")
    raise ConfigError(
        str(run_dir / "config.yaml"),
        f"changed since the checkpoint of round {round}: {shown}; a resume "
        "continues the rounds already run, so only train.rounds (up), eval.every, checkpoint.*, resources.* and "
        "output.tensorboard/plots/callbacks may change: restore the values, or start a new run with them",
    )


class ResumeRecord(Callback):
    """Appends the config changes of a resume to the run directory's ``resumes.json`` when the
    resumed run starts its rounds."""

    def __init__(self, changes: list[ConfigChange]) -> None:
        self.changes = changes

    def on_run_start(self, run: RunContext) -> None:
        path = run.run_dir / RESUMES_FILE
        resumes = json.loads(path.read_text()) if path.is_file() else []
        resumes.append(
            {
                "round": run.start_round,
                "time": datetime.now().isoformat(timespec="seconds"),
                "changes": {change.key: [change.before, change.after] for change in self.changes},
            }
        )
        path.write_text(json.dumps(resumes, indent=2))
