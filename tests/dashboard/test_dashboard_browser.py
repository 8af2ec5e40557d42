"""``fedray dashboard`` in headless Chromium (driven by Playwright) on sweep folders made by real fedray
runs and by a real ``fedray tune`` sweep: the table lists every trial, the curves / parallel coordinates /
scatters render with data, a trial appended to the Parquet files appears without a reload, per-run
views, messages for empty and half-written folders. Also the CLI serving the API (no browser needed).

The real sweep is the user-code sweep of ``tests/e2e/test_user_code_sweep.py`` (``tests/user_code_sweep_rig.py``:
a separate ``fedray tune`` process, two trials of a user's algorithm, model and dataset over
``model.kwargs.hidden`` (grid) × ``algorithm.server_momentum`` (choice), plots on), made once per session by
the ``user_code_sweep`` fixture for both modules; the tests that read it are marked ``on_the_real_sweep``.

Browser tests skip when no Chromium is installed (CI installs Debian's ``chromium``). Screenshots go to
``tests/artifacts/`` (git-ignored); their paths are printed (``pytest -s``).
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from test_dashboard_data import (
    age,
    serve,
    synthetic_round_rows,
    trial_row,
    write_comparison_sweep,
    write_meta,
    write_run_dir,
)
from user_code_sweep_rig import CLIENTS, HIDDEN, ROUNDS, SPACE, XDIST_GROUP, user_code_importable

from fedray import load_config
from fedray.dashboard import DashboardServer
from fedray.dashboard.data import DashboardData, select_best_trial
from fedray.tracking import write_table_atomically

CHROMIUM = next(
    (p for p in (shutil.which("chromium"), "/usr/bin/chromium", shutil.which("chromium-browser")) if p and Path(p).is_file()), None
)
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
# A mark, not a skip inside the browser fixture: marks are checked before the (slow) sweep fixture runs.
needs_browser = pytest.mark.skipif(
    CHROMIUM is None or importlib.util.find_spec("playwright") is None,
    reason="no Chromium found (install Debian's chromium: apt-get install -y chromium)"
    if CHROMIUM is None
    else "playwright is not installed (pip install -e '.[test]')",
)
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
WAIT_MS = 30_000
SMALL, LARGE = sorted(HIDDEN)  # the grid of model.kwargs.hidden: one trial each


# The tests that read the real sweep run on one pytest-xdist worker (``--dist loadgroup``), with the user-code
# sweep's own test: the session-scoped sweep is then made once, not once on every worker that gets one of them.
on_the_real_sweep = pytest.mark.xdist_group(XDIST_GROUP)


# ---------------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture
def real_sweep(user_code_sweep) -> Path:
    """The directory of the real 2-trial user-code sweep (``model.kwargs.hidden`` on a grid,
    ``algorithm.server_momentum`` a choice, ``ROUNDS`` rounds of all ``CLIENTS`` clients each) that
    ``fedray tune`` wrote, made once for every test that reads it (they are all marked ``on_the_real_sweep``).
    Tests read it and do not write into it (a test that changes a sweep changes a copy)."""
    return user_code_sweep.sweep_dir


def trials_by_hidden(sweep: Path) -> dict[int, str]:
    """Trial ids by their ``model.kwargs.hidden`` (Tune names trials itself)."""
    return {row["model.kwargs.hidden"]: row["trial_id"] for row in pq.read_table(sweep / "trials.parquet").to_pylist()}


def config_value(config: Any, key: str) -> Any:
    """The value of a dotted run-config key: ``data.alpha``, or ``model.kwargs.hidden`` (a key inside a mapping)."""
    for part in key.split("."):
        config = config[part] if isinstance(config, dict) else getattr(config, part)
    return config


def open_dashboard(page, server: DashboardServer) -> None:
    page.goto(server.url)
    page.wait_for_function("document.body.dataset.version !== undefined")


def count(page, selector: str) -> int:
    return page.evaluate("(s) => document.querySelectorAll(s).length", selector)


def wait_count(page, selector: str, expected: int) -> None:
    page.wait_for_function("([s, n]) => document.querySelectorAll(s).length === n", arg=[selector, expected])


def table_ids(page) -> list[str]:
    return page.evaluate("[...document.querySelectorAll('#trials-table tbody tr')].map((tr) => tr.dataset.trialId)")


def screenshot(page, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")
    return path


def test_screenshots_go_to_a_folder_that_git_ignores_and_tracks_nothing_in():
    """Running the suite must leave the checkout clean: no screenshot may overwrite a tracked file."""
    repo = ARTIFACTS.parent.parent
    git = shutil.which("git")
    if git is None or not (repo / ".git").exists():
        pytest.skip("not a git checkout")
    tracked = subprocess.run([git, "ls-files", "--", str(ARTIFACTS)], cwd=repo, capture_output=True, text=True, check=True).stdout
    assert tracked.splitlines() == []
    ignored = subprocess.run([git, "check-ignore", "--quiet", "--no-index", str(ARTIFACTS / "dashboard_sweep.png")], cwd=repo)
    assert ignored.returncode == 0


def check_sweep_page(page, sweep: Path, swept_keys: list[str], scratch: Path) -> list[dict]:
    """What every sweep page must show: every trial, the best one marked, one curve per trial with
    one point per reported round, parallel coordinates with one axis per swept key plus the metric,
    one scatter per swept key, and the best trial's config as a valid run config (written to ``scratch``
    and loaded there; the user code a config names must be importable)."""
    trials = pq.read_table(sweep / "trials.parquet").to_pylist()
    rounds = pq.read_table(sweep / "rounds.parquet").to_pylist()
    meta = json.loads((sweep / "meta.json").read_text())
    wait_count(page, "#trials-table tbody tr", len(trials))
    assert sorted(table_ids(page)) == sorted(t["trial_id"] for t in trials)
    best = select_best_trial(trials, meta["mode"])
    assert page.evaluate("[...document.querySelectorAll('#trials-table tr.best')].map((tr) => tr.dataset.trialId)") == [best]
    assert page.inner_text("#trials-table tr.best td.mark") == "★"

    wait_count(page, "#curves-plot .scatterlayer .trace", len(trials))
    assert count(page, "#curves-plot .scatterlayer .trace .point") == sum(r.get(meta["metric"]) is not None for r in rounds)

    wait_count(page, "#parcoords-plot .parcoords .y-axis", len(swept_keys) + 1)
    titles = page.evaluate("[...document.querySelectorAll('#parcoords-plot .axis-title')].map((t) => t.textContent)")
    assert [any(key in title for title in titles) for key in swept_keys + [meta["metric"]]] == [True] * (len(swept_keys) + 1), titles
    lengths = page.evaluate("document.getElementById('parcoords-plot').data[0].dimensions.map((d) => d.values.length)")
    assert lengths == [len(trials)] * (len(swept_keys) + 1)
    assert count(page, "#scatter-plots .plot") == len(swept_keys)
    for key in swept_keys:  # every trial, plus the best one again as a star
        assert (
            page.evaluate("(id) => document.getElementById(id).querySelectorAll('.scatterlayer .point').length", f"scatter-{key}")
            == len(trials) + 1
        )

    page.wait_for_selector("#best-config:not([hidden])")
    best_yaml = page.inner_text("#best-config")
    copied = scratch / f"best-of-{sweep.name}.yaml"
    copied.write_text(best_yaml)
    config = load_config(copied)  # a valid `fedray run` file ...
    best_row = next(t for t in trials if t["trial_id"] == best)
    for key in swept_keys:  # ... with the best trial's swept values
        assert config_value(config, key) == pytest.approx(best_row[key])
    assert config.output.name is None  # and it will not overwrite the trial's directory
    return trials


# ---------------------------------------------------------------------------------------------------
# Sweeps made of real fedray runs


@needs_browser
@pytest.mark.slow
@on_the_real_sweep
def test_sweep_page_shows_trials_curves_parallel_coordinates_and_best_config(page, real_sweep, user_code_sweep, tmp_path):
    with serve(real_sweep) as server, user_code_importable(user_code_sweep.project):  # the best config names the user's code
        open_dashboard(page, server)
        check_sweep_page(page, real_sweep, list(SPACE), tmp_path)
        assert page.inner_text("#title") == real_sweep.name and "2 / 2 trials" in page.inner_text("#summary")
        assert page.inner_text("#sweep-status") == "finished"

        by_hidden = trials_by_hidden(real_sweep)
        page.click("#trials-table th[data-key='model.kwargs.hidden']")  # sort: largest first, then smallest first
        assert table_ids(page) == [by_hidden[LARGE], by_hidden[SMALL]]
        page.click("#trials-table th[data-key='model.kwargs.hidden']")
        assert table_ids(page) == [by_hidden[SMALL], by_hidden[LARGE]]

        page.click(f"#trials-table tbody tr[data-trial-id='{by_hidden[SMALL]}'] input[type=checkbox]")  # untick: one curve fewer
        wait_count(page, "#curves-plot .scatterlayer .trace", 1)
        screenshot(page, "dashboard_sweep.png")


@needs_browser
@pytest.mark.slow
@on_the_real_sweep
def test_trial_appended_to_the_parquet_files_appears_without_reload(page, real_sweep, tmp_path):
    sweep = tmp_path / real_sweep.name
    shutil.copytree(real_sweep, sweep, ignore=shutil.ignore_patterns("tune"))
    meta = json.loads((sweep / "meta.json").read_text())
    (sweep / "meta.json").write_text(json.dumps({**meta, "status": "running"}))  # a sweep that goes on (else RUNNING means INTERRUPTED)
    with serve(sweep) as server:
        open_dashboard(page, server)
        wait_count(page, "#trials-table tbody tr", 2)
        wait_count(page, "#curves-plot .scatterlayer .trace", 2)
        page.evaluate("window.sameDocument = true")

        trials = pq.read_table(sweep / "trials.parquet").to_pylist()
        a_trial = trials_by_hidden(sweep)[SMALL]
        shutil.copytree(sweep / "trials" / a_trial, sweep / "trials" / "new")  # its run directory, for the best config
        # better than every real trial (the first in table order wins a tie), so that it becomes the best
        accuracies = [0.9, max(0.99, max(t["best_metric"] for t in trials) + 0.01)]
        new_rounds = [{"trial_id": "new", **r} for r in synthetic_round_rows(accuracies)]
        write_table_atomically(pq.read_table(sweep / "rounds.parquet").to_pylist() + new_rounds, sweep / "rounds.parquet")
        swept = {"model.kwargs.hidden": 8, "algorithm.server_momentum": 0.9}
        new_trial = trial_row("new", swept, synthetic_round_rows(accuracies), status="RUNNING")
        write_table_atomically(trials + [new_trial], sweep / "trials.parquet")

        page.wait_for_selector("#trials-table tbody tr[data-trial-id='new']")
        wait_count(page, "#curves-plot .scatterlayer .trace", 3)
        page.wait_for_function("document.querySelector('#trials-table tr.best').dataset.trialId === 'new'")
        assert page.inner_text("#trials-table tr[data-trial-id='new'] td.status-RUNNING") == "RUNNING"
        page.wait_for_function("document.getElementById('parcoords-plot').data[0].dimensions[0].values.length === 3")
        assert page.evaluate("window.sameDocument") is True  # updated in place, not reloaded


@needs_browser
@pytest.mark.slow
@on_the_real_sweep
def test_clicking_a_trial_shows_its_run(page, real_sweep):
    trial_id = trials_by_hidden(real_sweep)[LARGE]
    with serve(real_sweep) as server:
        open_dashboard(page, server)
        page.click(f"#trials-table tbody tr[data-trial-id='{trial_id}'] td.status-TERMINATED")
        page.wait_for_function("(id) => document.getElementById('run-title').textContent === id", arg=trial_id)
        wait_count(page, "#run-accuracy-plot .scatterlayer .trace .point", ROUNDS)
        first_client_plot = "#run-clients .client-plot:first-child .boxlayer .point"
        wait_count(page, first_client_plot, CLIENTS)  # one point per client of the last round (all of them train)
        page.wait_for_function(
            "() => { const img = document.getElementById('partition-img'); return !img.hidden && img.complete && img.naturalWidth > 0 }"
        )
        assert f"hidden: {LARGE}" in page.text_content("#run-config")
        screenshot(page, "dashboard_run_view.png")


@needs_browser
@pytest.mark.slow
@on_the_real_sweep
def test_real_sweep_has_importance_history_and_a_timeline_of_what_its_trials_held(page, real_sweep):
    """On the folder ``fedray tune`` wrote: fANOVA importance of both swept keys (Optuna), both trials in the
    optimisation history, and one timeline bar per trial with the CPUs of its placement group (``placement.json``)."""
    pytest.importorskip("optuna", reason="needs optuna (pip install -e '.[test]')")
    trials = pq.read_table(real_sweep / "trials.parquet").to_pylist()
    bundles = [json.loads((real_sweep / t["run_dir"] / "placement.json").read_text())["bundles"] for t in trials]
    with serve(real_sweep) as server:
        open_dashboard(page, server)
        wait_count(page, "#importance-plot .bars .point", len(SPACE))
        keys = page.evaluate("document.getElementById('importance-plot').data[0].y")
        assert sorted(k.split(" ")[0] for k in keys) == sorted(SPACE)
        page.wait_for_function("document.querySelectorAll('#history-plot .scatterlayer .point').length === 2")
        timeline = page.evaluate("document.getElementById('timeline-plot').data.map((t) => ({name: t.name, y: t.y}))")
        assert sorted(timeline[0]["y"]) == sorted(t["trial_id"] for t in trials) and timeline[0]["name"] == "finished"
        held = next(t["y"] for t in timeline if t["name"] == "CPUs held")
        assert max(held) >= max(sum(b["CPU"] for b in trial_bundles) for trial_bundles in bundles)
        assert held[-1] == 0  # both trials ended and released what they held
        screenshot(page, "dashboard_real_sweep_views.png")


@needs_browser
@pytest.mark.slow
@on_the_real_sweep
def test_single_run_directory_opens_its_run_view(page, real_sweep):
    trial_id = trials_by_hidden(real_sweep)[SMALL]
    with serve(real_sweep / "trials" / trial_id) as server:
        open_dashboard(page, server)
        wait_count(page, "#trials-table tbody tr", 1)
        page.wait_for_function("(id) => document.getElementById('run-title').textContent === id", arg=trial_id)
        wait_count(page, "#run-accuracy-plot .scatterlayer .trace .point", ROUNDS)
        page.wait_for_function(
            "() => { const img = document.getElementById('partition-img'); return img.complete && img.naturalWidth > 0 }"
        )
        assert "No swept hyperparameters" in page.inner_text("#params-empty")


@pytest.mark.slow
@on_the_real_sweep
def test_fedray_tune_writes_what_the_dashboard_reads(real_sweep):
    """The sweep directory contract, seen from the dashboard's side, on a folder written by ``fedray tune``."""
    data = DashboardData(real_sweep)
    overview = data.overview()
    assert overview.kind == "sweep" and overview.messages == []  # nothing missing, nothing unreadable
    assert overview.swept_keys == list(SPACE) and len(overview.trials) == 2
    assert overview.categorical_keys == list(SPACE)  # grid and choice, read from the sweep.yaml that fedray tune wrote
    for trial in overview.trials:
        assert trial["status"] == "TERMINATED" and trial["round"] == ROUNDS and trial["run_dir"] == f"trials/{trial['trial_id']}"
        view = data.run_view(trial["trial_id"])
        assert view["messages"] == [] and view["run_dir"] == trial["run_dir"]
        assert len(view["curves"]["test_accuracy"]["round"]) == ROUNDS and view["clients"]["num_clients"] == CLIENTS
        log = data.run_log(trial["trial_id"])["text"]  # each trial's log.txt: a line per round, as `fedray run` shows it
        assert [f"round {r}/{ROUNDS}: loss=" in log for r in range(1, ROUNDS + 1)] == [True] * ROUNDS and "finished: final test acc." in log
        assert (
            data.curves([trial["trial_id"]], overview.metric)["curves"][trial["trial_id"]]["value"]
            == view["curves"]["test_accuracy"]["value"]
        )


