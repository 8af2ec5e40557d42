"""The dashboard's paired comparison of algorithms: ``/api/overview`` of a sweep over ``algorithm.name`` carries
each algorithm's paired differences from the reference algorithm (the rows of comparison.md's paired tables),
and the sweep view shows them in a table. The sweep directory is written in the contract's files by the
helpers of ``test_dashboard_data.py``, with a real dashboard server; the page in Debian's Chromium."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats
from test_dashboard_browser import needs_browser, open_dashboard, screenshot, wait_count
from test_dashboard_data import serve, synthetic_round_rows, trial_row, write_meta
from test_dashboard_server import get

from fedray.tracking import write_table_atomically
from fedray.tune.summary import comparison_markdown

SPACE = {"algorithm.name": {"grid": ["fedprox", "fedavg", "scaffold"]}, "data.alpha": {"grid": [0.1, 0.5]}, "seed": {"grid": [0, 1, 2]}}
# Final accuracy of each trial by (algorithm, α): one per seed. fedprox beats fedavg at α=0.1 by 2-4 points.
FINAL = {
    ("fedavg", 0.1): [0.50, 0.60, 0.70],
    ("fedavg", 0.5): [0.80, 0.70, 0.75],
    ("fedprox", 0.1): [0.52, 0.63, 0.74],
    ("fedprox", 0.5): [0.85, 0.65, 0.78],
    ("scaffold", 0.1): [0.40, 0.49, 0.58],
    ("scaffold", 0.5): [0.82, 0.60, 0.70],
}
ERRORED = ("scaffold", 0.5, 2)


def write_algorithm_sweep(sweep_dir: Path, reference: str | None = None) -> None:
    """A finished sweep of algorithms × α × seed (grids), 3 rounds a trial, one errored trial, in the contract's files."""
    sweep_dir.mkdir(parents=True)
    (sweep_dir / "sweep.yaml").write_text(
        json.dumps({"name": "algorithms", "space": SPACE, "metric": "test_accuracy", "reference": reference})
    )
    write_meta(sweep_dir, list(SPACE), 18, status="finished")
    trial_rows, round_rows = [], []
    for (algorithm, alpha), finals in FINAL.items():
        for seed, final in enumerate(finals):
            trial_id = f"{algorithm}_{alpha}_{seed}"
            rows = synthetic_round_rows([0.3, 0.4, final])[: 2 if (algorithm, alpha, seed) == ERRORED else 3]
            row = trial_row(trial_id, {"algorithm.name": algorithm, "data.alpha": alpha, "seed": seed}, rows)
            if (algorithm, alpha, seed) == ERRORED:
                row.update(status="ERROR", error="FloatingPointError: diverged")
            trial_rows.append(row)
            round_rows += [{"trial_id": trial_id, **r} for r in rows]
    write_table_atomically(trial_rows, sweep_dir / "trials.parquet")
    write_table_atomically(round_rows, sweep_dir / "rounds.parquet")


def overview(sweep_dir: Path) -> dict:
    with serve(sweep_dir) as server:
        status, body = get(server, "/api/overview")
    assert status == 200
    return json.loads(body)


