"""Atomic file writes: the bytes go to ``<name>.tmp`` beside the target, are fsync-ed, then renamed
over it, so a reader (a resume, the dashboard, a notebook) sees the old file or the new one, never
half of one. A failed write removes its temporary file; a full disk is reported as such.

Callers serialise into memory first (``torch.save`` / ``pyarrow`` into a buffer), so every disk
error surfaces here as an ``OSError`` with its errno instead of as a serialiser's own message
(``torch.save`` reports a full disk as ``RuntimeError ... unexpected pos``).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

TEMPORARY_SUFFIX = ".tmp"


class DiskFullError(OSError):
    """No space (or quota) left on the device a run writes to."""

    fedray_exit_code = 1  # the CLI prints the message alone

    def __str__(self) -> str:
        return f"no space left on device while writing {self.filename}"


def temporary_path(path: Path) -> Path:
    return path.with_name(path.name + TEMPORARY_SUFFIX)


def write_bytes_atomically(path: str | Path, data: bytes | memoryview) -> None:
    """Write ``data`` to ``path`` atomically (temporary file, fsync, rename); on any failure the
    temporary file is removed and ``path`` is left as it was."""
    path = Path(path)
    temporary = temporary_path(path)
    try:
        with open(temporary, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException as error:
        temporary.unlink(missing_ok=True)
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFullError(error.errno, os.strerror(error.errno), str(path)) from None
        raise
