"""Runs whose ``output.dir`` is a URI (``s3://bucket/runs``, ``gs://...``, ``file:///mnt/shared/runs``).

A run always writes to a local directory (checkpoints are written atomically with a rename, metrics
are rewritten every round: object stores support neither cheaply). When ``output.dir`` is a URI the
run directory is a *staging* directory, ``<output.staging_dir>/<run name>``, and :class:`StorageSync`
mirrors it to ``<output.dir>/<run name>`` through the pyarrow filesystem the URI names, after every
checkpoint and once more after ``summary.json`` (the run's last file). A run that crashes therefore
leaves its latest checkpoint at the URI; ``fedray run --resume <staging run dir>`` continues it and
keeps syncing.

Only files that changed since the last sync are copied, and files the run deleted (old checkpoints)
are deleted at the destination, so the destination mirrors the run directory. Per-client state of
stateful algorithms does not go through the staging directory: the workers write it straight to
``<output.dir>/<run name>/client_state`` (see :mod:`fedray.runtime.state_store`), which every node
reaches. Credentials come from the environment as pyarrow reads them (e.g. ``AWS_*`` for S3).
"""

from __future__ import annotations

import logging
import re
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any

import pyarrow.fs as pafs

from fedray.config import ConfigError
from fedray.config.schema import OutputConfig
from fedray.layout import list_checkpoints
from fedray.tracking.callbacks import Callback, RunContext

logger = logging.getLogger(__name__)

_URI = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")
STAGING_SUBDIR = "fedray-staging"


def is_uri(path: str) -> bool:
    """Whether ``output.dir`` names a filesystem URI (``scheme://...``) rather than a local path."""
    return bool(_URI.match(path))


def staging_root(output: OutputConfig) -> Path:
    """The local directory runs with a URI ``output.dir`` write to before they are synced."""
    if output.staging_dir is not None:
        if is_uri(output.staging_dir):
            raise ConfigError("output.staging_dir", f"must be a local path, got {output.staging_dir!r}")
        return Path(output.staging_dir)
    return Path(tempfile.gettempdir()) / STAGING_SUBDIR


class StorageSync(Callback):
    """Mirrors the local run directory to ``<output_uri>/<run name>`` after each checkpoint
    (and, called by the driver, after ``summary.json``)."""

    def __init__(self, output_uri: str) -> None:
        try:
            self.filesystem, self.root = pafs.FileSystem.from_uri(output_uri.rstrip("/"))
        except Exception as error:  # unknown scheme, missing credentials, unreachable bucket
            raise ConfigError(
                "output.dir",
                f"{output_uri!r} is not a filesystem pyarrow can open (local path, file://, s3://, gs://, hdfs://, abfs://): {error}",
            ) from None
        self.synced: dict[str, tuple[int, int]] = {}  # relative path -> (mtime_ns, size) last copied

    def destination(self, run_dir: Path) -> str:
        return f"{self.root}/{run_dir.name}"

    def on_round_end(self, run: RunContext, row: dict[str, Any], client_rows: list[dict[str, Any]]) -> None:
        checkpoints = list_checkpoints(run.run_dir)
        if checkpoints and checkpoints[-1][0] == row["round"]:
            self.sync(run.run_dir)

    def sync(self, run_dir: Path) -> None:
        """Copy new and changed files of ``run_dir`` to the destination; delete the ones it dropped."""
        destination = self.destination(run_dir)
        current: dict[str, tuple[int, int]] = {}
        for path in run_dir.rglob("*"):
            if path.is_file() and not path.name.endswith(".tmp"):  # *.tmp: a write in progress
                stat = path.stat()
                current[path.relative_to(run_dir).as_posix()] = (stat.st_mtime_ns, stat.st_size)
        changed = [name for name, stamp in current.items() if self.synced.get(name) != stamp]
        for parent in sorted({PurePosixPath(name).parent.as_posix() for name in changed}):
            self.filesystem.create_dir(destination if parent == "." else f"{destination}/{parent}", recursive=True)
        for name in changed:
            pafs.copy_files(
                str(run_dir / name),
                f"{destination}/{name}",
                source_filesystem=pafs.LocalFileSystem(),
                destination_filesystem=self.filesystem,
            )
        removed = [name for name in self.synced if name not in current]
        for name in removed:
            self.filesystem.delete_file(f"{destination}/{name}")
        self.synced = current
        logger.info("synced %s to %s (%d copied, %d deleted)", run_dir, destination, len(changed), len(removed))
