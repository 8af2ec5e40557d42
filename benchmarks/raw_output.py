"""A benchmark's raw output in ``docs/results/raw/``: its provenance (:func:`machine`: commit, versions,
machine, date, load), its command line, and ``--json`` / ``--table`` to write it and to render its
Markdown table from it again (``benchmarks/results_tables.py`` checks docs/benchmarks.md's generated
tables against those files). It imports no other benchmark, so that every script can use it:
w1_overhead.py too, which vectorized.py imports.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

import torch

REPO = Path(__file__).resolve().parent.parent
#: Where the committed raw output of docs/benchmarks.md's generated tables lies.
RAW = REPO / "docs" / "results" / "raw"


def machine() -> dict:
    """Provenance for a raw JSON. ``FEDRAY_COMMIT``, where set, names the commit (a copy of the tree on
    a GPU host may carry no ``.git``, or a stale one), and whether the tree was modified is then unknown
    (None); otherwise git says both."""
    named = os.environ.get("FEDRAY_COMMIT")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True).stdout
    from_git = not named and head.returncode == 0
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": head.stdout.strip() if from_git else named or "",
        "working_tree_modified": bool(dirty.strip()) if from_git else None,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_model": cpu_model(),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_count": os.cpu_count(),
        "load_average_at_start": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }


#: The part of :func:`machine` a results CSV repeats on each row (a row may come from another machine or commit).
PROVENANCE_COLUMNS = ["commit", "working_tree_modified", "torch", "python", "cpu_model", "date"]


def provenance_columns(provenance: dict) -> dict:
    """:data:`PROVENANCE_COLUMNS` of ``provenance`` (a :func:`machine`), for one row of a results CSV."""
    return {column: provenance[column] for column in PROVENANCE_COLUMNS}


def cpu_model() -> str | None:
    """The CPU's model name (Linux's ``/proc/cpuinfo``; None elsewhere). With torch's CPU capability
    (the vector instructions its kernels use), it tells runs on another machine apart: the same code
    and torch build can round differently there."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return None
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), None)


def raw_arguments(parser: argparse.ArgumentParser, default: Path) -> None:
    """A raw-output benchmark's ``--json FILE`` (default ``default``) and ``--table`` (print the
    Markdown table of ``--json`` and measure nothing)."""
    parser.add_argument("--json", type=Path, default=default, help=f"raw output (default {default.relative_to(REPO)})")
    parser.add_argument("--table", action="store_true", help="print the Markdown table of --json and measure nothing")


def raw_parser(description: str, default: Path, each: str) -> argparse.ArgumentParser:
    """The parser of a benchmark that measures its sides ``--repeats`` times (runs of each ``each``), with
    :func:`raw_arguments`."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help=f"runs of each {each} (median reported; default 3)")
    raw_arguments(parser, default)
    return parser


def raw_report(args: argparse.Namespace, argv: list[str] | None) -> dict:
    """The start of a benchmark's raw JSON, taken before it measures: :func:`machine`'s provenance, the
    command line as given (``argv``, or this process's) and every argument's value, defaults included."""
    values = {name: str(value) if isinstance(value, Path) else value for name, value in vars(args).items()}
    return {**machine(), "argv": list(sys.argv[1:] if argv is None else argv), "args": values}


def write_raw(path: Path, report: dict) -> None:
    """Writes ``report`` (begun by :func:`raw_report`) to ``path`` as indented JSON, with the load
    average at the end."""
    report["load_average_at_end"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")


def read_raw(path: Path) -> dict:
    """A raw JSON written by :func:`write_raw`."""
    return json.loads(path.read_text())


def measure_or_render(
    parser: argparse.ArgumentParser, argv: list[str] | None, measure: Callable[[argparse.Namespace], dict], table: Callable[[dict], str]
) -> dict | None:
    """The ``main`` of a benchmark whose parser has :func:`raw_arguments`: with ``--table``, prints
    ``table`` of the raw JSON ``--json`` and returns None; otherwise measures (``measure(args)`` gives
    the report's entries beside its provenance), writes the raw JSON to ``--json``, prints its table
    and returns the report."""
    args = parser.parse_args(argv)
    if args.table:
        print(table(read_raw(args.json)))
        return None
    report = raw_report(args, argv)
    report.update(measure(args))
    write_raw(args.json, report)
    print(table(report))
    print(f"raw output in {args.json}")
    return report


def median_cell(values: Sequence[float], decimals: int, scale: float = 1.0, unit: str = "") -> str:
    """A table cell for repeated measurements: their median × ``scale`` to ``decimals`` places, then
    ``unit``, then the range (min–max) in brackets where it shows (not for one value, nor for equal ones)."""
    low, middle, high = (f"{scale * value:.{decimals}f}" for value in (min(values), statistics.median(values), max(values)))
    return f"{middle}{unit}" + (f" ({low}–{high})" if low != high else "")
