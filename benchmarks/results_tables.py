"""Every generated table in ``docs/results/`` and ``docs/benchmarks.md`` regenerated from its committed
raw file, training and timing nothing.

Each entry of ``TABLES`` is the generated part of one page: the table a results script wrote, rendered
again by that script's own function from the raw file it wrote next to the page (``digits_table.py``'s
per-run rows, ``digits_summaries.py``'s tables gathering cells of those CSVs, ``real_table.py --report``'s
entries, curves and tuning, ``fmnist_claims.py``'s claims table and ``blowup_warnings.py``'s replays of fmnist.md, ``fmnist_tables.py``'s investigations of
fmnist.md (FedSKC's switches, the paper-optimiser runs, the Hetero-SSFL sweep), ``privacy_utility_fmnist.py``'s cells, ``compression_table.py``'s
rounds, ``modalities_table.py``'s runs, ``threats_table.py``'s trials, ``secagg_dp_table.py``'s runs)
or, for ``docs/benchmarks.md``, from the raw JSON it wrote to ``docs/results/raw/`` (``tasks_table.py``'s
tables, ``gpu_check.py``'s H200 invocations and fractional workers, and each timing script's ``--table``:
peers/run_peers, w1_overhead, startup, config_errors, user_model, service_idle_cost, parallel_efficiency,
sweep_throughput, long_run, scale, client_state_scale, suite_time). The prose around a part is kept. Every
other table of those pages is in ``NOT_GENERATED`` with the reason it is not regenerated here
(docs/benchmarks.md has none: its figures measured before raw output was kept are on
docs/benchmarks_history.md), and a page with a table in neither fails the check::

    python benchmarks/results_tables.py            # rewrite each part that differs from its raw file
    python benchmarks/results_tables.py --check    # compare only: exit 1 naming each part that differs
    python benchmarks/results_tables.py --check baselines.md   # one page (the Fashion-MNIST pages take ~10 s)
    python benchmarks/results_tables.py --check benchmarks.md  # docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import difflib
import functools
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Callable

import client_state_scale
import compression_table
import config_errors
import digits_summaries
import blowup_warnings
import digits_table
import fmnist_claims
import fmnist_tables
import gpu_check
import long_run
import modalities_table
import parallel_efficiency
import privacy_utility_fmnist
import real_table
import scale
import secagg_dp_table
import service_idle_cost
import startup
import suite_time
import sweep_throughput
import tasks_table
import threats_table
import user_model
import w1_overhead
from peers import run_peers

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "docs" / "results"
#: docs/benchmarks.md, relative to the results folder: the one page outside it with generated tables.
BENCHMARKS = "../benchmarks.md"
#: A generated part's place in its page: (page text, new part, page path) -> the page with the new part.
Splice = Callable[[str, str, Path], str]
#: The first line of the part ``digits_table.table_markdown`` writes.
METRIC_LINE = "Metric: `"
#: A Markdown table's delimiter row (``|---|---|``), which every table has once, below its header.
DELIMITER_ROW = re.compile(r"\|(?:\s*:?-+:?\s*\|)+")


@dataclass(frozen=True)
class Table:
    """The generated part of ``page`` (relative to the results folder: one of its files, or
    :data:`BENCHMARKS`), rendered by ``script`` from ``raw`` (relative to the results folder too)."""

    page: str
    raw: tuple[str, ...]
    script: str
    render: Callable[[Path], str]  # the results folder -> the part, from the raw files in it
    splice: Splice


def whole_page(text: str, part: str, where: Path) -> str:
    """The part is the whole page."""
    return part


def metric_table(text: str, part: str, where: Path) -> str:
    """The part of a ``digits_table.py`` page: from its one line starting with :data:`METRIC_LINE` to the
    end of the first table after it (the page's command and notes around it are kept)."""
    lines = text.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.startswith(METRIC_LINE)]
    if len(starts) != 1:
        raise SystemExit(f"{where}: expected one line starting with {METRIC_LINE!r} above the generated table, found {len(starts)}")
    end = starts[0] + 1
    while end < len(lines) and not lines[end].startswith("|"):
        end += 1
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return "".join(lines[: starts[0]]) + part + "".join(lines[end:])


def between_markers(start: str, end: str) -> Splice:
    """The part between the marker lines ``start`` and ``end`` (``real_table.replace_between``)."""
    return lambda text, part, where: real_table.replace_between(text, start, end, part, where)


def digits_part(csv_name: str, metric: str) -> Callable[[Path], str]:
    """Renders ``digits_table.py``'s table of ``metric`` from its per-run CSV ``csv_name``."""

    def render(results: Path) -> str:
        rows, also = digits_table.read_results(results / csv_name)
        return digits_table.table_markdown(rows, metric, also)

    return render


