"""The run view's details and a folder of sweeps, in Chromium: each trial's ``log.txt`` (followed while the trial runs,
and a failed trial's traceback, written by the trial log around a real run that fails), the simulated devices' metrics of a run with
``systems.enabled`` (clients selected / aggregated / dropped / late and bytes per round, ``sim_time`` as the curves'
x-axis), the run's client summary (each client metric across the clients of each round, and each client's
participation), and several sweeps of one folder compared side by side.

The run with simulated devices is a real 4-round ``fedray run`` on the local backend (no Ray); the sweeps compared
are written in the sweep directory contract (``write_comparison_sweep``). Screenshots go to ``tests/artifacts/``.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from test_dashboard_browser import needs_browser, open_dashboard, screenshot, wait_count
from test_dashboard_data import serve, write_comparison_sweep, write_run_dir

from fedray import load_config
from fedray.dashboard.data import DashboardData
from fedray.tracking import write_table_atomically

NUM_CLIENTS = 12
SYSTEMS_RUN = [
    "resources.backend=local",
    "resources.num_workers=1",
    f"data.num_clients={NUM_CLIENTS}",
    "train.clients_per_round=4",
    "train.rounds=4",
    "train.local_epochs=1",
    "checkpoint.every=10",
    "output.tensorboard=false",
    "output.plots=false",
    "systems.enabled=true",
    "systems.availability.process=bernoulli",
    "systems.availability.probability=0.8",
    "systems.selection.over_selection=1.5",
    "systems.selection.dropout=0.3",
]
SYSTEMS_COUNTS = ["selected", "aggregated", "dropped", "late"]


@pytest.fixture(scope="module")
def systems_run(tmp_path_factory) -> Path:
    """A real 4-round FedAvg run with simulated devices (30 % dropout, 1.5× over-selection), on the local backend."""
    from fedray.runtime import run_experiment

    runs = tmp_path_factory.mktemp("runs")
    run_experiment(load_config(None, SYSTEMS_RUN + [f"output.dir={runs}", "output.name=devices"]), progress=False)
    return runs / "devices"


def metric_rows(run_dir: Path, scope: str) -> list[dict]:
    return [r for r in pq.read_table(run_dir / "metrics.parquet").to_pylist() if r["scope"] == scope]


def plot_traces(page, div: str) -> list[dict]:
    return page.evaluate("(id) => document.getElementById(id).data.map((t) => ({name: t.name, x: [...t.x], y: [...t.y]}))", div)


def expected_participation(client_rows: list[dict]) -> dict[int, int]:
    """Clients by the number of rounds they took part in, those never selected at 0."""
    rounds_of = Counter(r["client_id"] for r in client_rows)
    histogram = Counter(rounds_of.values())
    histogram[0] = NUM_CLIENTS - len(rounds_of)
    return {k: n for k, n in sorted(histogram.items()) if n}


# ---------------------------------------------------------------------------------------------------
# Simulated devices and the client summary (a real run, local backend)


def test_run_view_sends_the_simulated_clock_and_participation(systems_run):
    view = DashboardData(systems_run).run_view("devices")
    rounds = metric_rows(systems_run, "round")
    assert [r["sim_time"] for r in rounds] == view["curves"]["test_accuracy"]["sim_time"] and rounds[-1]["sim_time"] > 0
    clock = {r["round"]: r["sim_time"] for r in rounds}
    summary = view["client_summary"]["train_loss"]
    assert summary["sim_time"] == [clock[round] for round in summary["round"]]
    for name in SYSTEMS_COUNTS + ["bytes_up", "bytes_down"]:
        assert view["curves"][name]["value"] == [r[name] for r in rounds]
    histogram = expected_participation(metric_rows(systems_run, "client"))
    assert dict(zip(view["participation"]["rounds"], view["participation"]["clients"])) == histogram
    assert view["participation"]["num_clients"] == NUM_CLIENTS and sum(histogram.values()) == NUM_CLIENTS


@needs_browser
def test_run_view_draws_systems_metrics_against_simulated_time(page, systems_run):
    rounds = metric_rows(systems_run, "round")
    with serve(systems_run) as server:
        open_dashboard(page, server)
        page.wait_for_selector("#run-systems:not([hidden])")
        wait_count(page, "#run-clients-count-plot .scatterlayer .trace", 4)
        counts = plot_traces(page, "run-clients-count-plot")
        assert [t["name"] for t in counts] == SYSTEMS_COUNTS
        assert [t["y"] for t in counts] == [[r[name] for r in rounds] for name in SYSTEMS_COUNTS]
        assert any(r["dropped"] > 0 for r in rounds)  # the plot shows the dropouts the run drew
        transfer = plot_traces(page, "run-bytes-plot")
        assert [(t["name"], t["y"]) for t in transfer] == [(name, [r[name] for r in rounds]) for name in ("bytes_down", "bytes_up")]
        assert counts[0]["x"] == [r["round"] for r in rounds]

        # the simulated clock as the x-axis: the run's curves and the learning curves above
        page.select_option("#run-x", "sim_time")
        clock = [r["sim_time"] for r in rounds]
        page.wait_for_function(
            "(clock) => JSON.stringify(document.getElementById('run-accuracy-plot').data[0].x) === JSON.stringify(clock)", arg=clock
        )
        assert page.evaluate("document.getElementById('run-accuracy-plot').layout.xaxis.title.text") == "simulated time (s)"
        assert plot_traces(page, "run-clients-count-plot")[0]["x"] == clock
        assert page.input_value("#curve-x") == "sim_time"
        page.wait_for_function(
            "(clock) => JSON.stringify(document.getElementById('curves-plot').data[0].x) === JSON.stringify(clock)", arg=clock
        )
        page.locator("#run-systems").scroll_into_view_if_needed()
        screenshot(page, "dashboard_run_systems.png")


@needs_browser
def test_run_view_draws_the_client_summary_and_participation(page, systems_run):
    clients = metric_rows(systems_run, "client")
    by_round: dict[int, list[float]] = {}
    for row in clients:
        by_round.setdefault(row["round"], []).append(row["train_loss"])
    with serve(systems_run) as server:
        open_dashboard(page, server)
        page.wait_for_selector("#client-summary-title:not([hidden])")
        wait_count(page, "#run-summary-train_loss-plot .scatterlayer .trace", 5)  # min, max, q25, q75, median
        traces = page.evaluate(
            "document.getElementById('run-summary-train_loss-plot').data.map((t) => ({name: t.name, x: [...t.x], y: [...t.y]}))"
        )
        median = next(t for t in traces if t["name"] == "median")
        assert median["x"] == sorted(by_round)
        assert median["y"] == pytest.approx([float(np.median(by_round[r])) for r in sorted(by_round)])
        upper = [t for t in traces if t["name"] == "min–max"][0]
        assert upper["y"] == pytest.approx([max(by_round[r]) for r in sorted(by_round)])

        # against the simulated clock: each client round at the clock its round row reports
        clock = {r["round"]: r["sim_time"] for r in metric_rows(systems_run, "round")}
        page.select_option("#run-x", "sim_time")
        page.wait_for_function(
            "(clock) => document.getElementById('run-summary-train_loss-plot').data.every((t) => JSON.stringify(t.x) === JSON.stringify(clock))",
            arg=[clock[r] for r in sorted(by_round)],
        )
        summary_axis = page.evaluate("document.getElementById('run-summary-train_loss-plot').layout.xaxis.title.text")
        assert summary_axis == "simulated time (s)"
        page.select_option("#run-x", "round")

        bars = page.evaluate("document.getElementById('run-participation-plot').data[0]")
        assert dict(zip(bars["x"], bars["y"])) == expected_participation(clients)
        seen = len({r["client_id"] for r in clients})
        assert f"{seen} of {NUM_CLIENTS} clients took part" in page.inner_text("#client-summary-note")
        page.locator("#client-summary-title").scroll_into_view_if_needed()
        screenshot(page, "dashboard_run_client_summary.png")


# ---------------------------------------------------------------------------------------------------
# A trial's log


@needs_browser
def test_a_running_trial_log_is_followed_while_it_grows(page, tmp_path):
    sweep = tmp_path / "compare-20260102-030405"
    ids = write_comparison_sweep(sweep, running=("fedavg", 0.5, 1))
    running = ids[("fedavg", 0.5, 1)]
    run_dir = sweep / "trials" / running
    write_run_dir(run_dir, ["algorithm.name=fedavg", "data.alpha=0.5", "seed=1"], [0.3, 0.5, 0.6], finished=False)
    log = run_dir / "log.txt"
    log.write_text(
        f"2026-01-02 03:04:05 trial {running} started from round 1 of 4, in {running}\n2026-01-02 03:04:09 round 1/4: loss=1.234\n"
    )
    with serve(sweep) as server:
        open_dashboard(page, server)
        page.click(f"#trials-table tbody tr[data-trial-id='{running}'] td.status-RUNNING")
        page.wait_for_function("document.getElementById('run-log').textContent.includes('round 1/4: loss=1.234')")
        assert "follows the trial while it runs" in page.inner_text("#run-log-note")
        version = page.evaluate("document.body.dataset.version")
        with log.open("a") as file:  # the trial writes on; no result file changes
            file.write("2026-01-02 03:04:13 warning: round 2: 1 non-finite client update(s) excluded: [3]\n")
        page.wait_for_function("document.getElementById('run-log').textContent.includes('non-finite client update(s) excluded: [3]')")
        assert page.evaluate("document.body.dataset.version") == version
        assert page.get_attribute("#run-log-file", "href").startswith("/api/file?")

        finished = ids[("fedavg", 0.1, 0)]  # a trial without log.txt (a run from before fedray tune wrote one)
        write_run_dir(sweep / "trials" / finished, ["algorithm.name=fedavg"], [0.3], finished=True)
        page.evaluate("(id) => openRun(id)", finished)
        page.wait_for_selector("#run-log-empty:not([hidden])")
        assert "No log.txt" in page.inner_text("#run-log-empty") and not page.is_visible("#run-log")


def test_trial_log_keeps_warnings_and_the_traceback_of_a_run_that_fails(tmp_path, caplog):
    """The trial log around a real run (local backend, no Ray) that diverges in round 1: the engine's warning is in
    the file and still reaches the process's own logging, then the whole traceback."""
    from fedray.runtime import run_experiment
    from fedray.runtime.errors import TrainingDiverged
    from fedray.tune.trial_log import TrialLog

    overrides = [o for o in SYSTEMS_RUN if not o.startswith("systems.")] + [f"output.dir={tmp_path}", "output.name=t0", "train.lr=1e15"]
    config = load_config(None, overrides)
    with pytest.raises(TrainingDiverged), TrialLog(tmp_path / "t0", "t0") as log:
        run_experiment(config, run_dir=tmp_path / "t0", progress=False, extra_callbacks=[log])
    text = (tmp_path / "t0" / "log.txt").read_text()
    assert "trial t0 started from round 1 of 4" in text
    assert "round 1: 4 non-finite client update(s) excluded" in text
    assert any("non-finite client update(s) excluded" in record.getMessage() for record in caplog.records)  # not taken from it
    assert text.index("excluded") < text.index("the trial failed:\nTraceback (most recent call last):") < text.index("TrainingDiverged")


