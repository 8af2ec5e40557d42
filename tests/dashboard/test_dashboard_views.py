"""The dashboard's views beside Optuna Dashboard's and W&B sweeps': hyperparameter importance (Optuna's fANOVA
evaluator), the optimisation history, the timeline of trials with the resources they held, filtering, CSV export
and brushing of the trials, legends and modebars that do not cover each other, and a run its user stopped
(a real ``fedray run`` stopped by SIGINT, exit 130) shown as stopped, not crashed.

Sweeps are written in the sweep directory contract (``write_comparison_sweep``) with real run directories
(``write_run_dir``) whose file times say when each trial started and ended. Browser tests drive Debian's
Chromium like ``test_dashboard_browser.py``; screenshots go to ``tests/artifacts/``.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from child_signals import popen_interruptible
from test_dashboard_browser import needs_browser, open_dashboard, screenshot, wait_count
from test_dashboard_data import age, serve, synthetic_round_rows, trial_row, write_comparison_sweep, write_meta, write_run_dir

from fedray.dashboard.data import DashboardData
from fedray.tracking import write_table_atomically

VISIBLE_ROWS = "#trials-table tbody tr:not([hidden])"
UNFINISHED = {("fedavg", 0.5, 1): "RUNNING", ("fedsc", 0.5, 1): "ERROR"}  # write_comparison_sweep(running=...) and its errored trial
CPUS_PER_TRIAL = 2.0


def write_dated_trial_dirs(sweep: Path, ids: dict[tuple, str]) -> dict[str, tuple[float, float]]:
    """A run directory for each trial of a comparison sweep, with a ``placement.json`` of two 1-CPU bundles;
    trial i starts 100·i s after the first and ends 5000 − 200·i s after it (so later trials end first).
    Returns each trial's (start, end) in seconds since the epoch."""
    first = time.time() - 6000
    times = {}
    for index, (shape, trial_id) in enumerate(ids.items()):
        run_dir = sweep / "trials" / trial_id
        algorithm, alpha, seed = shape
        overrides = [f"algorithm.name={algorithm}", f"data.alpha={alpha}", f"seed={seed}"]
        write_run_dir(run_dir, overrides, [0.3, 0.5], finished=shape not in UNFINISHED)
        (run_dir / "placement.json").write_text(json.dumps({"bundles": [{"CPU": 1.0}, {"CPU": 1.0}]}))
        start, end = first + 100 * index, first + 5000 - 200 * index
        for item in run_dir.iterdir():
            os.utime(item, (end, end))
        os.utime(run_dir / "config.yaml", (start, start))
        times[trial_id] = (start, end)
    return times


def visible_ids(page) -> list[str]:
    return page.evaluate(f"[...document.querySelectorAll('{VISIBLE_ROWS}')].map((tr) => tr.dataset.trialId)")


def overlaps(a: dict, b: dict) -> bool:
    return a["left"] < b["right"] and b["left"] < a["right"] and a["top"] < b["bottom"] and b["top"] < a["bottom"]


# ---------------------------------------------------------------------------------------------------
# Hyperparameter importance (no browser)


def write_importance_sweep(sweep: Path, value_of) -> None:
    """16 finished trials over α (grid) × μ (log-uniform), final value ``value_of(alpha, mu)``."""
    sweep.mkdir(parents=True)
    space = {"data.alpha": {"grid": [0.1, 1.0]}, "algorithm.mu": {"loguniform": [0.001, 1.0]}}
    (sweep / "sweep.yaml").write_text(json.dumps({"name": "imp", "space": space, "metric": "test_accuracy", "mode": "max"}))
    write_meta(sweep, list(space), 16, status="finished")
    trial_rows, round_rows = [], []
    for index in range(16):
        alpha, mu = (0.1, 1.0)[index % 2], 10 ** (-3 + 3 * index / 15)
        rows = synthetic_round_rows([0.2, value_of(alpha, mu)])
        trial_rows.append(trial_row(f"t{index:02d}", {"data.alpha": alpha, "algorithm.mu": mu}, rows))
        round_rows += [{"trial_id": f"t{index:02d}", **r} for r in rows]
    write_table_atomically(trial_rows, sweep / "trials.parquet")
    write_table_atomically(round_rows, sweep / "rounds.parquet")


def test_importance_finds_the_key_the_metric_depends_on(tmp_path):
    pytest.importorskip("optuna", reason="needs optuna (pip install -e '.[test]')")
    by_alpha = tmp_path / "by-alpha"
    write_importance_sweep(by_alpha, lambda alpha, mu: 0.5 + 0.3 * (alpha == 1.0) + 0.001 * mu)
    result = DashboardData(by_alpha).importance("latest_metric")
    assert result["available"] and result["num_trials"] == 16 and result["left_out"] == 0
    assert [r["key"] for r in result["importances"]] == ["data.alpha", "algorithm.mu"]
    assert result["importances"][0]["importance"] > 0.9 and sum(r["importance"] for r in result["importances"]) == pytest.approx(1.0)

    by_mu = tmp_path / "by-mu"
    write_importance_sweep(by_mu, lambda alpha, mu: 0.5 + 0.2 * (mu > 0.03) + 0.001 * (alpha == 1.0))
    assert DashboardData(by_mu).importance("best_metric")["importances"][0]["key"] == "algorithm.mu"