@functools.cache
def fmnist_parts(results: Path) -> tuple[str, str]:
    """``real_table.py --report``'s two generated parts (the tables of ``fmnist.md`` and the short tables
    of ``fmnist_summary.md``) from the CSVs in ``results``, listing no unfinished runs (they are not
    committed). The tuning CSV is read from the repository (``real_table.TUNING_CSV``)."""
    table, summary, _ = real_table.report_blocks(results / real_table.DEFAULT_OUT.name, len(real_table.SEEDS), None, [])
    return table, summary


def fmnist_part(index: int) -> Callable[[Path], str]:
    """Renders the ``index``-th of :func:`fmnist_parts` (0: ``fmnist.md``'s, 1: ``fmnist_summary.md``'s)."""
    return lambda results: fmnist_parts(results)[index]


def privacy_part(results: Path) -> str:
    """``privacy_utility_fmnist.py``'s page from its CSV in ``results``."""
    return privacy_utility_fmnist.markdown(privacy_utility_fmnist.finished_cells(results / privacy_utility_fmnist.CSV_PATH.name))


#: ``digits_table.py`` pages (each written with ``--out docs/results/<name>.md``) and their ``--metric``.
DIGITS_PAGES = {
    "baselines": "test_accuracy",
    "baselines_fedbn": "personal_accuracy",
    "baselines_personalized": "personal_accuracy",
    "baselines_ssl": "probe_accuracy",
    "fedcosr": "personal_accuracy",
    "fedcosr_shards": "personal_accuracy",
    "fedrcl": "test_accuracy",
    "fmnist_fedskc_digits": "test_accuracy",
    "hetero_ssfl": "probe_accuracy",
    "prototypes": "test_accuracy",
}
FMNIST_RAW = ("fmnist.csv", "fmnist_curves.csv", "fmnist_tuning.csv")


def json_table(raw: tuple[str, ...], script: str, render: Callable[[list[dict]], str], start: str, end: str) -> Table:
    """The part of docs/benchmarks.md between the marker lines ``start`` and ``end``, rendered by
    ``render`` from the raw JSON files ``raw``."""
    return Table(
        BENCHMARKS,
        raw,
        script,
        lambda results: render([json.loads((results / name).read_text()) for name in raw]),
        between_markers(start, end),
    )


def marked_table(page: str, script: ModuleType, stem: str) -> Table:
    """The part of ``page`` between ``script``'s ``START`` and ``END`` markers, rendered by its
    ``markdown`` from ``stem``.csv (with its provenance in ``stem``.json)."""
    return Table(
        page,
        (f"{stem}.csv", f"{stem}.json"),
        f"{script.__name__}.py",
        lambda results: script.markdown(results / f"{stem}.csv"),
        between_markers(script.START, script.END),
    )


TABLES = [
    *(
        Table(f"{name}.md", (f"{name}.csv",), "digits_table.py", digits_part(f"{name}.csv", metric), metric_table)
        for name, metric in DIGITS_PAGES.items()
    ),
    *(
        Table(summary.page, summary.raw, "digits_summaries.py", summary.markdown, between_markers(summary.start, summary.end))
        for summary in digits_summaries.SUMMARIES
    ),
    Table(
        "privacy_utility_fmnist.md",
        ("privacy_utility_fmnist.csv", "privacy_utility_fmnist.json"),
        "privacy_utility_fmnist.py",
        privacy_part,
        whole_page,
    ),
    *(
        marked_table(f"{stem}.md", script, stem)
        for stem, script in [
            ("compression", compression_table),
            ("modalities", modalities_table),
            ("threats_digits", threats_table),
            ("secagg_dp", secagg_dp_table),
        ]
    ),
    *(
        Table(page, FMNIST_RAW, "real_table.py --report", fmnist_part(index), between_markers(start, end))
        for index, (page, start, end) in enumerate(
            [
                ("fmnist.md", real_table.TABLE_START, real_table.TABLE_END),
                ("fmnist_summary.md", real_table.SUMMARY_START, real_table.SUMMARY_END),
            ]
        )
    ),
    *(
        Table("fmnist.md", part.raw, script, part.render, between_markers(part.start, part.end))
        for script, part in [
            *(("fmnist_tables.py", part) for part in fmnist_tables.PARTS),
            ("fmnist_claims.py", fmnist_claims.PART),
            ("blowup_warnings.py", blowup_warnings.PART),
        ]
    ),
    json_table(
        ("raw/tasks_cpu.json",), "tasks_table.py --table", lambda reports: tasks_table.table(*reports), tasks_table.START, tasks_table.END
    ),
    json_table(gpu_check.H200_RAW, "gpu_check.py --report", gpu_check.invocations_table, gpu_check.H200_START, gpu_check.H200_END),
    json_table(
        gpu_check.H200_RAW[:1],
        "gpu_check.py --report",
        lambda reports: gpu_check.w3_table(reports[0]["w3"]["cnn_cifar"]),
        gpu_check.FRACTIONAL_START,
        gpu_check.FRACTIONAL_END,
    ),
    *(
        json_table((f"raw/{raw}.json",), f"{script}.py --table", lambda reports, render=render: render(*reports), start, end)
        for raw, script, render, start, end in [
            ("w1_overhead", "w1_overhead", w1_overhead.steady_table, w1_overhead.STEADY_START, w1_overhead.STEADY_END),
            ("w1_overhead", "w1_overhead", w1_overhead.backends_table, w1_overhead.BACKENDS_START, w1_overhead.BACKENDS_END),
            *(
                (module.__name__, module.__name__, module.table, module.START, module.END)
                for module in (
                    service_idle_cost,
                    user_model,
                    startup,
                    config_errors,
                    parallel_efficiency,
                    sweep_throughput,
                    long_run,
                    scale,
                    client_state_scale,
                    suite_time,
                )
            ),
            ("peers", "peers/run_peers", run_peers.table, run_peers.START, run_peers.END),
            (
                "service_idle_cost_before",
                "service_idle_cost",
                service_idle_cost.table,
                service_idle_cost.BEFORE_START,
                service_idle_cost.BEFORE_END,
            ),
        ]
    ),
]
#: Page -> (how many of its tables lie outside its generated part, and why they are not regenerated here).
NOT_GENERATED: dict[str, tuple[int, str]] = {
    "index.md": (1, "the list of the digits pages: links, no numbers"),
}