@pytest.fixture(scope="module")
def failed_trial_sweep(tmp_path_factory) -> tuple[Path, str]:
    """A sweep (in the sweep directory contract) whose errored trial's ``log.txt`` is written by the trial log around a
    real run that diverges in round 1 (local backend, no Ray). (The log of a failed trial of a real ``fedray tune``
    sweep on Ray is checked by ``test_e2e_tune_reuse.py::test_a_failed_trial_logs_its_traceback``.)"""
    from fedray.runtime import run_experiment
    from fedray.runtime.errors import TrainingDiverged
    from fedray.tune.trial_log import TrialLog

    root = tmp_path_factory.mktemp("sweeps")
    sweep = root / "compare-20260102-030405"
    errored = ("fedsc", 0.5, 1)
    trial_id = write_comparison_sweep(sweep, status="finished", errored=errored)[errored]
    run_dir = sweep / "trials" / trial_id
    write_run_dir(run_dir, ["algorithm.name=fedavg", "train.lr=1e15"], [0.3], finished=False)
    overrides = [o for o in SYSTEMS_RUN if not o.startswith("systems.")] + [f"output.dir={root}", "output.name=run", "train.lr=1e15"]
    with pytest.raises(TrainingDiverged), TrialLog(run_dir, trial_id) as log:
        run_experiment(load_config(None, overrides), run_dir=root / "run", progress=False, extra_callbacks=[log])
    return sweep, trial_id