# ---------------------------------------------------------------------------------------------------
# Comparison views, failures (sweep files written directly, no Ray)


def plot_data(page, div: str) -> list[dict]:
    return page.evaluate("(id) => document.getElementById(id).data.map((t) => ({name: t.name, fill: t.fill || null, n: t.x.length}))", div)


def group_rows(page) -> list[list[str]]:
    return page.evaluate("[...document.querySelectorAll('#groups-table tbody tr')].map((tr) => [...tr.cells].map((td) => td.textContent))")


@needs_browser
@pytest.mark.slow
def test_comparison_table_bands_labels_and_categorical_axes(page, tmp_path):
    sweep = tmp_path / "compare-20260102-030405"
    ids = write_comparison_sweep(sweep, running=("fedavg", 0.5, 1))
    best = ids[("fedsc", 0.5, 0)]
    write_run_dir(
        sweep / "trials" / best,
        [f"output.dir={sweep / 'trials'}", f"output.name={best}", "algorithm.name=fedsc", "data.alpha=0.5"],
        [0.3, 0.8],
    )
    with serve(sweep) as server:
        open_dashboard(page, server)
        wait_count(page, "#trials-table tbody tr", 12)
        # seed is swept: the page groups by the other listed-value keys and averages over seeds
        page.wait_for_selector("#groups-section:not([hidden])")
        checked = page.evaluate("[...document.querySelectorAll('#group-by input:checked')].map((i) => i.value)")
        assert checked == ["algorithm.name", "data.alpha"]
        wait_count(page, "#groups-table tbody tr", 6)
        rows = group_rows(page)
        assert rows[0] == ["", "fedavg", "0.1", "test_accuracy", "2", "57.95 ± 0.95", "61.00 ± 1.00", ""]
        assert rows[3][:6] == ["★", "fedsc", "0.5", "test_accuracy", "1", "76.00 ± 0.00"] and rows[3][-1] == "1"  # one failed, not averaged
        assert [r[1:4] for r in rows if r[0] == "★"] == [["fedsc", "0.5", "test_accuracy"], ["hetero_ssfl", "0.5", "probe_accuracy"]]
        assert "| fedavg | 0.1 | test_accuracy | 2 | 57.95 ± 0.95 |" in page.text_content("#groups-markdown")
        traces = plot_data(page, "curves-plot")  # per group: lower edge, upper edge filled to it, mean
        assert len(traces) == 18 and [t["fill"] for t in traces[:3]] == [None, "tonexty", None]
        assert traces[2]["name"] == "fedavg α=0.1 (n=2)" and traces[-1]["name"] == "★ hetero_ssfl α=0.5 [probe_accuracy] (n=2)"

        # categorical axes: the grid values as ticks; the log-uniform learning rate as a range
        dims = page.evaluate("document.getElementById('parcoords-plot').data[0].dimensions.map((d) => [d.label, d.ticktext || null])")
        assert dims[:3] == [
            ["algorithm.name", ["fedavg", "fedsc", "hetero_ssfl"]],
            ["data.alpha (α)", ["0.1", "0.5"]],
            ["seed", ["0", "1"]],
        ]
        assert dims[3][1] is None
        assert page.evaluate("document.getElementById('scatter-seed').layout.xaxis.type") == "category"

        # the best trial is ranked among supervised accuracies only; the probe's best is marked apart
        assert page.evaluate("document.querySelector('#trials-table tr.best').dataset.trialId") == best
        assert page.evaluate("document.querySelector('#trials-table tr.best-other').dataset.trialId") == ids[("hetero_ssfl", 0.5, 1)]
        page.wait_for_selector("#best-config:not([hidden])")
        assert page.inner_text("#best-summary").startswith("★ fedsc α=0.5 seed=0 lr=0.007")
        # the errored trial: failed, with its error in the table
        errored = f"#trials-table tr[data-trial-id='{ids[('fedsc', 0.5, 1)]}']"
        assert page.inner_text(f"{errored} td.status-ERROR") == "ERROR" and "prototypes of class 3" in page.inner_text(
            f"{errored} td.error-cell"
        )
        assert page.is_visible("#ray-link") and page.is_visible("#ray-token") and "ray get-auth-token" in page.inner_text("#ray-token")
        screenshot(page, "dashboard_compare_grouped.png")

        # the heatmap: x and y the first two swept keys, the sweep's metric; hetero_ssfl measures another quantity
        page.wait_for_function("document.getElementById('heatmap-plot').data?.[0]?.type === 'heatmap'")
        heatmap = page.evaluate("(({x, y, z, customdata}) => ({x, y, z, customdata}))(document.getElementById('heatmap-plot').data[0])")
        assert (heatmap["x"], heatmap["y"], heatmap["customdata"]) == (["fedavg", "fedsc"], ["0.1", "0.5"], [[2, 2], [2, 1]])
        assert heatmap["z"][0][0] == pytest.approx(0.95 * 0.61) and heatmap["z"][1][0] == pytest.approx((0.95 * 0.7 + 0.72) / 2)
        page.select_option("#heatmap-metric", "probe_accuracy")
        page.wait_for_function("document.getElementById('heatmap-plot').data[0].x.join() === 'hetero_ssfl'")
        page.select_option("#heatmap-x", "data.alpha")  # the other axis's key: the two swap
        page.wait_for_function("document.getElementById('heatmap-plot').data[0].y.join() === 'hetero_ssfl'")
        screenshot(page, "dashboard_heatmap.png")

        page.uncheck("#group-by input[value='algorithm.name']")  # by α only: supervised and probe groups stay apart
        page.wait_for_function("document.querySelectorAll('#groups-table tbody tr').length === 4")
        assert [r[1:3] for r in group_rows(page)] == [
            ["0.1", "test_accuracy"],
            ["0.1", "probe_accuracy"],
            ["0.5", "test_accuracy"],
            ["0.5", "probe_accuracy"],
        ]

        page.uncheck("#group-by input[value='data.alpha']")  # no grouping: one curve per trial, named by its values
        page.wait_for_selector("#groups-section", state="hidden")
        page.click("[data-select='all']")
        wait_count(page, "#curves-plot .scatterlayer .trace", 12)
        names = page.evaluate("document.getElementById('curves-plot').data.map((t) => t.meta)")  # full names (legends cut long ones)
        assert "★ fedsc α=0.5 seed=0 lr=0.007" in names and "★ hetero_ssfl α=0.5 seed=1 lr=0.012 [probe_accuracy]" in names
        assert not any("train_0" in name for name in names)
        screenshot(page, "dashboard_compare_trials.png")

        write_meta(
            sweep, ["algorithm.name", "data.alpha", "seed", "train.lr"], 12, status="failed", ray_dashboard_url="http://127.0.0.1:8265"
        )
        page.wait_for_function("document.getElementById('sweep-status').textContent === 'failed'")
        assert not page.is_visible("#ray-link") and not page.is_visible("#ray-token")  # the sweep's Ray is gone
        running = f"#trials-table tr[data-trial-id='{ids[('fedavg', 0.5, 1)]}']"
        assert page.inner_text(f"{running} td.status-INTERRUPTED") == "INTERRUPTED"


