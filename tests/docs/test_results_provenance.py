"""benchmarks/results_tables.py: every generated table in docs/results/ and docs/benchmarks.md is, byte
for byte, what its generator renders from its committed raw file, and every other table there is listed
as not generated, with the reason. Edits are made to copies in tmp_path, never to the tracked files."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import results_tables  # noqa: E402

RESULTS = results_tables.RESULTS
#: These load the config of each of the table's entries to check it ran with today's tuning (~4 s each).
SLOW_SCRIPTS = ("real_table.py --report", "fmnist_claims.py")
FAST = [table for table in results_tables.TABLES if table.script not in SLOW_SCRIPTS]
BASELINES = next(table for table in results_tables.TABLES if table.page == "baselines.md")
PRIVACY = next(table for table in results_tables.TABLES if table.page == "privacy_utility_fmnist.md")
COMPRESSION = next(table for table in results_tables.TABLES if table.page == "compression.md")
TASKS = next(table for table in results_tables.TABLES if table.script == "tasks_table.py --table")
H200 = next(table for table in results_tables.TABLES if table.script == "gpu_check.py --report")


@pytest.mark.parametrize(
    "table",
    [
        pytest.param(table, id=f"{Path(table.page).name} ({table.script})", marks=[pytest.mark.slow] * (table.script in SLOW_SCRIPTS))
        for table in results_tables.TABLES
    ],
)
def test_each_generated_table_is_what_its_committed_raw_file_gives(table):
    assert all((RESULTS / raw).is_file() for raw in table.raw)
    assert results_tables.differing(RESULTS, [table]) == [], (
        f"{results_tables.page_path(RESULTS, table.page)} differs from {', '.join(table.raw)}: "
        f"see python benchmarks/results_tables.py --check {Path(table.page).name}"
    )


def test_every_other_table_is_listed_with_the_reason_it_is_not_generated():
    assert results_tables.unaccounted(RESULTS) == []
    assert all(reason for _, reason in results_tables.NOT_GENERATED.values())


@pytest.fixture
def results(tmp_path: Path) -> Path:
    """A copy of docs/results/ (every page, and the raw files of the fast tables) with docs/benchmarks.md beside it."""
    copy = tmp_path / "results"
    copy.mkdir()
    for page in RESULTS.glob("*.md"):
        shutil.copy(page, copy)
    shutil.copy(results_tables.page_path(RESULTS, results_tables.BENCHMARKS), results_tables.page_path(copy, results_tables.BENCHMARKS))
    for table in FAST:
        for raw in table.raw:
            (copy / raw).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(RESULTS / raw, copy / raw)
    return copy


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1
    path.write_text(text.replace(old, new))


def test_a_number_edited_in_a_table_alone_fails_the_check_and_writing_restores_it(results, capsys):
    edit(results / "baselines.md", "| fedavg | 85.83 ± 7.47 |", "| fedavg | 85.84 ± 7.47 |")
    row = next(line for line in (results / "privacy_utility_fmnist.md").read_text().splitlines() if line.startswith("| fedavg (test_"))
    first = row.split(" | ")[1].split()[0]  # FedAvg's accuracy at ε = 1, e.g. 0.830
    edit(results / "privacy_utility_fmnist.md", row, row.replace(f" {first} ", f" {float(first) + 0.001:.3f} ", 1))
    assert results_tables.differing(results, FAST) == [BASELINES, PRIVACY]
    assert results_tables.main(["--check", "--results", str(results), "baselines.md"]) == 1
    report = capsys.readouterr().out
    assert "baselines.md: differs from what digits_table.py renders from baselines.csv" in report
    assert "-| fedavg | 85.84 ± 7.47 |" in report and "+| fedavg | 85.83 ± 7.47 |" in report

    assert results_tables.main(["--results", str(results), "baselines.md", "privacy_utility_fmnist.md"]) == 0
    for table in (BASELINES, PRIVACY):  # the prose around the table is kept
        assert (results / table.page).read_text() == (RESULTS / table.page).read_text()
    assert results_tables.main(["--check", "--results", str(results), "baselines.md", "privacy_utility_fmnist.md"]) == 0


def test_a_number_edited_in_a_raw_file_alone_fails_the_check(results):
    edit(results / "baselines.csv", "fedavg,0.1,0,0.7527777777777778,", "fedavg,0.1,0,0.7627777777777778,")
    edit(results / "privacy_utility_fmnist.csv", ",0.8156,", ",0.8256,")  # shown as 0.816, then 0.826
    edit(results / "compression.csv", "topk1_ef,30,0.8833333333333333,", "topk1_ef,30,0.8861111111111111,")  # one image more
    assert results_tables.differing(results, FAST) == [BASELINES, PRIVACY, COMPRESSION]


def test_a_table_added_by_hand_outside_the_generated_part_fails_the_check(results):
    edit(results / "baselines.md", "Observations:", "| a | b |\n|---|---|\n| 1 | 2 |\n\nObservations:")
    assert results_tables.differing(results, FAST) == []
    assert results_tables.unaccounted(results) == [
        "baselines.md: 1 tables outside its generated part, 0 listed in NOT_GENERATED "
        "(register a generated table in TABLES, or list a hand-written one with its reason)"
    ]


def test_a_number_edited_in_the_benchmarks_page_or_its_raw_json_fails_the_check_and_writing_restores_it(results, capsys):
    benchmarks = results_tables.page_path(results, results_tables.BENCHMARKS)
    edit(benchmarks, "| 0.199 | 0.150 | 1.33 |", "| 0.199 | 0.150 | 1.34 |")
    edit(benchmarks, "| W3, cnn_cifar (50) | 86.8 / 92.7 |", "| W3, cnn_cifar (50) | 86.9 / 92.7 |")
    assert results_tables.differing(results, FAST) == [TASKS, H200]
    assert results_tables.main(["--check", "--results", str(results), "benchmarks.md"]) == 1
    report = capsys.readouterr().out
    assert f"{benchmarks}: differs from what tasks_table.py --table renders from raw/tasks_cpu.json" in report
    assert "-| W3, cnn_cifar (50) | 86.9 / 92.7 |" in report and "+| W3, cnn_cifar (50) | 86.8 / 92.7 |" in report

    assert results_tables.main(["--results", str(results), "benchmarks.md"]) == 0
    assert benchmarks.read_text() == results_tables.page_path(RESULTS, results_tables.BENCHMARKS).read_text()

    edit(results / "raw" / "tasks_cpu.json", '"ratio": 1.3316552795497254', '"ratio": 1.3416552795497254')  # shown as 1.34
    edit(results / "raw" / "gpu_check_h200_cohorts.json", "1002.9309845649965", "1003.0309845649965")  # 1,003.0 updates/s
    assert results_tables.differing(results, FAST) == [TASKS, H200]


def test_a_table_added_by_hand_to_the_benchmarks_page_must_be_listed(results):
    edit(
        results_tables.page_path(results, results_tables.BENCHMARKS),
        "## The test suite's time\n",
        "## The test suite's time\n\n| a |\n|---|\n",
    )
    assert results_tables.BENCHMARKS not in results_tables.NOT_GENERATED  # every table of the page is generated
    assert results_tables.unaccounted(results) == [
        "../benchmarks.md: 1 tables outside its generated part, 0 listed in NOT_GENERATED "
        "(register a generated table in TABLES, or list a hand-written one with its reason)"
    ]


def test_the_privacy_table_pairs_each_epsilon_with_no_dp_of_the_same_seed():
    """DP's cost per algorithm: the cell at ε minus the cell at ε = ∞ of the same seed, a t interval
    over the paired seeds (bold when it excludes 0); an unpaired seed counts for nothing."""
    import privacy_utility_fmnist as table

    def cell(label, epsilon, seed, final):
        return (label, epsilon, seed), {"final": str(final), "noise_multiplier": "" if epsilon == float("inf") else "1.5"}

    inf = float("inf")
    cells = dict(
        [
            cell("fedavg", inf, 0, 0.80),
            cell("fedavg", inf, 1, 0.82),
            cell("fedavg", inf, 2, 0.84),
            cell("fedavg", 4.0, 0, 0.78),
            cell("fedavg", 4.0, 1, 0.79),
            cell("fedavg", 4.0, 2, 0.80),
            cell("fedavg", 4.0, 3, 0.10),  # no ε = ∞ run of seed 3: not paired
            cell("fedsc", inf, 0, 0.85),
            cell("fedsc", 4.0, 0, 0.15),
        ]
    )
    # differences −2, −3, −4 points: mean −3, s = 1, t(0.975, 2) = 4.303, half-width 4.303/√3 = 2.48
    assert table.paired_cell(cells, "fedavg", 4.0) == "**-3.0 [-5.5, -0.5] (n = 3)**"
    assert table.paired_cell(cells, "fedsc", 4.0) == "-70.0 (n = 1)"
    assert table.paired_cell(cells, "fedsc", 1.0) == "*pending*"
    assert table.mean_cell(cells, "fedavg", inf) == "0.820 ± 0.020 (n = 3)"
    assert table.mean_cell(cells, "fedsc", 4.0) == "0.150 (z = 1.50)"
