"""Checkpoint files: written atomically, verified by checksum, read without executing code
(``weights_only``).

A checkpoint is ``<run_dir>/checkpoints/round_<r>.pt``: a ``torch.save`` record ``{"format",
"round", "sha256", "payload"}`` whose ``payload`` is the serialised contents (server state,
client-state versions, round, config) as a byte tensor and ``sha256`` its SHA-256. Loading
recomputes the digest, so flipped bytes anywhere in the contents, which ``torch.load`` would read
as different weights without complaint, are reported. A file that cannot be read, fails the
checksum, or lacks what a checkpoint holds raises :class:`CheckpointError` naming the file and the
earlier checkpoints to fall back to.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import Any

import torch

from fedray.layout import checkpoint_path, list_checkpoints
from fedray.tracking.atomic import write_bytes_atomically

FORMAT_VERSION = 2
RECORD_KEYS = ("format", "round", "sha256", "payload")
REQUIRED_KEYS = ("round", "server_state", "state_versions")


class CheckpointError(RuntimeError):
    """A checkpoint is missing, truncated or corrupt."""

    fedray_exit_code = 2  # the CLI prints the message alone: the run directory given is unusable


def _serialize(obj: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def save_checkpoint(run_dir: str | Path, round: int, contents: dict[str, Any], keep: int) -> Path:
    """Write ``round``'s checkpoint atomically with the SHA-256 of its contents, then keep only the
    ``keep`` most recent ones."""
    path = checkpoint_path(run_dir, round)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = _serialize({"round": round, **contents})
    record = {
        "format": FORMAT_VERSION,
        "round": round,
        "sha256": hashlib.sha256(payload).hexdigest(),
        "payload": torch.frombuffer(bytearray(payload), dtype=torch.uint8),
    }
    write_bytes_atomically(path, _serialize(record))
    for _, old in list_checkpoints(run_dir)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """The contents of the checkpoint at ``path``, after checking its format and checksum."""
    path = Path(path)
    try:
        record = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint not found: {path}") from None
    except Exception as error:  # truncated zip, bad pickle, foreign object: all mean "corrupt"
        raise CheckpointError(_corrupt_message(path, _short(error))) from None
    missing = [key for key in RECORD_KEYS if not isinstance(record, dict) or key not in record]
    if missing:
        raise CheckpointError(_corrupt_message(path, f"not a fedray checkpoint of format {FORMAT_VERSION}: missing {', '.join(missing)}"))
    payload = record["payload"]
    if not (isinstance(payload, torch.Tensor) and payload.dtype == torch.uint8 and payload.dim() == 1):
        raise CheckpointError(_corrupt_message(path, "its payload is not a byte tensor"))
    data = payload.numpy().tobytes()
    if hashlib.sha256(data).hexdigest() != record["sha256"]:
        raise CheckpointError(_corrupt_message(path, "checksum mismatch: its contents changed after it was written"))
    try:
        contents = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as error:
        raise CheckpointError(_corrupt_message(path, _short(error))) from None
    missing = [key for key in REQUIRED_KEYS if not isinstance(contents, dict) or key not in contents]
    if missing:
        raise CheckpointError(_corrupt_message(path, f"missing {', '.join(missing)}"))
    return contents


def load_latest_checkpoint(run_dir: str | Path) -> dict[str, Any] | None:
    """The newest checkpoint of a run, or None if it has none yet."""
    checkpoints = list_checkpoints(run_dir)
    return load_checkpoint(checkpoints[-1][1]) if checkpoints else None


def _short(error: Exception) -> str:
    """The first line of an exception, cut to 200 characters (torch's messages run to pages)."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {text[:200]}"


def _corrupt_message(path: Path, reason: str) -> str:
    earlier = [p.name for _, p in list_checkpoints(path.parent.parent) if p != path]
    hint = (
        f" Earlier checkpoints: {', '.join(earlier)}; delete {path.name} to resume from the newest of them."
        if earlier
        else " No earlier checkpoint exists."
    )
    return f"checkpoint {path} is corrupt ({reason}).{hint}"
