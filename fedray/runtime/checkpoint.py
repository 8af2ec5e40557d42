"""Checkpoint files: written atomically, read without executing code (``weights_only``).

A checkpoint is ``<run_dir>/checkpoints/round_<r>.pt`` holding the server state, the client-state
versions and the round. A file that cannot be read, or lacks what a checkpoint holds, raises
:class:`CheckpointError` naming the file and the earlier checkpoints to fall back to.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch

FORMAT_VERSION = 1
_NAME = re.compile(r"^round_(\d+)\.pt$")
REQUIRED_KEYS = ("format", "round", "server_state", "state_versions")


class CheckpointError(RuntimeError):
    """A checkpoint is missing, truncated or corrupt."""


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def list_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """(round, path) of every checkpoint in the run, oldest first."""
    directory = checkpoint_dir(run_dir)
    found = []
    for path in directory.glob("round_*.pt") if directory.is_dir() else []:
        match = _NAME.match(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found)


def save_checkpoint(run_dir: str | Path, round: int, contents: dict[str, Any], keep: int) -> Path:
    """Write ``round``'s checkpoint atomically (temporary file, fsync, rename), then keep only the
    ``keep`` most recent ones."""
    directory = checkpoint_dir(run_dir)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"round_{round:06d}.pt"
    temporary = path.with_suffix(".pt.tmp")
    with open(temporary, "wb") as handle:
        torch.save({"format": FORMAT_VERSION, "round": round, **contents}, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    for _, old in list_checkpoints(run_dir)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        contents = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint not found: {path}") from None
    except Exception as error:  # truncated zip, bad pickle, foreign object: all mean "corrupt"
        raise CheckpointError(_corrupt_message(path, f"{type(error).__name__}: {error}")) from None
    missing = [key for key in REQUIRED_KEYS if not isinstance(contents, dict) or key not in contents]
    if missing:
        raise CheckpointError(_corrupt_message(path, f"missing {', '.join(missing)}"))
    return contents


def load_latest_checkpoint(run_dir: str | Path) -> dict[str, Any] | None:
    """The newest checkpoint of a run, or None if it has none yet."""
    checkpoints = list_checkpoints(run_dir)
    return load_checkpoint(checkpoints[-1][1]) if checkpoints else None


def _corrupt_message(path: Path, reason: str) -> str:
    earlier = [p.name for _, p in list_checkpoints(path.parent.parent) if p != path]
    hint = (
        f" Earlier checkpoints: {', '.join(earlier)}; delete {path.name} to resume from the newest of them."
        if earlier
        else " No earlier checkpoint exists."
    )
    return f"checkpoint {path} is corrupt ({reason}).{hint}"
