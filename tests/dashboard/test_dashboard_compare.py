"""The dashboard's comparison views on files in the sweep directory contract (no Ray, no browser): trials
named by their swept values, the grouped mean ± std table and bands, categorical keys, ranking only within
one quantity (a linear probe's accuracy apart from supervised accuracy), failed / interrupted / stalled
trials and runs, folders of runs of different algorithms, and nothing read or shown from outside the folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_dashboard_data import age, comparison_accuracies, write_comparison_sweep, write_run_dir

from fedray.dashboard.data import DashboardData, group_trials, key_symbols, label_trials, trial_label


@pytest.fixture
def comparison(tmp_path) -> tuple[Path, dict[tuple, str]]:
    sweep = tmp_path / "compare-20260102-030405"
    return sweep, write_comparison_sweep(sweep)


# ---------------------------------------------------------------------------------------------------
# Names


def test_trial_label_uses_symbols_and_rounds_numbers():
    keys = ["algorithm.name", "algorithm.tau", "algorithm.num_neighbors", "data.alpha"]
    assert (
        trial_label({"algorithm.name": "fedsc", "algorithm.tau": 0.1, "algorithm.num_neighbors": 3, "data.alpha": 0.5}, keys)
        == "fedsc τ=0.1 M=3 α=0.5"
    )
    assert (
        trial_label(
            {"algorithm.beta": 0.30000000000000004, "algorithm.mu": 0.0123456789, "train.lr": 1e-05},
            ["algorithm.beta", "algorithm.mu", "train.lr"],
        )
        == "β=0.3 μ=0.01235 lr=1e-05"
    )
    assert (
        trial_label({"algorithm.name": "fedavg", "algorithm.tau": None}, ["algorithm.name", "algorithm.tau"]) == "fedavg"
    )  # τ does not apply
    assert key_symbols(["data.name", "model.name", "seed"]) == {"data.name": "data.name", "model.name": "model.name", "seed": "seed"}


def test_equal_labels_get_the_trial_id():
    trials = [{"trial_id": "a", "data.alpha": 0.5}, {"trial_id": "b", "data.alpha": 0.5}, {"trial_id": "c", "data.alpha": 1.0}]
    label_trials(trials, ["data.alpha"])
    assert [t["label"] for t in trials] == ["α=0.5 (a)", "α=0.5 (b)", "α=1"]
    label_trials(trials, [])
    assert [t["label"] for t in trials] == ["a", "b", "c"]


def test_sweep_trials_are_labelled_by_their_swept_values(comparison):
    sweep, ids = comparison
    trials = {t["trial_id"]: t for t in DashboardData(sweep).overview().trials}
    assert trials[ids[("fedsc", 0.5, 0)]]["label"] == "fedsc α=0.5 seed=0 lr=0.007"


# ---------------------------------------------------------------------------------------------------
# Ranking within one quantity


def test_best_trial_is_ranked_only_against_the_same_quantity(comparison):
    sweep, ids = comparison
    overview = DashboardData(sweep).overview()
    names = {t["trial_id"]: t["metric_name"] for t in overview.trials}
    assert {names[ids[("hetero_ssfl", 0.1, 0)]], names[ids[("fedavg", 0.1, 0)]]} == {"probe_accuracy", "test_accuracy"}
    # hetero_ssfl's linear-probe accuracy is the largest test_accuracy number, yet not "the best trial"
    assert overview.best_trial == ids[("fedsc", 0.5, 0)]
    assert overview.best_by_metric == {"test_accuracy": ids[("fedsc", 0.5, 0)], "probe_accuracy": ids[("hetero_ssfl", 0.5, 1)]}
    assert any("ranked among themselves" in m.text for m in overview.messages)


# ---------------------------------------------------------------------------------------------------
# The grouped comparison table and bands


def test_group_by_algorithm_and_alpha_averages_over_seeds(comparison):
    sweep, ids = comparison
    result = DashboardData(sweep).groups(["algorithm.name", "data.alpha", "no.such.key"], "test_accuracy")
    assert result["by"] == ["algorithm.name", "data.alpha"]
    groups = {g["label"]: g for g in result["groups"]}
    assert list(groups) == [
        "fedavg α=0.1",
        "fedavg α=0.5",
        "fedsc α=0.1",
        "fedsc α=0.5",
        "hetero_ssfl α=0.1 [probe_accuracy]",
        "hetero_ssfl α=0.5 [probe_accuracy]",
    ]
    fedavg = groups["fedavg α=0.1"]
    finals = [comparison_accuracies("fedavg", 0.1, seed)[-1] for seed in (0, 1)]  # 0.57, 0.589
    assert fedavg["final"] == {"mean": pytest.approx(sum(finals) / 2), "std": pytest.approx(abs(finals[0] - finals[1]) / 2), "n": 2}
    assert fedavg["best"] == {"mean": pytest.approx(0.61), "std": pytest.approx(0.01), "n": 2}
    assert sorted(fedavg["trial_ids"]) == sorted([ids[("fedavg", 0.1, 0)], ids[("fedavg", 0.1, 1)]])
    # the errored trial is listed as failed, not averaged in
    fedsc = groups["fedsc α=0.5"]
    assert fedsc["failed"] == [ids[("fedsc", 0.5, 1)]] and fedsc["final"] == {"mean": pytest.approx(0.76), "std": 0.0, "n": 1}
    # the best group within each quantity, never across them
    assert [g["label"] for g in result["groups"] if g["best_group"]] == ["fedsc α=0.5", "hetero_ssfl α=0.5 [probe_accuracy]"]
    # the band: mean ± std over the two seeds, round by round
    curve = fedavg["curve"]
    assert curve["round"] == [1, 2, 3, 4] and curve["n"] == [2, 2, 2, 2]
    assert curve["mean"] == pytest.approx([0.61 * f for f in (0.4, 0.7, 1.0, 0.95)])
    assert curve["std"] == pytest.approx([0.01 * f for f in (0.4, 0.7, 1.0, 0.95)])


def test_no_group_key_puts_each_quantity_in_one_group():
    trials = [
        {"trial_id": "a", "status": "TERMINATED", "metric_name": "m", "latest_metric": 1.0, "best_metric": 2.0},
        {"trial_id": "b", "status": "RUNNING", "metric_name": "m", "latest_metric": 3.0, "best_metric": 4.0},
    ]
    [group] = group_trials(trials, [], "min", "m")
    assert group["label"] == "all trials" and group["final"] == {"mean": 2.0, "std": 1.0, "n": 2} and group["best_group"]


# ---------------------------------------------------------------------------------------------------
# Categorical axes


def test_grid_and_choice_keys_are_categorical(comparison):
    sweep, _ = comparison
    assert DashboardData(sweep).overview().categorical_keys == ["algorithm.name", "data.alpha", "seed"]  # not the log-uniform lr
    (sweep / "sweep.yaml").unlink()  # without the spec: integers and text are categories, other numbers ranges
    assert DashboardData(sweep).overview().categorical_keys == ["algorithm.name", "seed"]


# ---------------------------------------------------------------------------------------------------
# Failed, interrupted, stalled


def test_errored_trial_shows_as_failed_with_its_error(comparison):
    sweep, ids = comparison
    overview = DashboardData(sweep).overview()
    trial = next(t for t in overview.trials if t["trial_id"] == ids[("fedsc", 0.5, 1)])
    assert trial["status"] == "ERROR" and trial["error"] == "ValueError: fedsc: the prototypes of class 3 are empty"
    assert any(m.level == "error" and "1 of 12 trials failed" in m.text and "prototypes of class 3" in m.text for m in overview.messages)


def test_running_sweep_links_ray_until_it_ends(tmp_path):
    sweep = tmp_path / "s"
    ids = write_comparison_sweep(sweep, running=("fedavg", 0.5, 1))
    overview = DashboardData(sweep).overview()
    assert overview.status == "running" and overview.ray_dashboard_url == "http://127.0.0.1:8265"
    assert next(t for t in overview.trials if t["trial_id"] == ids[("fedavg", 0.5, 1)])["status"] == "RUNNING"

    write_comparison_sweep(sweep, status="failed", running=("fedavg", 0.5, 1))  # e.g. Ctrl+C
    overview = DashboardData(sweep).overview()
    trial = next(t for t in overview.trials if t["trial_id"] == ids[("fedavg", 0.5, 1)])
    assert overview.ray_dashboard_url is None  # that Ray is gone with the sweep
    assert trial["status"] == "INTERRUPTED" and "fedray tune --resume" in trial["error"]


def test_running_sweep_whose_files_stopped_changing_is_stalled(tmp_path):
    sweep = tmp_path / "s"
    ids = write_comparison_sweep(sweep, running=("fedavg", 0.5, 1))
    data = DashboardData(sweep)
    assert data.overview().status == "running"
    age(sweep, 3 * 3600)  # the driver was killed 3 hours ago
    overview = data.overview()  # the version changes with the staleness, not only with the files
    assert overview.status == "stalled" and overview.ray_dashboard_url is None
    assert next(t for t in overview.trials if t["trial_id"] == ids[("fedavg", 0.5, 1)])["status"] == "INTERRUPTED"
    assert any("3 h 00 min" in m.text and "--resume" in m.text for m in overview.messages)


def test_run_without_summary_and_without_progress_is_stalled(tmp_path):
    write_run_dir(tmp_path / "done", ["algorithm.name=fedavg"], [0.5, 0.6])
    write_run_dir(tmp_path / "live", ["algorithm.name=fedprox"], [0.4], finished=False)
    write_run_dir(tmp_path / "dead", ["algorithm.name=fedsc"], [0.3, 0.35], finished=False)
    age(tmp_path / "dead", 2 * 3600)
    data = DashboardData(tmp_path)
    trials = {t["trial_id"]: t for t in data.overview().trials}
    assert [trials[n]["status"] for n in ("dead", "done", "live")] == ["STALLED", "TERMINATED", "RUNNING"]
    assert (
        "no summary.json and no file written for 2 h 00 min" in trials["dead"]["error"] and "fedray run --resume" in trials["dead"]["error"]
    )
    [group] = [g for g in data.groups(["algorithm.name"], "test_accuracy")["groups"] if g["values"]["algorithm.name"] == "fedsc"]
    assert group["failed"] == ["dead"] and group["final"]["n"] == 0


def test_folder_of_runs_of_different_algorithms_shows_what_was_varied(tmp_path):
    write_run_dir(tmp_path / "a", ["algorithm.name=fedavg"], [0.5, 0.6])
    write_run_dir(tmp_path / "b", ["algorithm.name=fedsc", "algorithm.tau=0.1"], [0.5, 0.7])
    write_run_dir(tmp_path / "c", ["algorithm.name=fedsc", "algorithm.tau=0.2"], [0.5, 0.65])
    overview = DashboardData(tmp_path).overview()
    assert overview.swept_keys == ["algorithm.name", "algorithm.tau"]  # not every FedSC default
    assert [t["label"] for t in overview.trials] == ["fedavg", "fedsc τ=0.1", "fedsc τ=0.2"]
    assert overview.categorical_keys == ["algorithm.name", "algorithm.tau"] and overview.best_trial == "b"


# ---------------------------------------------------------------------------------------------------
# Nothing from outside the folder


@pytest.fixture
def outside(tmp_path) -> Path:
    """A run directory and a secret file outside the served folder."""
    elsewhere = tmp_path / "elsewhere"
    write_run_dir(elsewhere / "run", ["algorithm.name=fedprox"], [0.99])
    (elsewhere / "secret.txt").write_text("root:x:0:0:secret\n")
    return elsewhere


def test_linked_files_and_run_directories_outside_the_folder_are_ignored(tmp_path, outside):
    served = tmp_path / "runs"
    write_run_dir(served / "mine", [], [0.5, 0.6])
    (served / "mine" / "summary.json").unlink()
    (served / "mine" / "summary.json").symlink_to(outside / "secret.txt")
    (served / "mine" / "partition.png").unlink()
    (served / "mine" / "partition.png").symlink_to("/etc/passwd")
    (served / "theirs").symlink_to(outside / "run", target_is_directory=True)
    data = DashboardData(served)
    overview = data.overview()
    assert [t["trial_id"] for t in overview.trials] == ["mine"]
    assert data.run_file("mine", "summary.json") is None and data.run_file("mine", "partition.png") is None
    view = data.run_view("mine")
    assert view["summary"] is None and "summary.json" not in view["files"] and "partition.png" not in view["files"]
    assert any("link to outside the served folder" in m["text"] for m in view["messages"])
    assert not data.run_view("theirs")["found"] and data.curves(["theirs"], "test_accuracy")["curves"] == {}
    assert data.run_file("theirs", "config.yaml") is None


def test_linked_trial_directory_of_a_sweep_outside_the_folder_is_ignored(comparison, outside):
    sweep, ids = comparison
    (sweep / "trials").mkdir()
    (sweep / "trials" / ids[("fedsc", 0.5, 0)]).symlink_to(outside / "run", target_is_directory=True)
    data = DashboardData(sweep)
    assert data.overview().best_config is None  # the best trial's config is that of a run elsewhere: not read
    assert data.trial_run_dir(ids[("fedsc", 0.5, 0)]) is None and data.run_file(ids[("fedsc", 0.5, 0)], "config.yaml") is None
    assert data.run_view(ids[("fedsc", 0.5, 0)])["run_dir"] is None


def test_no_absolute_path_in_what_the_page_gets(tmp_path, comparison):
    sweep, ids = comparison
    write_run_dir(tmp_path / "runs" / "r1", [], [0.3], finished=False)
    (tmp_path / "runs" / "r1" / "metrics.parquet").write_bytes(b"PAR1 half")  # an error message naming the file
    for data in (DashboardData(sweep), DashboardData(tmp_path / "runs"), DashboardData(tmp_path / "gone")):
        overview = data.overview()
        payloads = [
            overview.to_json(),
            data.groups(overview.swept_keys, overview.metric),
            data.curves([t["trial_id"] for t in overview.trials], overview.metric),
        ]
        payloads += [
            {k: v for k, v in data.run_view(t["trial_id"]).items() if k != "config"} for t in overview.trials
        ]  # config: the file as written
        payloads.append(data.run_view("nope"))
        text = json.dumps(payloads, ensure_ascii=False)
        assert str(tmp_path) not in text, text[:2000]
    assert any("r1" in m.text and "could not be read" in m.text for m in DashboardData(tmp_path / "runs").overview().messages)