def test_importance_leaves_out_unfinished_trials_and_other_quantities(tmp_path):
    pytest.importorskip("optuna", reason="needs optuna (pip install -e '.[test]')")
    sweep = tmp_path / "compare"
    write_comparison_sweep(sweep, running=("fedavg", 0.5, 1))
    result = DashboardData(sweep).importance("latest_metric")
    # 12 trials: 4 hetero_ssfl report a probe's accuracy, 1 errored, 1 still running
    assert result["available"] and result["num_trials"] == 6 and result["left_out"] == 6
    assert sorted(r["key"] for r in result["importances"]) == sorted(["algorithm.name", "data.alpha", "seed", "train.lr"])


def test_importance_says_how_to_install_optuna_when_it_is_missing(tmp_path, monkeypatch):
    sweep = tmp_path / "compare"
    write_comparison_sweep(sweep)
    monkeypatch.setitem(sys.modules, "optuna", None)  # as if it were not installed
    result = DashboardData(sweep).importance("latest_metric")
    assert not result["available"] and 'pip install "fedray[optuna]"' in result["message"]


def test_importance_needs_two_finished_trials_that_differ(tmp_path):
    sweep = tmp_path / "one"
    write_comparison_sweep(sweep)
    trials = pq.read_table(sweep / "trials.parquet").to_pylist()
    write_table_atomically(trials[:1], sweep / "trials.parquet")
    result = DashboardData(sweep).importance("latest_metric")
    assert not result["available"] and "at least two finished trials" in result["message"]


# ---------------------------------------------------------------------------------------------------
# A run its user stopped (a real fedray run, no browser)