def test_sweep_api_carries_the_paired_comparison_with_students_t_intervals(tmp_path):
    sweep = tmp_path / "algorithms-20260102-030405"
    write_algorithm_sweep(sweep)
    paired = overview(sweep)["paired_comparison"]
    # fedavg is the reference although fedprox comes first in the space
    assert (paired["reference"], paired["confidence"], paired["columns"]) == ("fedavg", 0.95, ["data.alpha"])
    assert [m["metric"] for m in paired["metrics"]] == ["test_accuracy"]
    rows = {(r["algorithm"], r["values"]["data.alpha"]): r for r in paired["metrics"][0]["rows"]}
    assert sorted(rows) == [("fedprox", 0.1), ("fedprox", 0.5), ("scaffold", 0.1), ("scaffold", 0.5)]
    for (algorithm, alpha), row in rows.items():
        mine, theirs = np.array(FINAL[(algorithm, alpha)]), np.array(FINAL[("fedavg", alpha)])
        if (algorithm, alpha) == ERRORED[:2]:  # the errored seed has no value: its reference trial is left unpaired
            mine, theirs = mine[:2], theirs[:2]
        interval = stats.ttest_rel(mine, theirs).confidence_interval(0.95)
        assert row["n"] == len(mine) and row["unpaired"] == 0
        assert row["mean_difference"] == pytest.approx(float(np.mean(mine - theirs)))
        assert (row["ci_low"], row["ci_high"]) == (pytest.approx(interval.low), pytest.approx(interval.high))
        assert row["significant"] == (interval.low > 0 or interval.high < 0)
    assert rows[("fedprox", 0.1)]["verdict"] == "better" and rows[("scaffold", 0.1)]["verdict"] == "worse"
    assert rows[("fedprox", 0.5)]["verdict"] == "no clear difference"
    # the same numbers as comparison.md
    text = comparison_markdown(sweep)
    low, high = rows[("fedprox", 0.1)]["ci_low"], rows[("fedprox", 0.1)]["ci_high"]
    assert f"| fedprox | +3.00 pp [{100 * low:+.2f}, {100 * high:+.2f}] (n=3) * better |" in text


def test_the_sweep_files_reference_reaches_the_api(tmp_path):
    sweep = tmp_path / "algorithms-20260102-030405"
    write_algorithm_sweep(sweep, reference="scaffold")
    paired = overview(sweep)["paired_comparison"]
    assert paired["reference"] == "scaffold"
    assert {r["algorithm"] for r in paired["metrics"][0]["rows"]} == {"fedavg", "fedprox"}


def test_a_sweep_without_algorithm_name_has_no_paired_comparison(tmp_path):
    sweep = tmp_path / "alpha-20260102-030405"
    sweep.mkdir()
    write_meta(sweep, ["data.alpha"], 1, status="finished")
    write_table_atomically([trial_row("t0", {"data.alpha": 0.1}, synthetic_round_rows([0.4, 0.5]))], sweep / "trials.parquet")
    write_table_atomically([{"trial_id": "t0", **r} for r in synthetic_round_rows([0.4, 0.5])], sweep / "rounds.parquet")
    assert overview(sweep)["paired_comparison"] is None


@needs_browser
@pytest.mark.slow
def test_sweep_view_shows_the_paired_table(tmp_path, page):
    sweep = tmp_path / "algorithms-20260102-030405"
    write_algorithm_sweep(sweep)
    with serve(sweep) as server:
        open_dashboard(page, server)
        wait_count(page, "#paired-table tbody tr", 4)
        assert page.is_visible("#paired-section")
        assert "Reference: fedavg" in page.inner_text("#paired-note") and "Student's t (t, n−1 dof)" in page.inner_text("#paired-note")
        heads = page.evaluate("[...document.querySelectorAll('#paired-table thead th')].map((th) => th.textContent)")
        assert heads == ["algorithm", "data.alpha (α)", "n", "mean difference", "95% CI", "verdict"]
        cells = page.evaluate(
            "Object.fromEntries([...document.querySelectorAll('#paired-table tbody tr')].map((tr) => "
            "[tr.dataset.algorithm + ' ' + tr.dataset.column, [...tr.cells].map((td) => td.textContent)]))"
        )
        assert cells["fedprox 0.1"][:4] == ["fedprox", "0.1", "3", "+3.00 pp"]
        assert cells["fedprox 0.1"][5] == "better *"
        assert cells["scaffold 0.1"][3] == "-11.00 pp" and cells["scaffold 0.1"][5] == "worse *"
        assert cells["scaffold 0.5"][2] == "2" and cells["fedprox 0.5"][5] == "no clear difference"
        low, high = stats.ttest_rel(FINAL[("fedprox", 0.1)], FINAL[("fedavg", 0.1)]).confidence_interval(0.95)
        assert cells["fedprox 0.1"][4] == f"[{100 * low:+.2f} pp, {100 * high:+.2f} pp]"
        # the paired table follows the comparison table
        assert page.evaluate("document.getElementById('groups-section').nextElementSibling.id") == "paired-section"
        screenshot(page, "dashboard_paired.png")