@needs_browser
@pytest.mark.slow
def test_folder_of_runs_of_different_algorithms_with_a_crashed_run(page, tmp_path):
    runs = tmp_path / "runs"
    write_run_dir(runs / "fedavg-1", ["algorithm.name=fedavg"], [0.3, 0.5, 0.6])
    write_run_dir(runs / "fedsc-1", ["algorithm.name=fedsc", "algorithm.tau=0.1"], [0.35, 0.6, 0.7])
    write_run_dir(runs / "fedsc-2", ["algorithm.name=fedsc", "algorithm.tau=0.5"], [0.3, 0.4], finished=False)
    age(runs / "fedsc-2", 3 * 3600)  # crashed three hours ago: no summary.json, no file written since
    with serve(runs) as server:
        open_dashboard(page, server)
        wait_count(page, "#trials-table tbody tr", 3)
        headers = page.evaluate("[...document.querySelectorAll('#trials-table th')].map((th) => th.dataset.key)")
        assert [h for h in headers if h.startswith("algorithm.")] == ["algorithm.name", "algorithm.tau"]  # not every FedSC default
        assert page.inner_text("#trials-table tr[data-trial-id='fedsc-2'] td.status-STALLED") == "STALLED"
        assert "fedray run --resume" in page.inner_text("#trials-table tr[data-trial-id='fedsc-2'] td.error-cell")
        wait_count(page, "#curves-plot .scatterlayer .trace", 3)
        assert sorted(t["name"] for t in plot_data(page, "curves-plot")) == ["fedavg", "fedsc τ=0.5", "★ fedsc τ=0.1"]
        assert page.evaluate("document.getElementById('scatter-algorithm.tau').layout.xaxis.type") == "category"
        tau = page.evaluate("document.getElementById('parcoords-plot').data[0].dimensions[1]")
        assert tau["ticktext"] == ["0.1", "0.5", "n/a"] and tau["values"] == [2, 0, 1]  # FedAvg has no τ: "n/a", not a value
        screenshot(page, "dashboard_runs_folder.png")