def count_tables(text: str) -> int:
    """How many Markdown tables ``text`` holds (one delimiter row each)."""
    return sum(bool(DELIMITER_ROW.fullmatch(line.strip())) for line in text.splitlines())


def page_path(results: Path, page: str) -> Path:
    """Where ``page`` (relative to the results folder ``results``) is."""
    return Path(os.path.normpath(results / page))


def regenerated(table: Table, results: Path) -> str:
    """The text of ``table``'s page with its generated part rendered again from the raw files in ``results``."""
    page = page_path(results, table.page)
    return table.splice(page.read_text(), table.render(results), page)


def differing(results: Path, tables: list[Table] = TABLES) -> list[Table]:
    """The entries of ``tables`` whose page is not what their raw files in ``results`` give."""
    return [table for table in tables if regenerated(table, results) != page_path(results, table.page).read_text()]


def unaccounted(results: Path, tables: list[Table] = TABLES) -> list[str]:
    """One line per page of ``results`` (and :data:`BENCHMARKS`) whose tables outside its generated parts
    are not the number :data:`NOT_GENERATED` gives (zero for a page it does not list), and per listed page
    that is missing."""
    problems = [f"{page}: listed in NOT_GENERATED but missing" for page in NOT_GENERATED if not page_path(results, page).is_file()]
    for page in [*sorted(path.name for path in results.glob("*.md")), BENCHMARKS]:
        path = page_path(results, page)
        text = path.read_text()
        for table in tables:
            if table.page == page:
                text = table.splice(text, "", path)
        expected, _ = NOT_GENERATED.get(page, (0, ""))
        if count_tables(text) != expected:
            problems.append(
                f"{page}: {count_tables(text)} tables outside its generated part, {expected} listed in NOT_GENERATED "
                "(register a generated table in TABLES, or list a hand-written one with its reason)"
            )
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only compare: print each differing part and exit 1")
    parser.add_argument(
        "--results", type=Path, default=RESULTS, help="the results folder (pages and raw files; ../benchmarks.md beside it)"
    )
    parser.add_argument(
        "pages",
        nargs="*",
        metavar="PAGE",
        help="only these pages' generated parts, by file name (e.g. baselines.md, benchmarks.md; default: all)",
    )
    args = parser.parse_args(argv)
    unknown = set(args.pages) - {Path(table.page).name for table in TABLES}
    if unknown:
        parser.error(f"no generated table in {', '.join(sorted(unknown))}")
    failed = False
    for table in differing(args.results, [table for table in TABLES if not args.pages or Path(table.page).name in args.pages]):
        page = page_path(args.results, table.page)
        new = regenerated(table, args.results)
        if args.check:
            failed = True
            print(f"{page}: differs from what {table.script} renders from {', '.join(table.raw)}")
            sys.stdout.writelines(difflib.unified_diff(page.read_text().splitlines(True), new.splitlines(True), "committed", "regenerated"))
        else:
            page.write_text(new)
            print(f"rewrote {page} from {', '.join(table.raw)}")
    for problem in unaccounted(args.results):
        failed = True
        print(problem)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