@needs_browser
def test_failed_trial_traceback_is_readable_in_the_dashboard(page, failed_trial_sweep):
    sweep, diverged = failed_trial_sweep
    assert "Traceback (most recent call last)" in (sweep / "trials" / diverged / "log.txt").read_text()
    with serve(sweep) as server:
        open_dashboard(page, server)
        page.click(f"#trials-table tbody tr[data-trial-id='{diverged}'] td.status-ERROR")
        page.wait_for_function("document.getElementById('run-log').textContent.includes('Traceback (most recent call last)')")
        text = page.text_content("#run-log")
        assert "TrainingDiverged" in text and str(sweep) not in text  # no absolute path of the served folder
        assert page.evaluate("document.getElementById('run-log').classList.contains('failed')")
        assert "its traceback is at the end" in page.inner_text("#run-log-note")
        page.locator("#run-log").scroll_into_view_if_needed()
        screenshot(page, "dashboard_trial_log_failed.png")


# ---------------------------------------------------------------------------------------------------
# A folder of sweeps, compared side by side


def write_scaled_sweep(sweep: Path, factor: float, errored: tuple) -> None:
    """A comparison sweep whose accuracies are ``factor`` × those of ``write_comparison_sweep``."""
    write_comparison_sweep(sweep, status="finished", errored=errored, ray_dashboard_url=None)
    for name, columns in (("trials.parquet", ("latest_metric", "best_metric")), ("rounds.parquet", ("test_accuracy", "probe_accuracy"))):
        rows = pq.read_table(sweep / name).to_pylist()
        scaled = [{k: v * factor if k in columns and v is not None else v for k, v in row.items()} for row in rows]
        write_table_atomically(scaled, sweep / name)