# ---------------------------------------------------------------------------------------------------
# Folders that are empty, half-written or gone; the CLI (no Ray)


@needs_browser
@pytest.mark.slow
def test_empty_then_half_written_then_valid_then_deleted_folder(page, tmp_path):
    sweep = tmp_path / "live-sweep"
    sweep.mkdir()
    with serve(sweep) as server:
        open_dashboard(page, server)
        page.wait_for_selector("#messages .message.info >> text=Nothing to show yet")
        assert count(page, "#trials-table tbody tr") == 0 and page.is_visible("#trials-empty")
        page.evaluate("window.sameDocument = true")

        write_meta(sweep, ["data.alpha"], 2)
        (sweep / "trials.parquet").write_bytes(b"PAR1 truncated")  # a non-atomic copy caught mid-way
        page.wait_for_selector("#messages .message.error >> text=trials.parquet could not be read")

        rows = {"a": synthetic_round_rows([0.3, 0.5]), "b": synthetic_round_rows([0.4, 0.45])}
        write_table_atomically([{"trial_id": t, **r} for t, rs in rows.items() for r in rs], sweep / "rounds.parquet")
        write_table_atomically([trial_row(t, {"data.alpha": a}, rows[t]) for t, a in (("a", 0.1), ("b", 1.0))], sweep / "trials.parquet")
        wait_count(page, "#trials-table tbody tr", 2)
        wait_count(page, "#curves-plot .scatterlayer .trace", 2)
        assert count(page, "#messages .message.error") == 0
        assert "has no config.yaml" in page.inner_text("#messages")  # best trial "a" has no run directory here

        shutil.rmtree(sweep)
        page.wait_for_selector("#messages .message.error >> text=does not exist")
        assert page.evaluate("window.sameDocument") is True


