"""The README's measured figures are the committed raw files' (docs/results/raw/): each sentence that
quotes a benchmark is checked against the value its script computes from the file, so a re-measured
file with different figures fails here until the README says the new ones."""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RAW = REPO / "docs" / "results" / "raw"
sys.path.insert(0, str(REPO / "benchmarks"))

import w1_overhead  # noqa: E402


def readme() -> str:
    return " ".join((REPO / "README.md").read_text().split())  # one line: the sentences wrap anywhere


def test_the_steady_state_ratio_is_the_raw_files():
    ratios = w1_overhead.over_plain(json.loads((RAW / "w1_overhead.json").read_text()), "ray2", "steady_round_s")
    median, low, high = (f"{value:.2f}" for value in (statistics.median(ratios), min(ratios), max(ratios)))
    assert f"round with two workers costs {median}× as much on two cores" in readme()
    assert f"median of 3 paired runs, {low}–{high}" in readme()


def test_the_fractional_gpu_ratio_is_the_raw_files():
    sides = json.loads((RAW / "gpu_check_h200.json").read_text())["w3"]["cnn_cifar"]
    [four] = [side for side in sides if side["workers"] == 4]
    assert f"four workers sharing one H200 trained {four['vs_plain']:.2f}× as many client updates per second" in readme()


def test_the_vectorised_h200_figures_are_the_raw_files():
    invocations = [json.loads((RAW / name).read_text())["vectorized"] for name in ("gpu_check_h200.json", "gpu_check_h200_cohorts.json")]
    ratios = [invocation["w3/cnn_cifar"]["ratio"] for invocation in invocations]
    cohorts = [
        entry["vectorized"]["updates_per_s"]
        for invocation in invocations
        for workload, entry in invocation.items()
        if workload.startswith("w3_cohort")
    ]
    assert f"it trained {min(ratios):.1f}–{max(ratios):.1f}× the loop's client updates per second" in readme()
    assert f"and {min(cohorts):,.0f}–{max(cohorts):,.0f} a second with cohorts of 200 and 1,000" in readme()


def test_the_peers_ratios_are_the_raw_files():
    results = json.loads((RAW / "peers.json").read_text())["results"]
    ratios = {
        (workload, peer): runs[peer]["steady_round_s"] / runs["fedray, Ray, 2 workers"]["steady_round_s"]
        for workload, runs in results.items()
        for peer in ("pfl-research, 1 process", "Flower, Ray, 2 actors")
    }
    pfl = [ratios[workload, "pfl-research, 1 process"] for workload in ("w1", "pfl")]
    flower = [ratios[workload, "Flower, Ray, 2 actors"] for workload in ("w1", "pfl")]
    assert f"a round with two fedray workers was {pfl[0]:.2f}× (W1) and {pfl[1]:.2f}×" in readme()
    assert f"as fast as pfl-research 0.6.0's, and {flower[0]:.1f}× and {flower[1]:.2f}× as fast as Flower 1.42's" in readme()


def test_the_offline_bundle_size_is_the_raw_files():
    total = json.loads((RAW / "offline_bundle.json").read_text())["total_mib"]
    assert f"installs fedray from a {total:.0f} MiB folder of wheels" in readme()


def test_the_first_runs_figures_are_the_raw_files():
    """The README's `fedray run`: its printed final accuracy (also in the two guides that show its
    output) and its time, within a quarter of the recorded run's."""
    run = json.loads((RAW / "default_run.json").read_text())
    accuracy = f"{100 * run['summary']['final_test_accuracy']:.2f}%"
    assert f"a summary (`final test acc. {accuracy}`)" in readme()
    for guide in ("getting_started.md", "guide/running.md"):
        assert re.search(rf"final test acc\.\s+{re.escape(accuracy)}", (REPO / "docs" / guide).read_text()), guide
    [seconds] = re.findall(r"FedAvg on the embedded digits data \(~(\d+) s\)", readme())
    assert abs(int(seconds) - run["wall_seconds"]) <= run["wall_seconds"] / 4
