"""File names of a run directory and of a sweep directory: the on-disk contract that the runtime,
``fedray tune``, the dashboard and notebooks share (docs/tune.md, "The sweep directory").

Standard library only: the dashboard reads these folders without loading torch or Ray, and
:mod:`fedray.tracking` finds checkpoints without importing :mod:`fedray.runtime`, which imports it.
"""

import re
from pathlib import Path

# A run directory (written by ``fedray run``, and by each trial of a sweep).
SAVED_CONFIG_FILE = "config.yaml"  # the validated config the run started with
SUMMARY_FILE = "summary.json"  # written when the run finishes
RUN_INFO_FILE = "run_info.json"  # written when it starts: its algorithm and how it is evaluated ("personalised" or "global")
PARTITION_PLOT = "partition.png"
LEARNING_CURVE_PLOT = "learning_curve.png"
CHECKPOINTS_DIR = "checkpoints"  # checkpoints/round_<round, 6 digits>.pt (fedray.runtime.checkpoint)
RUN_ID_FILE = "run_id"  # a run whose client state lives outside it: its claim's id (fedray.runtime.state_store)
RESUMES_FILE = "resumes.json"  # each resume that changed the config: round, time, changes (fedray.runtime.resume)
STOPPED_FILE = "stopped.json"  # Ctrl-C or SIGTERM stopped the run: its last round and when; removed when it starts again
LOG_FILE = "log.txt"  # a sweep trial's log: its rounds, warnings and, if it failed, the traceback (fedray.tune.trial_log)

# A sweep directory (written by ``fedray tune``).
SWEEP_FILE = "sweep.yaml"  # the sweep spec, as given
META_FILE = "meta.json"  # the sweep's description and status
TRIALS_FILE = "trials.parquet"  # one row per trial
ROUNDS_FILE = "rounds.parquet"  # one row per trial per reported round
TRIALS_DIR = "trials"  # trials/<trial_id>/ is each trial's run directory

# Trial statuses in trials.parquet.
PENDING, RUNNING, TERMINATED, ERROR, STOPPED_EARLY = "PENDING", "RUNNING", "TERMINATED", "ERROR", "STOPPED_EARLY"


_CHECKPOINT_NAME = re.compile(r"^round_(\d+)\.pt$")


def checkpoint_path(run_dir: str | Path, round: int) -> Path:
    """Where the checkpoint of ``round`` lies in ``run_dir``."""
    return Path(run_dir) / CHECKPOINTS_DIR / f"round_{round:06d}.pt"


def list_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """(round, path) of every checkpoint in the run, oldest first."""
    directory = Path(run_dir) / CHECKPOINTS_DIR
    found = []
    for path in directory.glob("round_*.pt") if directory.is_dir() else []:
        match = _CHECKPOINT_NAME.match(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found)
