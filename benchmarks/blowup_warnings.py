"""Warnings for finite blow-ups on Fashion-MNIST (``docs/results/fmnist.md``, "Warnings for finite
blow-ups"): the table's runs in which ``fedray run``'s blow-up warning was first seen to fire, run again
on today's code, and the warning replayed over them and over any other run folders given
(``real_table.warning_replay``). One row per run goes to ``docs/results/fmnist_blowup_warnings.csv``,
with the provenance of the invocation that replayed it; the page's table is rendered from that CSV.

The runs (:data:`RERUNS`) are table entries at the learning rate that failed, each stopped one
evaluation after the round it failed in when it was found (tenth session): ``real_table.config_for``
gives their config, so they are the table's protocol. Their run folders go to ``runs/blowup_warnings``;
an interrupted invocation resumes them. ``--also FOLDER ...`` replays every run folder in those folders
too (e.g. ``runs/real_table``, the table's own runs, most of which never fail: they show where the
warning stays silent). A run replayed again replaces its row; the others are kept::

    python benchmarks/blowup_warnings.py                          # run (or resume) RERUNS, replay them
    python benchmarks/blowup_warnings.py --also runs/real_table   # and the table's runs on this machine
    python benchmarks/results_tables.py fmnist.md                 # the page's table from the CSV
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import real_table
from fmnist_tables import Part, markdown_table
from raw_output import PROVENANCE_COLUMNS, machine, provenance_columns

CSV = "fmnist_blowup_warnings.csv"
CSV_PATH = real_table.REPO / "docs" / "results" / CSV
RUNS_DIR = real_table.REPO / "runs" / "blowup_warnings"
REPLAY_FIELDS = ["run", "when_found", "rounds", "warned_rounds", "first_warning", "first_collapse", "last_round", "planned_rounds"]


@dataclass(frozen=True)
class Rerun:
    """Table entry ``algorithm`` × ``setting`` × ``seed`` at learning rate ``lr``, for ``rounds`` rounds."""

    algorithm: str
    setting: str
    seed: int
    lr: float
    rounds: int
    found: str  # what it did when it was found

    @property
    def name(self) -> str:
        return f"global-{self.algorithm}-{self.setting}-s{self.seed}-lr{self.lr:g}"


RERUNS = (
    Rerun("fedproto", "dir0.5", 1, 0.2, 45, "collapsed in round 40"),
    Rerun("scaffold", "dir0.1", 0, 0.1, 20, "diverged in round 17"),
    Rerun("scaffold", "dir0.1", 0, 0.05, 35, "collapsed in round 30"),
)


def run(rerun: Rerun, runs_dir: Path) -> Path:
    """Runs (or resumes, or reads back) ``rerun`` in ``runs_dir``; its run folder."""
    tuning = real_table.read_csv(real_table.TUNING_CSV)
    extra = [f"train.lr={rerun.lr}", f"train.rounds={rerun.rounds}", "resources.backend=local"]
    config = real_table.config_for(rerun.algorithm, rerun.setting, rerun.seed, extra, tuning)
    run_dir = runs_dir / rerun.name
    print(f"{rerun.name}: {rerun.rounds} rounds (found: {rerun.found})", file=sys.stderr, flush=True)
    real_table.run_or_resume(config, run_dir, real_table.GROUPS["global"])
    return run_dir


def record(run_dirs: list[Path], invocation: dict, path: Path = CSV_PATH) -> list[dict[str, str]]:
    """Replays the warning over ``run_dirs`` and writes their rows into the CSV at ``path`` (replacing a
    row of the same run, keeping the others), each with the provenance of ``invocation``
    (``raw_output.machine()``, taken before the runs) and a rerun's with what it did when it was found."""
    provenance = provenance_columns(invocation)
    found = {rerun.name: rerun.found for rerun in RERUNS}
    replayed = {
        r["run"]: {**r, "when_found": found.get(r["run"], ""), **provenance}
        for d in run_dirs
        if (r := real_table.warning_replay(d)) is not None
    }
    rows = [row for row in real_table.read_csv(path) if row["run"] not in replayed] + list(replayed.values())
    real_table.write_csv(path, REPLAY_FIELDS + PROVENANCE_COLUMNS, sorted(rows, key=lambda row: row["run"]))
    return rows


def warnings_table(results: Path) -> str:
    """The page's table from the CSV in ``results``: a line of totals, then a row per run."""
    rows = real_table.read_csv(results / CSV)
    warned = [r for r in rows if r["warned_rounds"]]
    commits = sorted({r["commit"][:7] for r in rows})
    totals = (
        f"\n{len(rows)} runs replayed ({sum(int(r['rounds']) for r in rows):,} rounds with client rows; replayed at "
        f"{', '.join(f'`{c}`' for c in commits)}); the warning fired in {len(warned)}.\n"
    )
    table = [
        [
            r["run"],
            r["when_found"] or "—",
            r["rounds"],
            r["first_warning"] or "—",
            r["warned_rounds"].replace(" ", ", ") or "—",
            r["first_collapse"] or "—",
            f"{r['last_round']} of {r['planned_rounds']}" if r["planned_rounds"] else r["last_round"],
        ]
        for r in sorted(rows, key=lambda r: (not r["warned_rounds"], r["run"]))
    ]
    return totals + markdown_table(
        ["run", "when found (tenth session)", "rounds", "first warning", "warned in rounds", "first collapse", "last round of planned"],
        table,
    )


PART = Part("blow-up warnings table", (CSV,), warnings_table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--also", nargs="+", type=Path, default=[], help="replay every run folder in these folders too")
    parser.add_argument("--runs-dir", type=Path, default=RUNS_DIR, help="the reruns' run folders")
    args = parser.parse_args(argv)
    missing = [folder for folder in args.also if not folder.is_dir()]
    if missing:
        print(f"error: --also: no such folder: {', '.join(map(str, missing))}", file=sys.stderr)
        return 2
    invocation = machine()
    run_dirs = [run(rerun, args.runs_dir) for rerun in RERUNS]
    run_dirs += sorted(d for folder in args.also for d in folder.iterdir() if d.is_dir())
    record(run_dirs, invocation)
    print(warnings_table(CSV_PATH.parent))
    return 0


if __name__ == "__main__":
    sys.exit(main())