@needs_browser
def test_folder_of_sweeps_compared_side_by_side(page, tmp_path):
    sweeps = tmp_path / "sweeps"
    shapes = {"a-sweep": (1.0, ("fedsc", 0.5, 1)), "b-sweep": (0.9, ("fedavg", 0.1, 0)), "c-sweep": (0.8, ("fedsc", 0.1, 0))}
    for name, (factor, errored) in shapes.items():
        write_scaled_sweep(sweeps / name, factor, errored)
    with serve(sweeps) as server:
        open_dashboard(page, server)
        wait_count(page, "#sweeps-table tbody tr", 3)
        assert page.is_visible("#sweeps-section") and not page.is_visible("#trials-section")
        assert page.inner_text("#kind") == "folder of sweeps"
        wait_count(page, "#compare-best-plot .boxlayer .trace", 3)  # every sweep ticked at first

        boxes = page.evaluate(
            "document.getElementById('compare-best-plot').data.filter((t) => t.type === 'box').map((t) => ({name: t.name, y: [...t.y], color: t.marker.color}))"
        )
        for box, (name, _) in zip(boxes, shapes.items()):
            rows = pq.read_table(sweeps / name / "trials.parquet").to_pylist()
            counted = [
                r["best_metric"] for r in rows if r["status"] != "ERROR" and r["algorithm.name"] != "hetero_ssfl"
            ]  # its own quantity
            assert box["name"] == f"{name} (test_accuracy)" and box["y"] == pytest.approx(counted)
        swatches = page.evaluate(
            "[...document.querySelectorAll('#sweeps-table td.swatch span')].map((s) => getComputedStyle(s).backgroundColor)"
        )
        assert len({b["color"] for b in boxes}) == 3 and len(set(swatches)) == 3  # one colour per sweep

        curves = page.evaluate(
            "document.getElementById('compare-curves-plot').data.map((t) => ({name: t.name, color: t.line.color, legend: t.showlegend}))"
        )
        assert len(curves) == 30  # the 10 best trials of each sweep
        assert [c["name"] for c in curves if c["legend"]] == list(shapes)  # one legend entry per sweep
        for name in shapes:
            assert len({c["color"] for c in curves if c["name"] == name}) == 1
        assert len({c["color"] for c in curves}) == 3
        assert page.evaluate("document.querySelectorAll('#compare-curves-plot .legend .traces').length") == 3
        screenshot(page, "dashboard_sweeps_compared.png")

        page.uncheck("#sweeps-table tr[data-sweep='c-sweep'] input")
        wait_count(page, "#compare-best-plot .boxlayer .trace", 2)
        page.wait_for_function("document.getElementById('compare-curves-plot').data.length === 20")
        page.uncheck("#sweeps-table tr[data-sweep='b-sweep'] input")
        page.wait_for_selector("#compare-empty:not([hidden])")
        assert "Tick two or more sweeps" in page.inner_text("#compare-empty")
