"""Hyperparameter sweeps with Ray Tune: one trial = one full simulation in its own placement group.

- :mod:`.spec`: the sweep file (schema, loading, command-line changes, validation before Ray starts);
- :mod:`.trainable`: the trial (resources, per-round reporting, checkpoints, restore, PBT clones);
- :mod:`.pool`: a trial process's warm server and workers, reset for the next trial (``reuse_workers``);
- :mod:`.schedulers`: FIFO / ASHA / PBT, and ASHA's state saved with Tune's experiment state;
- :mod:`.results`: the sweep directory's ``trials.parquet`` / ``rounds.parquet`` / ``meta.json``;
- :mod:`.trust`: digests of the Tune state, checked before ``--resume`` unpickles it;
- :mod:`.sweep`: run and resume; :mod:`.progress`: the progress line; :mod:`.summary`: the tables
  printed at the end.

See docs/tune.md for the sweep file format and the sweep directory contract.
"""

from fedray.tune.spec import SweepSpec, load_sweep, parse_sweep

__all__ = ["SweepSpec", "load_sweep", "parse_sweep", "resume_sweep", "run_sweep"]


def __getattr__(name: str):
    # run_sweep / resume_sweep import Ray Tune; keep `import fedray.tune` (and sweep-file validation) light
    if name in ("run_sweep", "resume_sweep"):
        from fedray.tune import sweep

        return getattr(sweep, name)
    raise AttributeError(name)