def test_cli_prints_the_url_and_serves_the_api(tmp_path):
    run = tmp_path / "runs" / "r1"
    write_run_dir(run, [], [0.2, 0.6])
    write_run_dir(tmp_path / "runs" / "r2", ["data.alpha=2.0"], [0.5, 0.4])
    process = subprocess.Popen(
        [sys.executable, "-m", "fedray.cli.main", "dashboard", str(tmp_path / "runs"), "--port", "0", "--allow-host", "lab-box"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = process.stdout.readline()
        match = re.search(r"(http://127\.0\.0\.1:\d+/)", line)
        assert match and "(runs)" in line, f"stdout: {line!r}"
        url = match.group(1)
        overview = json.loads(urllib.request.urlopen(url + "api/overview", timeout=10).read())
        assert [t["trial_id"] for t in overview["trials"]] == ["r1", "r2"] and overview["swept_keys"] == ["data.alpha"]
        assert overview["best_trial"] == "r1"
        assert b"<title>fedray dashboard</title>" in urllib.request.urlopen(url, timeout=10).read()
        assert urllib.request.urlopen(url + "static/plotly.min.js", timeout=10).read(100).lstrip().startswith(b"/**")
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(url + "api/file?trial=r1&name=metrics.parquet", timeout=10)
        assert missing.value.code == 404
        port = url.rsplit(":", 1)[1].strip("/")
        for host, status in ((f"lab-box:{port}", 200), (f"attacker.example:{port}", 403)):  # --allow-host adds a name
            request = urllib.request.Request(url + "api/version", headers={"Host": host})
            try:
                assert urllib.request.urlopen(request, timeout=10).status == status
            except urllib.error.HTTPError as error:
                assert error.code == status
    finally:
        process.terminate()
        process.wait(timeout=10)
