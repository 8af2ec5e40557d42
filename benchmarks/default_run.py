"""The README's install-and-run, timed: ``fedray run`` with no arguments (FedAvg on the embedded digits
data, the default config) in a fresh process, as a new user runs it, from an empty working folder.

Raw output (:func:`raw_output.machine`'s provenance, the command line, the wall time of the whole
process and the run's ``summary.json``) goes to ``docs/results/raw/default_run.json`` (``--json FILE``
elsewhere). The README's figures for that command (its summary's final test accuracy and the seconds
it takes) are checked against that file by ``tests/docs/test_readme_figures.py``::

    python benchmarks/default_run.py            # ~20-25 s on 2 cores
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from raw_output import RAW, raw_arguments, raw_report, read_raw, write_raw  # noqa: E402

DEFAULT_JSON = RAW / "default_run.json"
COMMAND = ["fedray", "run"]


def measure() -> dict:
    """One ``fedray run`` in a fresh process and an empty folder: its wall time and its summary."""
    executable = shutil.which(COMMAND[0])
    if executable is None:
        raise SystemExit("default_run: no `fedray` on PATH; install fedray first (pip install -e .)")
    with tempfile.TemporaryDirectory(prefix="fedray-default-run-") as folder:
        started = time.perf_counter()
        done = subprocess.run([executable, *COMMAND[1:]], cwd=folder, capture_output=True, text=True)
        wall = time.perf_counter() - started
        if done.returncode != 0:
            raise SystemExit(f"default_run: `{' '.join(COMMAND)}` failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
        [summary] = Path(folder).glob("runs/*/summary.json")
        return {"command": " ".join(COMMAND), "wall_seconds": wall, "summary": json.loads(summary.read_text())}


def line(report: dict) -> str:
    """What the README quotes: the command's wall time and its final test accuracy."""
    return (
        f"`{report['command']}`: {report['wall_seconds']:.1f} s end to end, "
        f"final test acc. {100 * report['summary']['final_test_accuracy']:.2f}% ({report['date']}, {report['cpu_count']} cores)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    raw_arguments(parser, DEFAULT_JSON)
    args = parser.parse_args(argv)
    if args.table:
        print(line(read_raw(args.json)))
        return 0
    report = raw_report(args, argv)
    report.update(measure())
    write_raw(args.json, report)
    print(line(report))
    print(f"raw output in {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