@pytest.mark.slow
def test_run_stopped_by_its_user_shows_as_stopped_not_crashed(tmp_path):
    """``fedray run`` stopped by SIGINT (Ctrl-C) after its first round exits 130 and leaves ``stopped.json``:
    the dashboard shows the run as STOPPED (with how to resume it), even hours later, never as STALLED."""
    runs = tmp_path / "runs"
    command = [sys.executable, "-m", "fedray.cli.main", "run"]
    overrides = [f"output.dir={runs}", "output.name=stopped", "resources.backend=local", "resources.num_workers=1", "data.num_clients=6"]
    overrides += ["train.clients_per_round=3", "train.rounds=500", "checkpoint.every=1", "output.tensorboard=false", "output.plots=false"]
    arguments = command + ["--quiet"] + [part for override in overrides for part in ("--set", override)]
    process = popen_interruptible(arguments, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # SIGINT below
    run_dir = runs / "stopped"
    try:
        deadline = time.monotonic() + 300
        while not any((run_dir / "checkpoints").glob("round_*.pt")):  # a round is done: the run is kept
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "no round finished within 300 s"
            time.sleep(0.2)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, stderr
    stopped = json.loads((run_dir / "stopped.json").read_text())
    assert stopped["round"] >= 1 and not (run_dir / "summary.json").exists()

    age(run_dir, 3 * 3600)  # hours later: a crashed run would be STALLED by now
    for folder in (run_dir, runs):
        overview = DashboardData(folder).overview()
        (trial,) = overview.trials
        assert trial["status"] == "STOPPED", trial
        assert f"after round {stopped['round']}" in trial["error"] and "fedray run --resume" in trial["error"]
        assert [m.level for m in overview.messages] == ["info"] and "stopped by their user" in overview.messages[0].text


# ---------------------------------------------------------------------------------------------------
# In the browser


@needs_browser
@pytest.mark.slow
def test_importance_history_and_timeline_of_a_sweep(page, tmp_path):
    pytest.importorskip("optuna", reason="needs optuna (pip install -e '.[test]')")
    sweep = tmp_path / "compare-20260102-030405"
    ids = write_comparison_sweep(sweep, running=("fedavg", 0.5, 1))
    times = write_dated_trial_dirs(sweep, ids)
    trials = {t["trial_id"]: t for t in pq.read_table(sweep / "trials.parquet").to_pylist()}
    expected = DashboardData(sweep).importance("latest_metric")
    with serve(sweep) as server:
        open_dashboard(page, server)

        # importance: one bar per swept key, most important on top, as Optuna's evaluator computed them
        wait_count(page, "#importance-plot .bars .point", 4)
        bars = page.evaluate("(() => { const t = document.getElementById('importance-plot').data[0]; return [t.y, t.x]; })()")
        assert bars[1][::-1] == pytest.approx([r["importance"] for r in expected["importances"]])
        assert [label.split(" ")[0] for label in bars[0][::-1]] == [r["key"] for r in expected["importances"]]
        assert "over 6 finished trials; 6 left out" in page.inner_text("#importance-note")

        # history: the finished trials of the sweep's quantity in the order they ended, and the best so far
        finished = [i for i in trials if trials[i]["status"] == "TERMINATED" and "hetero_ssfl" not in trials[i]["algorithm.name"]]
        in_order = sorted(finished, key=lambda i: times[i][1])
        page.wait_for_function("document.getElementById('history-plot').data && document.getElementById('history-plot').data.length === 2")
        line, points = page.evaluate(
            "document.getElementById('history-plot').data.map((t) => ({name: t.name, ids: t.customdata || null, y: t.y}))"
        )
        assert points["ids"] == in_order and points["y"] == [trials[i]["latest_metric"] for i in in_order]
        running_best = [max(trials[i]["latest_metric"] for i in in_order[: n + 1]) for n in range(len(in_order))]
        assert line["name"] == "best so far" and line["y"] == pytest.approx(running_best)

        # timeline: a bar per trial from its start to its end, coloured by status; the CPUs held below
        bars = page.evaluate(
            "document.getElementById('timeline-plot').data.filter((t) => t.type === 'bar').map((t) => ({name: t.name, y: t.y, x: t.x}))"
        )
        by_name = {b["name"]: b for b in bars}
        assert sorted(by_name) == ["failed", "finished", "running"]
        assert by_name["failed"]["y"] == [ids[("fedsc", 0.5, 1)]] and by_name["running"]["y"] == [ids[("fedavg", 0.5, 1)]]
        for trial_id, duration_ms in zip(by_name["finished"]["y"], by_name["finished"]["x"]):
            start, end = times[trial_id]
            assert duration_ms == pytest.approx(1000 * (end - start), abs=5)
        held = page.evaluate("document.getElementById('timeline-plot').data.find((t) => t.name === 'CPUs held').y")
        ends = {i: (float("inf") if trials[i]["status"] == "RUNNING" else end) for i, (_, end) in times.items()}
        most_at_once = max(sum(times[j][0] <= times[i][0] < ends[j] for j in times) for i in times)
        assert max(held) == CPUS_PER_TRIAL * most_at_once and held[-1] == CPUS_PER_TRIAL  # the running trial still holds its CPUs
        screenshot(page, "dashboard_importance_history_timeline.png")

        # clicking a point of the history opens that trial's run
        page.locator("#history-plot").scroll_into_view_if_needed()
        page.evaluate("(id) => openRun(id)", in_order[0])
        page.wait_for_function("(id) => document.getElementById('run-title').textContent === id", arg=in_order[0])


@needs_browser
@pytest.mark.slow
def test_filter_export_and_brush_the_trials(page, tmp_path):
    sweep = tmp_path / "compare-20260102-030405"
    ids = write_comparison_sweep(sweep)
    trials = {t["trial_id"]: t for t in pq.read_table(sweep / "trials.parquet").to_pylist()}
    with serve(sweep) as server:
        open_dashboard(page, server)
        wait_count(page, VISIBLE_ROWS, 12)

        page.fill("#trials-filter", "fedsc α>=0.5")  # text, and a key by its symbol
        wait_count(page, VISIBLE_ROWS, 2)
        assert sorted(visible_ids(page)) == sorted([ids[("fedsc", 0.5, 0)], ids[("fedsc", 0.5, 1)]])
        assert page.inner_text("#filter-status") == "2 of 12 shown"
        page.fill("#trials-filter", "status=error")
        wait_count(page, VISIBLE_ROWS, 1)
        page.fill("#trials-filter", "lr<0.0035 seed!=1")  # a key by its last part; numbers compared as numbers
        expected = sorted(i for i, t in trials.items() if t["train.lr"] < 0.0035 and t["seed"] != 1)
        page.wait_for_function(
            "(ids) => JSON.stringify([...document.querySelectorAll('#trials-table tbody tr:not([hidden])')].map((tr) => tr.dataset.trialId).sort()) === JSON.stringify(ids)",
            arg=expected,
        )
        page.fill("#trials-filter", "learning_rate>1 fedavg")
        page.wait_for_function("document.getElementById('filter-status').textContent.includes('no column')")
        wait_count(page, VISIBLE_ROWS, 4)  # the unknown key is ignored, the text still filters
        for key in ("algorithm.name", "data.alpha"):  # one curve per trial, not per group
            page.uncheck(f"#group-by input[value='{key}']")
        page.click("[data-select='all']")  # 'all' ticks the trials shown
        wait_count(page, "#curves-plot .scatterlayer .trace", 4)

        with page.expect_download() as download:
            page.click("#export-csv")
        rows = list(csv.DictReader(download.value.path().open()))
        assert [r["trial_id"] for r in rows] == visible_ids(page)
        for row in rows:  # unrounded values, every column
            trial = trials[row["trial_id"]]
            assert float(row["train.lr"]) == trial["train.lr"] and float(row["latest_metric"]) == trial["latest_metric"]
            assert row["status"] == trial["status"] and row["label"].startswith("fedavg α=")
        assert download.value.suggested_filename == f"{sweep.name}-trials.csv"

        # brushing: drag along the metric's axis of the parallel coordinates; the table keeps the trials inside
        page.fill("#trials-filter", "")
        wait_count(page, VISIBLE_ROWS, 12)
        brush = page.locator("#parcoords-plot .axis-brush").last
        brush.scroll_into_view_if_needed()
        box = brush.bounding_box()
        x = box["x"] + box["width"] / 2
        page.mouse.move(x, box["y"] + 5)
        page.mouse.down()
        page.mouse.move(x, box["y"] + 0.45 * box["height"], steps=8)
        page.mouse.up()
        page.wait_for_function("document.getElementById('filter-status').textContent.includes('brushed')")
        low, high = page.evaluate("document.getElementById('parcoords-plot').data[0].dimensions.at(-1).constraintrange")
        inside = sorted(i for i, t in trials.items() if t["latest_metric"] is not None and low <= t["latest_metric"] <= high)
        assert 0 < len(inside) < 12 and sorted(visible_ids(page)) == inside
        screenshot(page, "dashboard_filter_brush.png")


LONG_RUNS = {  # a folder of runs that differ in many keys: long labels
    "fedprox-a": [
        "algorithm.name=fedprox",
        "algorithm.mu=0.1",
        "data.alpha=0.5",
        "train.lr=0.05",
        "train.local_epochs=2",
        "train.batch_size=16",
    ],
    "fedprox-b": [
        "algorithm.name=fedprox",
        "algorithm.mu=0.01",
        "data.alpha=0.1",
        "train.lr=0.01",
        "train.local_epochs=1",
        "train.batch_size=32",
    ],
    "fedavg-c": ["algorithm.name=fedavg", "data.alpha=10.0", "train.lr=0.02", "train.local_epochs=3", "train.batch_size=64"],
}


@needs_browser
@pytest.mark.slow
def test_modebars_leave_legends_and_titles_readable_and_long_names_are_cut(page, tmp_path):
    runs = tmp_path / "runs"
    for index, (name, overrides) in enumerate(LONG_RUNS.items()):
        write_run_dir(runs / name, overrides, [0.3 + 0.1 * index, 0.5 + 0.1 * index])
    with serve(runs) as server:
        open_dashboard(page, server)
        wait_count(page, "#curves-plot .legend .traces", 3)
        labels = page.evaluate("document.getElementById('curves-plot').data.map((t) => [t.name, t.meta])")
        full = [t["label"] for t in DashboardData(runs).overview().trials]
        assert sorted(m.removeprefix("★ ") for _, m in labels) == sorted(full) and max(map(len, full)) > 48
        assert all(len(name) <= 48 for name, _ in labels) and any(name.endswith("…") for name, _ in labels)
        tooltips = page.evaluate(
            "[...document.querySelectorAll('#curves-plot .legend .traces')].map((t) => t.querySelector('title').textContent)"
        )
        assert sorted(tooltips) == sorted(m for _, m in labels)  # the full name on hover

        page.click("#trials-table tbody tr[data-trial-id='fedprox-a'] td.status-TERMINATED")
        wait_count(page, "#run-clients .client-plot", 1)
        page.wait_for_selector("#history-plot .scatterlayer .point")
        covered = page.evaluate(
            """() => [...document.querySelectorAll('.js-plotly-plot')].flatMap((plot) => {
              const bar = plot.querySelector('.modebar');
              if (!bar || !plot.offsetParent) return [];
              const labels = plot.querySelectorAll('.legend .traces, .gtitle, .g-xtitle, .g-ytitle, .axis-title');
              return [...labels].map((label) => [plot.id || plot.dataset.metric, label.textContent, JSON.stringify(bar.getBoundingClientRect()),
                                                  JSON.stringify(label.getBoundingClientRect())]);
            })"""
        )
        assert len({plot for plot, *_ in covered}) >= 6  # curves, parallel coordinates, history, timeline, the run's plots
        hidden = [(plot, text) for plot, text, bar, label in covered if overlaps(json.loads(bar), json.loads(label))]
        assert hidden == [], f"the modebar covers {hidden}"
        screenshot(page, "dashboard_runs_long_labels.png")
