"""A sweep directory is trusted input: ``fedray tune --resume DIR`` lets Ray Tune unpickle the files
under ``DIR/tune/`` (``tuner.pkl``, the experiment state, the searcher and callback states), and
unpickling runs code. So fedray records the SHA-256 digests of every one of those files it lets Tune
write (``meta.json``'s ``tune_state_sha256``: file name -> its last few digests, updated while the
sweep runs and when it ends) and refuses to resume a folder whose Tune state holds a file or a
version it did not record: a folder edited, copied in part or written by other software is rejected
before anything is unpickled. The digests live beside the state, so a folder forged together with
its ``meta.json`` passes: they are a check against mistakes, not a signature.

Tune saves its state into a staging directory on the driver and copies it into ``tune/`` in a
background thread. The recorder digests the staging copy in the same Tune step, so the copy is
recorded about when it lands rather than one step (0.1 s or more) later, and it keeps the previous
versions, so a driver killed before the copy lands leaves the old version, also accepted.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from ray import tune

from fedray.config import ConfigError
from fedray.tune.results import read_meta, update_meta

DIGESTS_KEY = "tune_state_sha256"
VERSIONS_KEPT = 3  # a file's digests accepted on resume: the versions in flight plus one to spare


def tune_state_files(experiment_dir: Path) -> list[Path]:
    """The files of Tune's experiment directory that a restore may unpickle: every file at its top
    level and every trial directory's ``*.pkl`` (``error.pkl``, ``params.pkl``)."""
    if not experiment_dir.is_dir():
        return []
    top = [path for path in experiment_dir.iterdir() if path.is_file()]
    return sorted(top + [path for path in experiment_dir.glob("*/*.pkl") if path.is_file()])


def tune_state_digests(experiment_dir: Path) -> dict[str, str]:
    digests = {}
    for path in tune_state_files(experiment_dir):
        try:
            digests[path.relative_to(experiment_dir).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
        except FileNotFoundError:  # a temporary file Tune renamed meanwhile
            continue
    return digests


def recorded_digests(sweep_dir: Path) -> dict[str, list[str]] | None:
    """File name -> the digests fedray accepts for it; ``None`` where ``meta.json`` holds none. A
    single digest per file (what sweeps recorded before the history was kept) reads as a list of one."""
    recorded = read_meta(sweep_dir).get(DIGESTS_KEY)
    if not isinstance(recorded, dict):
        return None
    return {name: [digests] if isinstance(digests, str) else list(digests) for name, digests in recorded.items()}


def record_tune_state(sweep_dir: Path, experiment_dir: Path, staging_dir: Path | None = None) -> None:
    """Add the current digests of ``experiment_dir``'s Tune state (and of ``staging_dir``'s, the
    copy Tune is about to sync into it) to the recorded ones, keeping each file's last
    ``VERSIONS_KEPT``."""
    accepted = recorded_digests(sweep_dir) or {}
    current = [tune_state_digests(experiment_dir)] + ([tune_state_digests(staging_dir)] if staging_dir else [])
    for digests in current:
        for name, digest in digests.items():
            versions = [d for d in accepted.get(name, []) if d != digest] + [digest]
            accepted[name] = versions[-VERSIONS_KEPT:]
    update_meta(sweep_dir, **{DIGESTS_KEY: accepted})


def verify_tune_state(sweep_dir: Path, experiment_dir: Path) -> None:
    """Raise :class:`ConfigError` unless every Tune state file is a version fedray recorded."""
    accepted = recorded_digests(sweep_dir)
    if accepted is None:
        raise ConfigError(
            str(sweep_dir),
            "meta.json holds no digest of the Tune state, so fedray did not write it (or an older "
            "version did); resuming would unpickle it. If you trust this folder, pass --trust-tune-state",
            within=None,
        )
    current = tune_state_digests(experiment_dir)
    changed = sorted(name for name, digest in current.items() if digest not in accepted.get(name, []))
    if changed:
        shown = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
        raise ConfigError(
            str(sweep_dir),
            f"the Tune state was not written by fedray (unrecorded or changed: {shown}); resuming would "
            "unpickle it. If you trust this folder (e.g. its driver was killed in the instant Tune was saving), pass "
            "--trust-tune-state",
            within=None,
        )


class TuneStateRecorder(tune.Callback):
    """Records the Tune state's digests after every Tune step in which a state file changed (a cheap
    ``stat`` otherwise) and when the sweep ends. Tune saves its experiment state into the driver's
    staging directory just before ``on_step_end`` and copies it into ``tune/`` in the background:
    the staging directory is read here too, so the copy is recorded in the step that made it, about
    when it lands, not a step later."""

    def __init__(self, sweep_dir: Path, experiment_dir: Path) -> None:
        self.sweep_dir = sweep_dir
        self.experiment_dir = experiment_dir
        self._last_stats: list[tuple[Any, ...]] | None = None

    def __getstate__(self) -> dict[str, Any]:  # rebuilt from its arguments on Tuner.restore (see SweepResults)
        return {"sweep_dir": self.sweep_dir, "experiment_dir": self.experiment_dir}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["sweep_dir"], state["experiment_dir"])

    def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
        # every trial's storage context names the same driver staging directory
        staging_dir = Path(trials[0].storage.experiment_driver_staging_path) if trials else None
        stats = []
        for path in tune_state_files(self.experiment_dir) + (tune_state_files(staging_dir) if staging_dir else []):
            try:
                stat = path.stat()
            except FileNotFoundError:  # replaced by Tune between the listing and the stat
                continue
            stats.append((path, stat.st_mtime_ns, stat.st_size))
        if stats != self._last_stats:
            record_tune_state(self.sweep_dir, self.experiment_dir, staging_dir)
            self._last_stats = stats

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        record_tune_state(self.sweep_dir, self.experiment_dir)
