"""comparison.md's paired comparison of algorithms (each algorithm minus the reference, seed by seed, with a
Student's t interval), the sweep file's ``reference``, and the clients' distribution columns — on sweep
directories written in the contract's files (``write_meta``, ``trials.parquet``, ``rounds.parquet`` and the
``sweep.yaml`` ``fedray tune`` writes), without Ray."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from test_tune_spec import TINY_BASE, spec_from, write_sweep

from fedray.config import ConfigError
from fedray.tune.spec import SweepSpec
from fedray.tune.summary import comparison_markdown, paired_rows, sweep_paired_comparison

ALPHAS = (0.1, 0.5)
SEEDS = (0, 1, 2)
# Final test_accuracy by (algorithm, α, seed); None: the trial errored.
FINAL = {
    "fedavg": {0.1: [0.50, 0.60, 0.70], 0.5: [0.80, 0.70, 0.75]},
    "fedprox": {0.1: [0.52, 0.63, 0.74], 0.5: [0.85, 0.65, 0.78]},  # α=0.1: +2, +3, +4 points; α=0.5: +5, -5, +3
    "scaffold": {0.1: [0.40, 0.49, 0.58], 0.5: [0.82, None, None]},  # α=0.1: -10, -11, -12 points; α=0.5: one seed
}


def sweep_spec(tmp_path: Path, algorithms: list[str], metric: str = "test_accuracy", mode: str = "max", **fields) -> SweepSpec:
    """A sweep spec over algorithms × α × seed (validated as a sweep file is, without building every trial's data)."""
    space = {"algorithm.name": {"grid": algorithms}, "data.alpha": {"grid": list(ALPHAS)}, "seed": {"grid": list(SEEDS)}}
    spec = SweepSpec.model_validate({"name": "paired", "base": TINY_BASE, "space": space, "output": {"dir": str(tmp_path)}, **fields})
    spec.metric, spec.mode = metric, mode
    return spec


def write_paired_sweep(tmp_path: Path, spec: SweepSpec, final: dict, metric: str = "test_accuracy", extra: dict | None = None) -> Path:
    """The sweep directory of ``spec`` whose trials end with the ``final`` values (and the ``extra`` round
    columns, by trial shape), with the ``sweep.yaml`` that ``fedray tune`` writes."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    trials, rounds = [], []
    for algorithm, by_alpha in final.items():
        for alpha, values in by_alpha.items():
            for seed, value in enumerate(values):
                trial_id = f"{algorithm}-{alpha}-{seed}"
                status, error = ("ERROR", "RuntimeError: diverged") if value is None else ("TERMINATED", None)
                trials.append(
                    {
                        "trial_id": trial_id,
                        "status": status,
                        "algorithm.name": algorithm,
                        "data.alpha": alpha,
                        "seed": seed,
                        "best_metric": value,
                        "best_round": 2,
                        "round": 2,
                        "error": error,
                    }
                )
                if value is not None:
                    row = {"trial_id": trial_id, "round": 2, metric: value, **(extra or {}).get((algorithm, alpha, seed), {})}
                    rounds += [{"trial_id": trial_id, "round": 1, metric: 0.1}, row]
    write_sweep(tmp_path, spec, trials, rounds)
    (tmp_path / "sweep.yaml").write_text(spec.to_yaml())
    return tmp_path


def differences(algorithm: str, alpha: float, reference: str = "fedavg") -> np.ndarray:
    return np.array([a - b for a, b in zip(FINAL[algorithm][alpha], FINAL[reference][alpha]) if a is not None and b is not None])


def row_of(rows: list[dict], algorithm: str, column: str) -> dict:
    (row,) = [r for r in rows if r["algorithm"] == algorithm and r["column"] == column]
    return row


def test_paired_rows_are_mean_differences_with_students_t_intervals(tmp_path):
    sweep = write_paired_sweep(tmp_path, sweep_spec(tmp_path, ["fedavg", "fedprox", "scaffold"]), FINAL)
    paired = sweep_paired_comparison(sweep)
    assert paired["reference"] == "fedavg" and paired["columns"] == ["data.alpha"]
    assert [m["metric"] for m in paired["metrics"]] == ["test_accuracy"]
    rows = paired["metrics"][0]["rows"]
    assert sorted((r["algorithm"], r["column"]) for r in rows) == [
        ("fedprox", "0.1"),
        ("fedprox", "0.5"),
        ("scaffold", "0.1"),
        ("scaffold", "0.5"),
    ]
    for algorithm, alpha in [("fedprox", 0.1), ("fedprox", 0.5), ("scaffold", 0.1)]:
        row = row_of(rows, algorithm, str(alpha))
        d = differences(algorithm, alpha)
        # the interval of scipy's paired t-test on the same pairs: mean ± t(0.975, n-1) · s / √n
        expected = stats.ttest_rel(np.array(FINAL[algorithm][alpha]), np.array(FINAL["fedavg"][alpha])).confidence_interval(0.95)
        assert row["n"] == 3 and row["unpaired"] == 0
        assert row["mean_difference"] == pytest.approx(d.mean())
        assert (row["ci_low"], row["ci_high"]) == (pytest.approx(expected.low), pytest.approx(expected.high))
        half = stats.t.ppf(0.975, 2) * d.std(ddof=1) / math.sqrt(3)
        assert row["ci_high"] - row["ci_low"] == pytest.approx(2 * half)
    assert row_of(rows, "fedprox", "0.1")["significant"] and row_of(rows, "fedprox", "0.1")["verdict"] == "better"
    assert not row_of(rows, "fedprox", "0.5")["significant"] and row_of(rows, "fedprox", "0.5")["verdict"] == "no clear difference"
    assert row_of(rows, "scaffold", "0.1")["significant"] and row_of(rows, "scaffold", "0.1")["verdict"] == "worse"
    # one completed seed: a difference, no interval
    single = row_of(rows, "scaffold", "0.5")
    assert single["n"] == 1 and single["mean_difference"] == pytest.approx(0.02)
    assert single["ci_low"] is None and single["ci_high"] is None and single["verdict"] is None and not single["significant"]


def test_pairs_are_matched_by_seed_not_by_order(tmp_path):
    """Reordered seeds change an unpaired comparison's nothing but a paired one's everything: the rows must
    follow the seeds. With fedavg's seeds listed in reverse, fedprox at α=0.1 is 0.52-0.50, not 0.52-0.70."""
    trials = pd.DataFrame(
        [
            {"trial_id": f"{a}{s}", "status": "TERMINATED", "algorithm.name": a, "seed": s}
            for a, seeds in (("fedavg", (2, 1, 0)), ("fedprox", (0, 1, 2)))
            for s in seeds
        ]
    )
    final = pd.Series({"fedavg0": 0.50, "fedavg1": 0.60, "fedavg2": 0.70, "fedprox0": 0.52, "fedprox1": 0.63, "fedprox2": 0.74})
    (row,) = paired_rows(trials, final, ["algorithm.name", "seed"], "max", "fedavg")
    assert row["column"] == "all" and row["n"] == 3
    assert row["mean_difference"] == pytest.approx(0.03) and row["verdict"] == "better"
    # a seed the reference did not complete is unpaired, not compared with another seed
    trials.loc[trials["trial_id"] == "fedavg2", "status"] = "ERROR"
    (row,) = paired_rows(trials, final, ["algorithm.name", "seed"], "max", "fedavg")
    assert (row["n"], row["unpaired"]) == (2, 1) and row["mean_difference"] == pytest.approx(0.025)


def test_lower_is_better_turns_the_verdict(tmp_path):
    """With test_loss (mode min), a negative difference is the better algorithm."""
    losses = {"fedavg": {0.1: [1.0, 1.1, 1.2], 0.5: [0.9, 0.8, 0.7]}, "fedprox": {0.1: [0.8, 0.92, 1.01], 0.5: [1.0, 0.95, 0.82]}}
    spec = sweep_spec(tmp_path, ["fedavg", "fedprox"], metric="test_loss", mode="min")
    sweep = write_paired_sweep(tmp_path, spec, losses, metric="test_loss")
    rows = sweep_paired_comparison(sweep)["metrics"][0]["rows"]
    assert row_of(rows, "fedprox", "0.1")["mean_difference"] < 0 and row_of(rows, "fedprox", "0.1")["verdict"] == "better"
    assert row_of(rows, "fedprox", "0.5")["mean_difference"] > 0 and row_of(rows, "fedprox", "0.5")["verdict"] == "worse"
    text = comparison_markdown(sweep)
    assert "### paired difference in final test_loss: algorithm − fedavg, mean [95% CI] (lower is better); columns: data.alpha" in text
    assert re.search(
        r"\| fedprox \| -0\.1900 \[-0\.\d+, -0\.\d+\] \(n=3\) \* better \| \+0\.1233 \[\+0\.\d+, \+0\.\d+\] \(n=3\) \* worse \|", text
    ), text


def test_comparison_md_shows_the_paired_table_and_says_what_every_plus_minus_is(tmp_path):
    sweep = write_paired_sweep(tmp_path, sweep_spec(tmp_path, ["fedavg", "fedprox", "scaffold"]), FINAL)
    text = comparison_markdown(sweep)
    assert "### final test_accuracy (mean ± std over n seeds (population std)); columns: data.alpha" in text
    assert "the std is the population std (ddof=0)" in text
    assert "the reference is fedavg (the default: fedavg runs in this sweep" in text
    assert "95% confidence interval by Student's t (t, n−1 dof)" in text
    assert "### paired difference in final test_accuracy: algorithm − fedavg, mean [95% CI] (higher is better); columns: data.alpha" in text
    low, high = stats.ttest_rel(FINAL["fedprox"][0.1], FINAL["fedavg"][0.1]).confidence_interval(0.95)
    low5, high5 = stats.ttest_rel(FINAL["fedprox"][0.5], FINAL["fedavg"][0.5]).confidence_interval(0.95)
    assert (
        f"| fedprox | +3.00 pp [{100 * low:+.2f}, {100 * high:+.2f}] (n=3) * better | +1.00 pp [{100 * low5:+.2f}, {100 * high5:+.2f}] (n=3) |"
        in text
    )
    assert "| scaffold | -11.00 pp [" in text and "(n=3) * worse | +2.00 pp (n=1; no interval: n < 2) |" in text
    assert "| fedavg |" in text and text.count("| fedavg |") == 1  # the reference has a row in the mean table only
    # the mean table of the same sweep keeps its numbers: population std over the completed seeds
    assert "| scaffold | 49.00% ± 7.35% (n=3) | 82.00% ± 0.00% (n=1); 2 errored |" in text


def test_the_reference_is_the_sweep_files_else_fedavg_else_the_spaces_first_algorithm(tmp_path):
    final = {name: FINAL[name] for name in ("fedavg", "fedprox", "scaffold")}
    # fedavg, wherever it is in the space
    sweep = write_paired_sweep(tmp_path / "a", sweep_spec(tmp_path, ["scaffold", "fedprox", "fedavg"]), final)
    assert sweep_paired_comparison(sweep)["reference"] == "fedavg"
    # named in the sweep file
    sweep = write_paired_sweep(tmp_path / "b", sweep_spec(tmp_path, ["fedavg", "fedprox", "scaffold"], reference="fedprox"), final)
    paired = sweep_paired_comparison(sweep)
    assert (paired["reference"], paired["reference_rule"]) == ("fedprox", "named by the sweep file's reference")
    rows = paired["metrics"][0]["rows"]
    assert {r["algorithm"] for r in rows} == {"fedavg", "scaffold"}
    assert row_of(rows, "fedavg", "0.1")["mean_difference"] == pytest.approx(-0.03) and row_of(rows, "fedavg", "0.1")["verdict"] == "worse"
    assert "| fedavg | -3.00 pp [" in comparison_markdown(sweep)
    # without fedavg: the first algorithm in the space's order (not the alphabet's)
    final = {name: FINAL[name] for name in ("fedprox", "scaffold")}
    sweep = write_paired_sweep(tmp_path / "c", sweep_spec(tmp_path, ["scaffold", "fedprox"]), final)
    paired = sweep_paired_comparison(sweep)
    assert paired["reference"] == "scaffold" and {r["algorithm"] for r in paired["metrics"][0]["rows"]} == {"fedprox"}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"space": {"algorithm.name": {"grid": ["fedavg", "fedprox"]}}, "reference": "scaffold"},
            "reference 'scaffold' is not one of the space's algorithm.name values (fedavg, fedprox)",
        ),
        ({"reference": "fedavg"}, "reference 'fedavg' compares algorithms: the space must sweep algorithm.name"),
    ],
)
def test_a_reference_outside_the_swept_algorithms_is_refused(tmp_path, fields, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        spec_from(tmp_path, **fields)


def test_a_sweep_file_reference_survives_sweep_yaml(tmp_path):
    spec = spec_from(tmp_path, space={"algorithm.name": {"grid": ["fedavg", "fedprox"]}}, reference="fedprox")
    assert spec.reference == "fedprox"
    (tmp_path / "sweep.yaml").write_text(spec.to_yaml())
    from fedray.tune import load_sweep

    assert load_sweep(tmp_path / "sweep.yaml").reference == "fedprox"


def test_comparison_md_ranks_by_the_worst_and_10th_percentile_clients_when_the_trials_report_them(tmp_path):
    base = {**TINY_BASE, "data": {"num_clients": 6, "client_test_fraction": 0.25}, "eval": {"personalized": True}}
    spec = SweepSpec.model_validate(
        {"name": "p", "base": base, "space": {"algorithm.name": {"grid": ["fedavg", "fedper"]}, "seed": {"grid": [0, 1]}}}
    )
    spec.metric, spec.mode = "test_accuracy", "max"
    final = {"fedavg": {0.1: [0.5, 0.6]}, "fedper": {0.1: [0.5, 0.6]}}
    extra = {
        (name, 0.1, seed): {"personal_accuracy": 0.8, "personal_accuracy_worst": worst, "personal_accuracy_p10": p10}
        for (name, seed, worst, p10) in [
            ("fedavg", 0, 0.30, 0.40),
            ("fedavg", 1, 0.32, 0.44),
            ("fedper", 0, 0.50, 0.60),
            ("fedper", 1, 0.56, 0.62),
        ]
    }
    sweep = write_paired_sweep(tmp_path, spec, final, extra=extra)
    text = comparison_markdown(sweep)
    assert "### final personal_accuracy_worst (mean ± std over n seeds (population std))" in text
    assert "| fedper (personalised) | 53.00% ± 3.00% (n=2) |" in text  # the worst client's accuracy, in %
    assert "### final personal_accuracy_p10 (mean ± std over n seeds (population std))" in text
    assert "| fedper (personalised) | 61.00% ± 1.00% (n=2) |" in text
    assert "### paired difference in final personal_accuracy_worst: algorithm − fedavg, mean [95% CI] (higher is better)" in text
    assert "| fedper (personalised) | +22.00 pp [" in text
    assert "### paired difference in final personal_accuracy_p10: algorithm − fedavg" in text
    # a sweep whose trials do not report them has no such table
    plain = write_paired_sweep(tmp_path / "plain", spec, final)
    assert "personal_accuracy_worst" not in comparison_markdown(plain)


def test_a_lower_is_better_personal_metric_keeps_its_direction_in_the_paired_table(tmp_path):
    """A regression's personal_rmse_p10 (the value 10 % of clients are worse than: a high RMSE) is better lower."""
    spec = sweep_spec(tmp_path, ["fedavg", "fedprox"], metric="test_rmse", mode="min")
    final = {"fedavg": {0.1: [1.0, 1.1, 1.2]}, "fedprox": {0.1: [0.9, 1.0, 1.1]}}
    extra = {
        (name, 0.1, seed): {"personal_rmse": 1.0, "personal_rmse_p10": value, "personal_rmse_worst": value + 0.5}
        for name, values in (("fedavg", [2.0, 2.2, 2.4]), ("fedprox", [1.5, 1.6, 1.8]))
        for seed, value in enumerate(values)
    }
    sweep = write_paired_sweep(tmp_path, spec, final, metric="test_rmse", extra=extra)
    by_metric = {m["metric"]: m for m in sweep_paired_comparison(sweep)["metrics"]}
    assert list(by_metric) == ["test_rmse", "personal_rmse", "personal_rmse_worst", "personal_rmse_p10"]
    assert {m["mode"] for m in by_metric.values()} == {"min"}
    (row,) = by_metric["personal_rmse_p10"]["rows"]
    assert row["mean_difference"] == pytest.approx(-0.5667, abs=1e-4) and row["verdict"] == "better"
    assert "### paired difference in final personal_rmse_p10: algorithm − fedavg, mean [95% CI] (lower is better)" in comparison_markdown(
        sweep
    )
