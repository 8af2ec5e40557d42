"""benchmarks/blowup_warnings.py: the blow-up warning replayed over run folders into a CSV, and the
page's table rendered from it (fake run folders written with fedray's own metrics writer)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import blowup_warnings  # noqa: E402


def write_run(folder: Path, worst_ce: list[float], accuracies: list[float], planned_rounds: int | None = None) -> Path:
    from fedray.layout import SAVED_CONFIG_FILE
    from fedray.tracking.metrics_file import METRICS_FILE, write_table_atomically

    rows = []
    for round, (worst, accuracy) in enumerate(zip(worst_ce, accuracies), 1):
        rows.append({"scope": "round", "round": round, "test_accuracy": accuracy})
        rows += [{"scope": "client", "round": round, "client_id": c, "ce": ce} for c, ce in [(1, 0.2), (2, 0.3), (67, worst)]]
    folder.mkdir(parents=True)
    write_table_atomically(rows, folder / METRICS_FILE)
    if planned_rounds is not None:  # the config a run saves
        (folder / SAVED_CONFIG_FILE).write_text(f"train:\n  rounds: {planned_rounds}\n")
    return folder


def test_the_replay_records_every_run_and_the_table_lists_the_warned_first(tmp_path):
    # 8.0 is over 10 × the median (0.3) and over 3 · ln 10 (6.9), the warning's floor for 10 classes
    warned = write_run(tmp_path / "runs" / "global-scaffold-dir0.1-s0-lr0.05", [0.4, 8.0, 0.5], [0.8, 0.82, 0.3], planned_rounds=35)
    quiet = write_run(tmp_path / "runs" / "quiet", [0.4, 0.5, 0.6], [0.8, 0.84, 0.85])
    csv_path = tmp_path / "results" / blowup_warnings.CSV
    csv_path.parent.mkdir()
    blowup_warnings.record([quiet, warned], blowup_warnings.machine(), csv_path)
    rows = {row["run"]: row for row in blowup_warnings.real_table.read_csv(csv_path)}
    assert rows[warned.name]["warned_rounds"] == "2"
    assert rows[warned.name]["first_warning"] == "round 2 (client 67: ce 8, median 0.3)"
    assert rows[warned.name]["when_found"] == "collapsed in round 30"  # one of the reruns
    assert rows["quiet"]["warned_rounds"] == rows["quiet"]["first_collapse"] == rows["quiet"]["when_found"] == ""
    assert all(row["commit"] and row["torch"] and row["date"] for row in rows.values())

    table = blowup_warnings.warnings_table(csv_path.parent).strip().splitlines()
    assert table[0].startswith("2 runs replayed (6 rounds with client rows; replayed at `")
    assert table[0].endswith("the warning fired in 1.")
    assert table[4] == (
        f"| {warned.name} | collapsed in round 30 | 3 | round 2 (client 67: ce 8, median 0.3) | 2 "
        "| collapsed in round 3 (30.00 %, best before it 82.00 %) | 3 of 35 |"
    )
    assert table[5] == "| quiet | — | 3 | — | — | — | 3 |"

    again = write_run(tmp_path / "again" / "quiet", [0.4, 9.0, 0.5], [0.8, 0.8, 0.8])
    blowup_warnings.record([again], blowup_warnings.machine(), csv_path)
    rows = {row["run"]: row for row in blowup_warnings.real_table.read_csv(csv_path)}
    assert set(rows) == {warned.name, "quiet"} and rows["quiet"]["warned_rounds"] == "2"  # replaced, the other kept


def test_a_missing_folder_is_one_line_and_exit_2_before_any_run(tmp_path, capsys):
    assert blowup_warnings.main(["--also", str(tmp_path / "nowhere"), "--runs-dir", str(tmp_path / "runs")]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0
    assert not (tmp_path / "runs").exists()
