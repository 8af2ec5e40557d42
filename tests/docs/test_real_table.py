"""The bookkeeping of benchmarks/real_table.py (its one run on the local backend): which tuned values an entry gets,
which finished entries still count after a sweep changes them, and what an entry's result holds."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from fedray import load_config
from fedray.data.partition import partition_labels

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import real_table  # noqa: E402


def chosen(sweep: str, values: dict) -> dict[str, str]:
    return {"sweep": sweep, "trial_id": "t0", "hyperparameters": json.dumps(values, sort_keys=True), "chosen": "True"}


TUNING = [
    chosen("fedrcl", {"algorithm.beta": 2.0, "train.lr": 0.1}),
    chosen("hetero_ssfl", {"algorithm.mu": 2.0, "train.lr": 0.01}),
    {**chosen("fedavg", {"train.lr": 0.01}), "chosen": "False"},  # a losing trial is never applied
]


def test_an_entry_takes_its_sweeps_chosen_values():
    config = real_table.config_for("fedrcl", "dir0.1", 0, [], TUNING)
    assert (config.train.lr, config.algorithm.beta) == (0.1, 2.0)
    assert real_table.config_for("fedavg", "dir0.1", 0, [], TUNING).train.lr == 0.05  # its example's default


def test_a_variant_keeps_the_key_that_defines_it():
    ablation = real_table.config_for("fedrcl_beta0", "dir0.1", 0, [], TUNING)
    assert (ablation.train.lr, ablation.algorithm.beta) == (0.1, 0.0)
    local_ssl = real_table.config_for("hetero_ssfl_local", "classes2", 0, [], TUNING)
    assert (local_ssl.train.lr, local_ssl.algorithm.mu) == (0.01, 0.0)
    debiased = real_table.config_for("hetero_ssfl_debiased", "classes2", 0, [], TUNING)
    assert (debiased.train.lr, debiased.algorithm.mu) == (0.01, 2.0)


def row(algorithm: str, hyperparameters: str | None) -> dict[str, str]:
    result = {"group": "global", "algorithm": algorithm, "setting": "dir0.1", "seed": "0"}
    return result if hyperparameters is None else {**result, "hyperparameters": hyperparameters}


def test_a_finished_entry_counts_only_with_the_current_tuned_values():
    old_fedavg = row("fedavg", None)  # written before the CSV recorded values: the example's lr 0.05
    old_fedrcl = row("fedrcl", None)  # lr 0.05, β 1 by default; the tuning chose lr 0.1, β 2
    tuned_fedrcl = row("fedrcl", json.dumps({"algorithm.beta": 2.0, "train.lr": 0.1}, sort_keys=True))
    current = real_table.current_rows([old_fedavg, old_fedrcl, tuned_fedrcl], [], TUNING)
    assert current == [old_fedavg, tuned_fedrcl]


def test_replacing_an_entry_keeps_the_others(tmp_path):
    path = tmp_path / "results.csv"
    fields = ["group", "algorithm", "setting", "seed", "final"]
    real_table.write_csv(path, fields, [{**row("fedavg", None), "final": "0.1"}, {**row("fedprox", None), "final": "0.2"}])
    real_table.replace_entry(path, fields, ("global", "fedavg", "dir0.1", 0), [{**row("fedavg", None), "final": "0.3"}])
    assert sorted((r["algorithm"], r["final"]) for r in real_table.read_csv(path)) == [("fedavg", "0.3"), ("fedprox", "0.2")]


def test_every_table_algorithm_has_a_sweep():
    """Each row's config and its sweep's keys (loading a sweep checks every trial shape)."""
    assert set(real_table.sweep_order()) == {path.stem for path in real_table.SWEEPS.glob("*.yaml")}
    for spec in real_table.GROUPS.values():
        for algorithm in real_table.table_algorithms(spec):
            real_table.hyperparameters(real_table.config_for(algorithm, spec["settings"][0], 0, [], []), algorithm)


def test_a_diverged_seed_is_reported_not_averaged():
    rows = [{"final": "0.80", "diverged": ""}, {"final": "0.90", "diverged": ""}, {"final": "", "diverged": "diverged in round 7"}]
    assert real_table.cell(rows, "final", 3) == "85.00 ± 5.00 (1 diverged)"
    assert real_table.cell(rows[2:], "final", 2) == "diverged (1/2 seeds)"
    assert real_table.cell([], "final", 2) == "pending"


def test_the_tuning_table_counts_stopped_and_diverged_trials():
    def trial(status, rounds, metric, chosen=False):
        return {
            "sweep": "fedsc",
            "hyperparameters": '{"train.lr": 0.2}',
            "status": status,
            "rounds": str(rounds),
            "metric": "test_accuracy",
            "best_metric": metric,
            "chosen": str(chosen),
        }

    tuning = [
        trial("TERMINATED", 20, "0.8595", chosen=True),
        trial("TERMINATED", 20, "0.83"),
        trial("STOPPED_EARLY", 10, "0.65"),
        trial("ERROR", 0, ""),
    ]
    [line] = [line for line in real_table.tuning_lines(tuning) if line.startswith("| fedsc")]
    assert line == "| fedsc | `train.lr=0.2` | test_accuracy 85.95 | 2 / 1 / 1 |"


def test_excluded_updates_are_listed_per_entry_and_old_rows_are_not_counted():
    rows = [
        {**row("fedavg", None), "excluded_updates": "2"},
        {**row("fedprox", None), "excluded_updates": "0"},
        row("fedsc", None),  # written before the CSV counted them
        {**row("local", None), "group": "personalised", "excluded_updates": "5"},
    ]
    line = real_table.excluded_line(rows, "global")
    assert "fedavg dir0.1 seed 0: 2" in line and "fedprox" not in line and "local" not in line
    assert "(2 entries counted)" in line
    assert "none (0 entries counted)" in real_table.excluded_line(rows, "ssl")
    assert "local dir0.1 seed 0: 5 (1 entry counted)" in real_table.excluded_line(rows, "personalised")


def test_flatness_compares_the_last_fifth_of_the_rounds_with_the_fifth_before():
    def curve(algorithm, values_by_round):
        return [{**row(algorithm, None), "round": str(r), "value": str(v)} for r, v in values_by_round.items()]

    still_rising = curve("fedavg", {r: 0.5 + r / 200 for r in range(5, 101, 5)})  # +0.5 point per 5 rounds
    flat = curve("fedprox", {**{r: 0.6 for r in range(5, 81, 5)}, **{r: 0.6 for r in range(85, 101, 5)}})
    line = real_table.flatness_line(still_rising + flat, "global")
    assert "median +5.00 points over 2 entries" in line
    assert "largest +10.00 (fedavg dir0.1 seed 0)" in line
    assert real_table.flatness_line(flat, "ssl") == "Flattening: no finished curve yet."


def test_the_self_supervised_rows_train_every_client_of_five_every_round_on_two_whole_classes_each():
    for algorithm in real_table.table_algorithms(real_table.GROUPS["ssl"]):
        config = real_table.config_for(algorithm, "classes2", 0, [], TUNING)
        assert (config.data.num_clients, config.train.clients_per_round) == (5, 5)
        assert (config.train.local_epochs, config.train.rounds, config.eval.every) == (1, real_table.SSL_ROUNDS, 5)
    supervised = real_table.config_for("fedavg", "dir0.1", 0, [], TUNING)
    assert (supervised.data.num_clients, supervised.train.rounds) == (100, real_table.ROUNDS)
    # Fashion-MNIST's label counts (6,000 per class): each client holds all the images of its 2 classes.
    labels = np.repeat(np.arange(10), 6000)
    partition = partition_labels(labels, real_table.config_for("hetero_ssfl", "classes2", 0, [], TUNING).data, seed=0)
    classes = [set(labels[partition.client(k)].tolist()) for k in range(partition.num_clients)]
    assert all(len(c) == 2 for c in classes) and set().union(*classes) == set(range(10))
    assert partition.sizes.tolist() == [12000] * 5


def test_the_papers_algorithms_run_on_every_seed_before_the_other_algorithms():
    order = real_table.planned(list(real_table.GROUPS), None, [0, 1])
    first_more = min(order.index(e) for e in order if e[1] in real_table.GROUPS["global"]["more_algorithms"])
    assert all(e[1] in real_table.GROUPS[e[0]]["algorithms"] for e in order[:first_more])
    assert {e[3] for e in order[:first_more]} == {0, 1}
    assert order[0] == ("global", "fedavg", "dir0.1", 0) and order[first_more] == ("global", "scaffold", "dir0.1", 0)
    entries_per_seed = sum(len(s["settings"]) * len(real_table.table_algorithms(s)) for s in real_table.GROUPS.values())
    assert len(order) == len(set(order)) == 2 * entries_per_seed


def test_window_means_average_each_entrys_evaluations_inside_the_window_only():
    curve = [{**row("fedavg", None), "round": str(r), "value": str(r / 100)} for r in (75, 80, 85, 90, 95, 100)]
    last_fifth = real_table.fifths(100)[0]
    means = real_table.window_means(curve + [{**row("fedprox", None), "round": "50", "value": "0.5"}], last_fifth)
    assert means == {("global", "fedavg", "dir0.1", 0): 0.925}  # rounds 85–100; fedprox has none there


def test_a_diverged_entry_falls_back_to_the_lower_learning_rates_of_its_sweep_grid():
    assert real_table.fallback_learning_rates("fedavg", 0.2) == [0.1, 0.05]
    assert real_table.fallback_learning_rates("fedrcl_beta0", 0.1) == [0.05]  # FedRCL's grid
    assert real_table.fallback_learning_rates("fedavg", 0.05) == []


def test_a_fallback_result_is_marked_in_its_cell_and_listed():
    fell_back = {
        **row("fedavg", None),
        "group": "personalised",
        "setting": "shards2",
        "final": "0.9",
        "diverged": "",
        "lr": "0.1",
        "fell_back_from": "lr 0.2 diverged in round 3",
    }
    tuned = {**fell_back, "seed": "1", "final": "0.8", "lr": "0.2", "fell_back_from": ""}
    assert real_table.cell([fell_back, tuned], "final", 2) == "85.00 ± 5.00 (seed 0 lr 0.1†)"
    both = {**fell_back, "seed": "1", "final": "0.8"}
    assert real_table.cell([fell_back, both], "final", 2) == "85.00 ± 5.00 (lr 0.1†)"
    line = real_table.fallback_line([fell_back, tuned], "personalised")
    assert "fedavg shards2 seed 0 (lr 0.2 diverged in round 3; shown at lr 0.1)" in line and "seed 1" not in line
    assert real_table.fallback_line([tuned], "personalised").endswith("grid: none.")


def test_an_entry_that_collapses_falls_back_like_a_diverged_one():
    fedsc = [(85, 0.9102), (90, 0.9003), (95, 0.9003), (100, 0.0887)]  # FedSC, α = 0.5, lr 0.2: a finite blow-up
    fedcosr = [(25, 0.9174), (30, 0.2099), (100, 0.6460)]  # FedCoSR, Dirichlet 0.1, lr 0.2: recovered only partly
    fedskc = [(50, 0.8424), (95, 0.7100), (100, 0.5312)]  # the paper's FedSKC: it lost a third, a result, kept
    dead = [(5, 0.1), (10, 0.1), (100, 0.1)]  # FedSC, α = 0.1, seed 1, lr 0.2: blew up in round 2, never learned
    assert real_table.collapse(fedsc, 0.1) == "collapsed in round 100 (8.87 %, best before it 91.02 %)"
    assert real_table.collapse(fedcosr, 0.1) == "collapsed in round 30 (20.99 %, best before it 91.74 %)"
    assert real_table.collapse(fedskc, 0.1) == ""
    assert real_table.collapse(dead, 0.1) == "ended at chance level (10.00 %, best 10.00 %)"
    assert real_table.collapse([(5, 0.1), (100, 0.8)], 0.1) == ""  # a slow start is not a failure
    assert real_table.collapse([(5, 0.74), (50, 0.74)], None) == ""  # a probe has no chance level to check

    # Its earlier run is not repeated: the rates below it are tried, and the row says why.
    row = {"lr": "0.2", "fell_back_from": "", "collapse": real_table.collapse(fedsc, 0.1)}
    rates, failed = real_table.rates_left([0.2, 0.1, 0.05], row)
    assert (rates, failed) == ([0.1, 0.05], ["lr 0.2 collapsed in round 100 (8.87 %, best before it 91.02 %)"])
    after_a_divergence = {**row, "lr": "0.1", "fell_back_from": "lr 0.2 diverged in round 30"}
    assert real_table.rates_left([0.2, 0.1, 0.05], after_a_divergence) == (
        [0.05],
        ["lr 0.2 diverged in round 30", "lr 0.1 collapsed in round 100 (8.87 %, best before it 91.02 %)"],
    )
    assert real_table.rates_left([0.2, 0.1], None) == ([0.2, 0.1], [])


def test_the_summary_ranks_every_algorithm_and_bolds_the_best_with_every_seed():
    def entry(algorithm, setting, seed, value, diverged=""):
        return {
            **row(algorithm, None),
            "setting": setting,
            "seed": str(seed),
            "last_fifth": value,
            "diverged": diverged,
            "lr": "0.1",
            "fell_back_from": "",
        }

    results = [
        entry("fedavg", "dir0.1", 0, 0.80),
        entry("fedavg", "dir0.1", 1, 0.82),
        entry("fedrcl", "dir0.1", 0, 0.90),  # highest, but one seed only: never bold
        entry("fedprox", "dir0.1", 0, 0.84),
        entry("fedprox", "dir0.1", 1, 0.86),
        entry("scaffold", "dir0.1", 0, "", diverged="diverged in round 17"),
    ]
    lines = real_table.summary_lines(results, seeds_wanted=2)
    planned = len(real_table.planned(list(real_table.GROUPS), None, [0, 1]))
    assert lines[0].startswith(f"6 of {planned} entries of 2 seeds have finished; a cell marked (1/2 seeds) has not run")
    everything = [
        {**entry(algorithm, setting, seed, 0.8), "group": group, "final": 0.8}
        for group, algorithm, setting, seed in real_table.planned(list(real_table.GROUPS), None, [0, 1])
    ]
    assert real_table.summary_lines(everything, seeds_wanted=2)[0] == (
        f"All {planned} entries of 2 seeds have finished; † marks a seed run at a lower learning rate than its tuned one. ± is the "
        "standard deviation over the seeds with divisor n (for 2 seeds: half their gap)."
    )
    third_seed = [*everything, {**entry("fedavg", "dir0.1", 2, 0.8), "group": "global", "final": 0.8}]
    assert real_table.summary_lines(third_seed, seeds_wanted=2)[0].startswith(
        f"All {planned} entries of 2 seeds have finished, and 1 entry of further seeds; "
    )
    header = next(i for i, line in enumerate(lines) if line.startswith("| global model"))
    global_rows = lines[header + 2 : lines.index("", header)]
    assert len(global_rows) == len(real_table.table_algorithms(real_table.GROUPS["global"]))
    assert global_rows[:3] == [
        "| FedRCL | 90.00 (1/2 seeds) | pending |",
        "| FedProx | **85.00 ± 1.00** | pending |",
        "| FedAvg | 81.00 ± 1.00 | pending |",
    ]
    # a diverged entry ranks after every algorithm with a value
    assert global_rows.index("| SCAFFOLD | diverged (1/2 seeds) | pending |") > global_rows.index("| FedAvg | 81.00 ± 1.00 | pending |")
    # paired by seed against FedAvg: +4 points on both seeds (an interval of width 0, so bold); one seed
    # alone has no interval; a diverged entry has no pair
    paired = lines[next(i for i, line in enumerate(lines) if line.startswith("| global model: minus FedAvg")) :]
    assert "| FedProx | **+4.00 [+4.00, +4.00]** | – |" in paired
    assert "| FedRCL | +10.00 (n = 1) | – |" in paired and "| SCAFFOLD | – | – |" in paired
    assert not any(line.startswith("| FedAvg |") for line in paired[: paired.index("")])
    # every algorithm of every group has a row, under its readable name
    for spec in real_table.GROUPS.values():
        for algorithm in real_table.table_algorithms(spec):
            assert any(line.startswith(f"| {real_table.LABELS[algorithm]} | ") for line in lines)


def test_the_generated_blocks_replace_only_what_lies_between_their_markers(tmp_path):
    start, end = real_table.SUMMARY_START, real_table.SUMMARY_END
    text = f"intro\n{start}\nold table\n{end}\noutro\n"
    assert real_table.replace_between(text, start, end, "new table", tmp_path) == f"intro\n{start}\nnew table\n{end}\noutro\n"
    with pytest.raises(SystemExit, match="needs the lines"):
        real_table.replace_between("a page without markers", start, end, "new table", tmp_path)


def test_the_report_writes_the_summary_into_a_docs_page_and_keeps_its_prose(tmp_path):
    out, page = tmp_path / "fmnist.md", tmp_path / "fmnist_summary.md"
    start, end = real_table.SUMMARY_START, real_table.SUMMARY_END
    page.write_text(f"# At a glance\n\nprose before\n\n{start}\nstale table\n{end}\n\nprose after\n")
    real_table.report(out, 2, tmp_path / "runs", [], page)  # no results yet: every cell pending
    text = page.read_text()
    assert text.startswith("# At a glance\n\nprose before\n\n" + start + "\n")
    assert text.endswith(end + "\n\nprose after\n") and "stale table" not in text
    planned = len(real_table.planned(list(real_table.GROUPS), None, [0, 1]))
    assert f"0 of {planned} entries of 2 seeds have finished" in text
    assert "| FedAvg | pending | pending |" in text
    assert real_table.TABLE_START in out.read_text() and out.with_suffix(".png").is_file()
    page.unlink()
    real_table.report(out, 2, tmp_path / "runs", [], page)  # a missing page is created around the block
    assert page.read_text().startswith(f"# Fashion-MNIST summary\n\n{start}\n")


def test_the_default_report_targets_the_docs_and_never_the_readme():
    repo = Path(real_table.__file__).resolve().parents[1]
    assert real_table.DEFAULT_OUT == repo / "docs" / "results" / "fmnist.md"
    assert real_table.SUMMARY_PAGE == repo / "docs" / "results" / "fmnist_summary.md"
    summary = real_table.SUMMARY_PAGE.read_text()
    assert summary.count(real_table.SUMMARY_START) == 1 and summary.count(real_table.SUMMARY_END) == 1
    assert real_table.SUMMARY_START not in (repo / "README.md").read_text()
    for script in (repo / "benchmarks").glob("*.py"):  # no benchmark script writes the README
        assert "README.md" not in script.read_text(), script


@pytest.mark.slow
def test_an_entry_runs_once_then_is_read_back_with_its_totals(tmp_path, tiny_overrides):
    config = load_config(None, [*tiny_overrides, "eval.every=2", "resources.backend=local"])
    run_dir, spec = tmp_path / "entry", real_table.GROUPS["global"]
    result = real_table.run_or_resume(config, run_dir, spec)
    finished = (run_dir / "summary.json").stat().st_mtime_ns

    assert (result["rounds"], result["diverged"], result["excluded_updates"]) == (4, "", 0)
    assert [r for r, _ in result["curve"]] == [2, 4]
    assert result["final"] == result["curve"][-1][1] and result["best"] == max(v for _, v in result["curve"])
    assert result["seconds"] > 0 and result["seconds_per_round"] == pytest.approx(result["seconds"] / 4, abs=0.05)
    assert real_table.run_or_resume(config, run_dir, spec) == result  # read back, not run again
    assert (run_dir / "summary.json").stat().st_mtime_ns == finished


def test_diagnose_names_the_client_far_above_the_cohorts_median(tmp_path):
    from fedray.tracking.metrics_file import METRICS_FILE, write_table_atomically

    rows = []
    for round, (accuracy, control_norm, worst) in enumerate([(0.69, 0.5, 0.4), (None, 1.0, 47.8), (0.085, 39.4, 2709.0)], 1):
        rows.append(
            {
                "scope": "round",
                "round": round,
                "clients": 3,
                "train_loss": -1.0,
                "control_norm": control_norm,
                **({} if accuracy is None else {"test_accuracy": accuracy}),
            }
        )
        rows += [
            {"scope": "client", "round": round, "client_id": client, "train_loss": -5.0, "ce": ce}
            for client, ce in [(3, 0.2), (11, 0.3), (67, worst)]
        ]
    write_table_atomically(rows, tmp_path / METRICS_FILE)
    lines = real_table.diagnose(tmp_path, 2, 3).splitlines()
    assert lines[1] == "| round | test_accuracy | control_norm | median ce | largest ce (client) |"
    assert lines[3:] == ["| 2 |  | 1 | 0.3 | 47.8 (67) |", "| 3 | 8.50 | 39.4 | 0.3 | 2709 (67) |"]


def test_replaying_the_blow_up_warning_lists_only_the_runs_it_fires_in_or_that_collapsed(tmp_path):
    from fedray.tracking.metrics_file import METRICS_FILE, write_table_atomically

    for name, worst, accuracies in [("quiet", 0.5, [0.8, 0.85]), ("blows-up", 45.9, [0.8, 0.3])]:
        rows = []
        for round, accuracy in enumerate(accuracies, 1):
            rows.append({"scope": "round", "round": round, "test_accuracy": accuracy})
            rows += [{"scope": "client", "round": round, "client_id": c, "ce": ce} for c, ce in [(1, 0.2), (2, 0.3), (3, worst * round)]]
        (tmp_path / name).mkdir()
        write_table_atomically(rows, tmp_path / name / METRICS_FILE)
    lines = real_table.replay_warnings([tmp_path / "blows-up", tmp_path / "quiet"]).splitlines()
    assert lines[0].startswith("2 runs, 4 rounds with client rows")
    assert lines[3:] == ["| blows-up | 2 | 1, 2 | collapsed in round 2 (30.00 %, best before it 80.00 %) | 2 |"]


def test_a_row_with_a_further_seed_can_be_the_best_of_its_column():
    def result(algorithm: str, seed: int, value: float) -> dict[str, str]:
        return {**row(algorithm, None), "seed": str(seed), "final": str(value), "last_fifth": str(value), "diverged": ""}

    results = [result("fedavg", 0, 0.8), result("fedavg", 1, 0.8), *(result("fedprox", seed, 0.9) for seed in range(3))]
    lines = real_table.summary_lines(results, 2)
    assert "| FedProx | **90.00 ± 0.00** | pending |" in lines
    assert "| FedAvg | 80.00 ± 0.00 | pending |" in lines
