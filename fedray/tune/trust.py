"""A sweep directory is trusted input: ``fedray tune --resume DIR`` lets Ray Tune unpickle the files
under ``DIR/tune/`` (``tuner.pkl``, the experiment state, the searcher and callback states), and
unpickling runs code. So fedray records the SHA-256 digest of every one of those files it lets Tune
write (``meta.json``'s ``tune_state_sha256``, updated while the sweep runs and when it ends) and
refuses to resume a folder whose Tune state differs from what it recorded: a folder crafted by
someone else, or edited, is rejected before anything is unpickled.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from ray import tune

from fedray.config import ConfigError
from fedray.tune.results import read_meta, update_meta

DIGESTS_KEY = "tune_state_sha256"


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


def record_tune_state(sweep_dir: Path, experiment_dir: Path) -> None:
    update_meta(sweep_dir, **{DIGESTS_KEY: tune_state_digests(experiment_dir)})


def verify_tune_state(sweep_dir: Path, experiment_dir: Path) -> None:
    """Raise :class:`ConfigError` unless every Tune state file is one fedray recorded."""
    recorded = read_meta(sweep_dir).get(DIGESTS_KEY)
    if not isinstance(recorded, dict):
        raise ConfigError(
            f"{sweep_dir}: meta.json holds no digest of the Tune state, so fedray did not write it (or an older "
            "version did); resuming would unpickle it. If you trust this folder, pass --trust-tune-state"
        )
    current = tune_state_digests(experiment_dir)
    changed = sorted(name for name, digest in current.items() if recorded.get(name) != digest)
    if changed:
        shown = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
        raise ConfigError(
            f"{sweep_dir}: the Tune state was not written by fedray (unrecorded or changed: {shown}); resuming would "
            "unpickle it. If you trust this folder (e.g. the sweep was killed while Tune was saving), pass --trust-tune-state"
        )


class TuneStateRecorder(tune.Callback):
    """Records the Tune state's digests after every Tune step in which a state file changed (a cheap
    ``stat`` otherwise) and when the sweep ends. Tune saves its experiment state just before
    ``on_step_end`` and copies it into ``tune/`` in the background, so a copy that lands after one
    step is recorded at the next."""

    def __init__(self, sweep_dir: Path, experiment_dir: Path) -> None:
        self.sweep_dir = sweep_dir
        self.experiment_dir = experiment_dir
        self._last_stats: list[tuple[Any, ...]] | None = None

    def __getstate__(self) -> dict[str, Any]:  # rebuilt from its arguments on Tuner.restore (see SweepResults)
        return {"sweep_dir": self.sweep_dir, "experiment_dir": self.experiment_dir}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["sweep_dir"], state["experiment_dir"])

    def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
        stats = []
        for path in tune_state_files(self.experiment_dir):
            try:
                stat = path.stat()
            except FileNotFoundError:  # replaced by Tune between the listing and the stat
                continue
            stats.append((path, stat.st_mtime_ns, stat.st_size))
        if stats != self._last_stats:
            record_tune_state(self.sweep_dir, self.experiment_dir)
            self._last_stats = stats

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        record_tune_state(self.sweep_dir, self.experiment_dir)
