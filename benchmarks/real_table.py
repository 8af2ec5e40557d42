"""Resumable results table on the real Fashion-MNIST files: every algorithm, tuned, a paper-style protocol.

Two stages, both resumable, run by one command:

1. **Tuning.** Each algorithm's sweep in ``tune_configs/fmnist/`` (its key hyperparameter × the
   learning rate, 20 rounds at Dirichlet α = 0.1, ASHA) is ranked on a validation split
   (``data.validation_fraction``: a seeded 10 % of the training set, never the test set). Every
   trial goes to ``docs/results/fmnist_tuning.csv``, the best one marked ``chosen``. A sweep runs
   just before the first table entry that needs it.
2. **The table.** Each algorithm starts from ``examples/<base>_digits.yaml``, takes its sweep's
   chosen values (``TUNED_FROM`` says which sweep a variant uses), then the shared protocol:

    Fashion-MNIST (60,000 train / 10,000 test, 28×28), 100 clients, 10 per round (10 %), 100 rounds,
    2 local epochs, batch 32, the example's optimiser, cnn_small, evaluated every 5 rounds, seeds 0, 1
    (the self-supervised rows: the Hetero-SSFL paper's own setting, see ``ssl`` below).

   and one of three settings groups:

   * ``global`` (test accuracy of the global model): Dirichlet α = 0.1 and α = 0.5. FedAvg, FedProx,
     FedSC, FedRCL, FedProto, MOON, FedSKC, FedRCL's β = 0 ablation (``fedrcl_beta0``) and FedSKC
     with ``gpr_mode=residual, u_mode=none`` (``fedskc_stabilised``); then SCAFFOLD, FedDyn,
     FedLC, FedNTD, FedDecorr, FedProc and the server optimisers FedAvgM, FedAdam, FedYogi, FedAdagrad.
   * ``personalised`` (``personal_accuracy``: every client's own model on its held-out 25 %, and its
     spread across clients ``personal_accuracy_std``): a pathological split (``shards2``: 2 classes
     per client) and Dirichlet α = 0.1 (``pdir0.1``). FedAvg, Local, FedPer, FedCoSR; then Ditto,
     FedRep and LG-FedAvg. FedBN is left out: it needs BatchNorm layers, which cnn_small lacks, and
     on its example's resnet8 one round of this protocol takes ~2 minutes on 2 cores (~3.5 hours an
     entry); its digits table compares it with FedAvg on the same resnet8.
   * ``ssl`` (``probe_accuracy``: linear probe of the learned encoders on the labelled training set):
     the Hetero-SSFL paper's main setting, ``classes2``: 5 clients, all of them every round, each
     holding every image of 2 classes (no class shared), 1 local epoch per round, 50 rounds (see
     ``SSL_PROTOCOL`` for why not 100 clients). Hetero-SSFL, its μ = 0 local-SSL variant
     (``hetero_ssfl_local``), FedAvg+BYOL, Hetero-SSFL with the debiased alignment
     (``hetero_ssfl_debiased``), FedEMA and FedU: the paper's Table 1 compares Hetero-SSFL with all
     of them, so this group has no ``more_algorithms``.

   Each group's ``algorithms`` (the papers' methods and the baselines their claims name) run first,
   every seed and setting; its ``more_algorithms`` (every other algorithm fedray has) after them.

The sweeps tune at Dirichlet α = 0.1; an entry whose tuned learning rate diverges in another setting
runs again at the next lower rate of its sweep's grid (marked † in the table). So does one that
collapses: an evaluation at half the best before it or below (the rule ``fedray run`` warns by). The
runtime's non-finite guard cannot catch a client update that blows up but stays finite: FedSC at
α = 0.5 went from 90 % to 8.9 % in its last round that way, FedCoSR on Dirichlet 0.1 from 92 % to 21 %
in round 30, recovering only to 65 %. So does one that ends no better than guessing (at most 1.5 × the
accuracy of a uniform guess over the 10 classes): FedSC at lr 0.2 on seed 1 blew up in round 2 and
stayed at 10 % for the 98 rounds after.

Every finished (algorithm, setting, seed) goes to ``<out>.csv`` with the values it ran with and the
provenance of the invocation that finished it (commit, torch, Python, CPU, date; empty on rows from
before 29 Nov 2026), and its curve to ``<out>_curves.csv``; it is skipped on the next invocation
unless the tuning has changed them since; an interrupted run (Ctrl-C, SIGTERM) keeps its checkpoints under ``--runs-dir`` and
resumes from them, an interrupted sweep resumes under ``<runs-dir>_sweeps``. ``--report`` rewrites
the table part of ``<out>.md`` (between the two marker lines; the prose around it is kept),
``<out>.png`` (mean ± std band over seeds) and, for the default ``--out``, the short tables of
``docs/results/fmnist_summary.md`` (one row per algorithm, best first; between its marker lines, the
prose around them is kept) from the CSVs alone::

    nice -n 19 python benchmarks/real_table.py                 # tune and run the table, seed 0 first
    python benchmarks/real_table.py --groups global --algorithms fedavg --seeds 0
    python benchmarks/real_table.py --report                   # tables and figure from the CSVs

Two read-only views of run folders: ``--diagnose RUN_DIR`` prints a run round by round (accuracy,
the algorithm's diagnostics, the median and largest client loss); ``--replay-warnings FOLDER ...``
replays ``fedray run``'s blow-up warning over every run folder in the folders given::

    python benchmarks/real_table.py --diagnose runs/real_table/global-scaffold-dir0.1-s0-lr0.05 --rounds 24 32
    python benchmarks/real_table.py --replay-warnings runs/real_table runs/real_table_sweeps/*/trials
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import math
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from benchmark_tables import paired_text, plot_mean_band, run_result
from fedray import load_config
from fedray.config import read_yaml
from fedray.layout import META_FILE, SAVED_CONFIG_FILE, SUMMARY_FILE, SWEEP_FILE, TRIALS_FILE
from fedray.runtime import TrainingDiverged, resume_experiment, run_experiment
from fedray.tracking import read_metrics
from fedray.tracking.health import collapsed
from fedray.tune import load_sweep
from raw_output import PROVENANCE_COLUMNS, machine, provenance_columns

REPO = Path(__file__).resolve().parent.parent
ROUNDS = 100
#: The table's seeds (``--seeds``); a cell with fewer says how many of them it has.
SEEDS = [0, 1]
CLIENTS_PER_ROUND = 10
PROTOCOL = [
    "data.name=fmnist",
    "data.num_clients=100",
    f"train.clients_per_round={CLIENTS_PER_ROUND}",
    f"train.rounds={ROUNDS}",
    "train.local_epochs=2",
    "train.batch_size=32",
    "eval.every=5",
    "checkpoint.every=5",
    "checkpoint.keep=1",
    "output.tensorboard=false",
    "output.plots=false",
]
# The self-supervised rows' protocol: the Hetero-SSFL paper's main setting (5 clients, all taking part,
# disjoint classes). In the 100-client protocol each personalised encoder trains in only ~10 of the
# 100 rounds (~375 SGD steps): the Hetero-SSFL entries run that way probed level with an *untrained*
# encoder (74 %, benchmarks/probe_floor.py), so they could not rank methods
# (docs/results/fmnist_ssl_100clients.csv). Here every client trains every round. A round is a full
# epoch over 12,000 images per client (~100 s for Hetero-SSFL on 2 cores), so 50 rounds, not 100:
# that is 50 local epochs per encoder, against 20 for a client of the 100-round, 10 %-participation
# protocol. The paper's IID setting (its Table 2) is left out for time.
SSL_ROUNDS = 50
SSL_CLIENTS = 5
SSL_PROTOCOL = [
    f"data.num_clients={SSL_CLIENTS}",
    f"train.clients_per_round={SSL_CLIENTS}",
    "train.local_epochs=1",
    f"train.rounds={SSL_ROUNDS}",
]
SETTINGS = {
    "dir0.1": ["data.partition=dirichlet", "data.alpha=0.1"],
    "dir0.5": ["data.partition=dirichlet", "data.alpha=0.5"],
    "shards2": ["data.partition=shards", "data.classes_per_client=2", "data.client_test_fraction=0.25", "eval.personalized=true"],
    "pdir0.1": ["data.partition=dirichlet", "data.alpha=0.1", "data.client_test_fraction=0.25", "eval.personalized=true"],
    # Shards of one class each (Fashion-MNIST's classes are all 6,000 images): every client gets 2 whole classes.
    "classes2": [*SSL_PROTOCOL, "data.partition=shards", "data.classes_per_client=2"],
}
# The linear probe trains on the whole labelled training set: 20 epochs over 60,000 images are
# ~2,300 Adam steps (the digits examples use 300 epochs over ~1,400). Probing Hetero-SSFL's 5
# encoders takes ~150 s on 2 cores, 1.5 training rounds.
PROBE = ["algorithm.probe_epochs=20"]
# Table name -> (examples/<base>_digits.yaml, extra overrides).
VARIANTS = {
    "fedrcl_beta0": ("fedrcl", ["algorithm.beta=0"]),
    # FedSKC with the switches chosen on a digits validation split (docs/results/fmnist.md, "FedSKC"):
    # non-shrinking period review and no 1/U sharpening of LCL; the `fedskc` row keeps the paper's.
    "fedskc_stabilised": ("fedskc", ["algorithm.gpr_mode=residual", "algorithm.u_mode=none"]),
    "hetero_ssfl": ("hetero_ssfl", PROBE),
    "hetero_ssfl_local": ("hetero_ssfl_local", PROBE),
    "hetero_ssfl_debiased": ("hetero_ssfl_debiased", PROBE),
    "fedavg_byol": ("fedavg_byol", PROBE),
    "fedema": ("fedema", PROBE),
    "fedu": ("fedu", PROBE),
}
GROUPS: dict[str, dict[str, Any]] = {
    "global": {
        "algorithms": ["fedavg", "fedprox", "fedsc", "fedrcl", "fedproto", "moon", "fedskc", "fedrcl_beta0", "fedskc_stabilised"],
        "more_algorithms": ["scaffold", "feddyn", "fedlc", "fedntd", "feddecorr", "fedproc", "fedavgm", "fedadam", "fedyogi", "fedadagrad"],
        "settings": ["dir0.1", "dir0.5"],
        "rounds": ROUNDS,
        "clients_per_round": CLIENTS_PER_ROUND,
        "metric": "test_accuracy",
        "also": [],
        "chance": 0.1,  # a uniform guess over Fashion-MNIST's 10 classes
        "summary": ("global model", "last_fifth"),
        "reference": "fedavg",  # what the paired differences are against
    },
    "personalised": {
        "algorithms": ["fedavg", "local", "fedper", "fedcosr"],
        "more_algorithms": ["ditto", "fedrep", "lg_fedavg"],
        "settings": ["shards2", "pdir0.1"],
        "rounds": ROUNDS,
        "clients_per_round": CLIENTS_PER_ROUND,
        "metric": "personal_accuracy",
        "also": ["personal_accuracy_std"],
        "chance": 0.1,
        "summary": ("personalised (each client's own held-out split)", "last_fifth"),
        "reference": "fedavg",
    },
    "ssl": {
        "algorithms": ["hetero_ssfl", "hetero_ssfl_local", "fedavg_byol", "hetero_ssfl_debiased", "fedema", "fedu"],
        "more_algorithms": [],
        "settings": ["classes2"],
        "rounds": SSL_ROUNDS,
        "clients_per_round": SSL_CLIENTS,
        "metric": "probe_accuracy",
        "also": [],
        "chance": None,  # even an untrained encoder probes at ~75 % (benchmarks/probe_floor.py)
        # The probe at the last round: the papers report the encoder they end with.
        "summary": ("self-supervised (linear probe)", "final"),
        "reference": "fedavg_byol",
    },
}
# Tuning (run before the table): one sweep per algorithm in tune_configs/fmnist/, ranked on a
# validation split; the table then uses each sweep's best values (docs/results/fmnist_tuning.csv).
SWEEPS = REPO / "tune_configs" / "fmnist"
TUNING_CSV = REPO / "docs" / "results" / "fmnist_tuning.csv"
TUNING_FIELDS = ["sweep", "trial_id", "hyperparameters", "status", "rounds", "metric", "best_metric", "best_round", "chosen"]
# Table name -> (sweep whose best values it takes, the keys it takes; None: all swept keys). A variant
# keeps the key that defines it (FedRCL's β = 0, local SSL's μ = 0); the personalised FedAvg row
# takes FedAvg's learning rate, tuned on the global validation accuracy.
TUNED_FROM = {
    "fedrcl_beta0": ("fedrcl", ["train.lr"]),
    "fedskc_stabilised": ("fedskc", None),
    "hetero_ssfl_local": ("hetero_ssfl", ["train.lr"]),
    "hetero_ssfl_debiased": ("hetero_ssfl", None),
}
RESULT_FIELDS = [
    "group",
    "algorithm",
    "setting",
    "seed",
    "hyperparameters",
    "metric",
    "lr",
    "fell_back_from",
    "diverged",
    "final",
    "best",
    "rounds",
    "excluded_updates",
    "seconds",
    "seconds_per_round",
    "personal_accuracy_std_final",
    "personal_accuracy_std_at_best",
    *PROVENANCE_COLUMNS,  # of the invocation that finished the entry; empty on rows written before they were kept
]
CURVE_FIELDS = ["group", "algorithm", "setting", "seed", "round", "value"]
# The summary page's short tables (``summary_lines``): a row's name, and each setting's column heading.
LABELS = {
    "fedavg": "FedAvg",
    "fedprox": "FedProx",
    "fedsc": "FedSC",
    "fedrcl": "FedRCL",
    "fedproto": "FedProto",
    "moon": "MOON",
    "fedskc": "FedSKC with its paper's switches",
    "fedrcl_beta0": "FedRCL without its divergence penalty (β = 0)",
    "fedskc_stabilised": "FedSKC with `gpr_mode=residual, u_mode=none`",
    "scaffold": "SCAFFOLD",
    "feddyn": "FedDyn",
    "fedlc": "FedLC",
    "fedntd": "FedNTD",
    "feddecorr": "FedDecorr",
    "fedproc": "FedProc",
    "fedavgm": "FedAvgM",
    "fedadam": "FedAdam",
    "fedyogi": "FedYogi",
    "fedadagrad": "FedAdagrad",
    "local": "Local",
    "fedper": "FedPer",
    "fedcosr": "FedCoSR",
    "ditto": "Ditto",
    "fedrep": "FedRep",
    "lg_fedavg": "LG-FedAvg",
    "hetero_ssfl": "Hetero-SSFL",
    "hetero_ssfl_local": "Local SSL (Hetero-SSFL with μ = 0)",
    "fedavg_byol": "FedAvg+BYOL",
    "hetero_ssfl_debiased": "Hetero-SSFL with the debiased alignment estimator",
    "fedema": "FedEMA",
    "fedu": "FedU",
}
SETTING_LABELS = {
    "dir0.1": "Dirichlet α = 0.1",
    "dir0.5": "Dirichlet α = 0.5",
    "shards2": "2-class shards",
    "pdir0.1": "Dirichlet α = 0.1",
    "classes2": f"{SSL_CLIENTS} clients, 2 whole classes each",
}
SUMMARY_START = "<!-- Fashion-MNIST summary: generated by `python benchmarks/real_table.py --report`; do not edit -->"
SUMMARY_END = "<!-- end of Fashion-MNIST summary -->"
DEFAULT_OUT = REPO / "docs" / "results" / "fmnist.md"
#: The page that holds the short tables (``summary_lines``) of the default protocol's results.
SUMMARY_PAGE = REPO / "docs" / "results" / "fmnist_summary.md"
TABLE_START = "<!-- table: generated by `python benchmarks/real_table.py --report`; do not edit -->"
TABLE_END = "<!-- end of generated table -->"


def tuning_source(algorithm: str) -> tuple[str, list[str] | None]:
    """The sweep whose chosen values table entry ``algorithm`` takes, and which of its keys (None: all)."""
    return TUNED_FROM.get(algorithm, (VARIANTS.get(algorithm, (algorithm,))[0], None))


def tuned_overrides(algorithm: str, tuning: list[dict[str, str]]) -> list[str]:
    """The overrides of the tuned values ``algorithm`` takes from its sweep's chosen trial (none
    before that sweep has run)."""
    sweep, keys = tuning_source(algorithm)
    chosen = [row for row in tuning if row["sweep"] == sweep and row["chosen"] == "True"]
    if not chosen:
        return []
    values = json.loads(chosen[0]["hyperparameters"])
    return [f"{key}={value}" for key, value in values.items() if keys is None or key in keys]


def config_for(algorithm: str, setting: str, seed: int, extra: list[str], tuning: list[dict[str, str]]):
    """The protocol, the setting, the tuned values, then the variant's own keys (they win)."""
    base, variant_overrides = VARIANTS.get(algorithm, (algorithm, []))
    path = REPO / "examples" / f"{base}_digits.yaml"
    overrides = PROTOCOL + SETTINGS[setting] + tuned_overrides(algorithm, tuning) + variant_overrides + [f"seed={seed}"] + extra
    return load_config(path, overrides)


@functools.cache
def sweep_space(sweep: str) -> dict[str, Any]:
    """The search space of sweep ``sweep`` (loading a sweep validates every trial shape: once per sweep)."""
    return load_sweep(SWEEPS / f"{sweep}.yaml").space


@functools.cache
def swept_keys(sweep: str) -> tuple[str, ...]:
    """The keys sweep ``sweep`` tunes, as its file names them (the report needs only these: validating
    the sweep builds every trial shape's data, 10 of the report's 12 s)."""
    return tuple(read_yaml(SWEEPS / f"{sweep}.yaml")["space"])


def fallback_learning_rates(algorithm: str, tuned: float) -> list[float]:
    """The learning rates of ``algorithm``'s sweep grid below ``tuned``, largest first."""
    return sorted((lr for lr in sweep_space(tuning_source(algorithm)[0])["train.lr"].values if lr < tuned), reverse=True)


def hyperparameters(config: Any, algorithm: str) -> str:
    """The tuned keys' values in ``config`` as JSON (the CSV's ``hyperparameters``): an entry whose
    values differ from the current tuning is stale and runs again."""
    flat = config.to_dict()
    values = {}
    for key in swept_keys(tuning_source(algorithm)[0]):
        section, _, name = key.partition(".")
        values[key] = flat[section][name]
    return json.dumps(values, sort_keys=True)


def read_csv(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def write_csv(path: Path, fields: list[str], rows: list[dict[str, Any]]) -> None:
    """Write ``rows`` to ``path`` whole (through a temporary file, so an interruption keeps the old one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(path.suffix + ".partial")
    with open(partial, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    partial.replace(path)


def replace_entry(path: Path, fields: list[str], entry: tuple[str, str, str, int], rows: list[dict[str, Any]]) -> None:
    """Put ``rows`` in place of the rows of ``entry`` (group, algorithm, setting, seed) in ``path``."""
    kept = [r for r in read_csv(path) if entry_key(r) != entry]
    write_csv(path, fields, kept + rows)


def entry_key(row: dict[str, Any]) -> tuple[str, str, str, int]:
    return row["group"], row["algorithm"], row["setting"], int(row["seed"])


def run_entry(
    group: str,
    algorithm: str,
    setting: str,
    seed: int,
    runs_dir: Path,
    extra: list[str],
    tuning: list[dict[str, str]],
    collapsed_row: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run (or resume, or just read back) one entry with its tuned values in
    ``runs_dir/<group>-<algorithm>-<setting>-s<seed>``. If it diverges or collapses (its learning
    rate was tuned at Dirichlet 0.1 and may not suit the other settings), it runs again with each
    lower learning rate of its sweep's grid in turn (in ``...-lr<lr>``) until one trains: ``lr`` is
    the rate of the result and ``fell_back_from`` says which failed and how. ``diverged`` is set only
    if every rate failed. ``collapsed_row``: this entry's CSV row from an earlier invocation, which
    collapsed at its ``lr`` (how: its ``collapse``); that rate and the ones above it are not run again."""
    spec = GROUPS[group]
    config = config_for(algorithm, setting, seed, extra, tuning)
    name = f"{group}-{algorithm}-{setting}-s{seed}"
    rates, failed_rates = rates_left([config.train.lr, *fallback_learning_rates(algorithm, config.train.lr)], collapsed_row)
    for lr in rates:
        if lr == config.train.lr:
            outcome = run_or_resume(config, runs_dir / name, spec)
        else:
            fallback = config_for(algorithm, setting, seed, [*extra, f"train.lr={lr}"], tuning)
            outcome = run_or_resume(fallback, runs_dir / f"{name}-lr{lr}", spec)
        failure = outcome["diverged"] or collapse(outcome["curve"], spec["chance"])
        if not failure:
            break
        failed_rates.append(f"lr {lr} {failure}")
    return {
        "group": group,
        "algorithm": algorithm,
        "setting": setting,
        "seed": seed,
        "hyperparameters": hyperparameters(config, algorithm),
        "metric": spec["metric"],
        "lr": lr,
        "fell_back_from": "" if failure else "; ".join(failed_rates),
        **outcome,
        "diverged": "; ".join(failed_rates) if failure else "",
    }


def rates_left(rates: list[float], collapsed_row: dict[str, str] | None) -> tuple[list[float], list[str]]:
    """The learning rates of ``rates`` (largest first) still to try, and how the ones already tried
    failed: after ``collapsed_row`` (see :func:`run_entry`), the rates below its ``lr``."""
    if collapsed_row is None:
        return rates, []
    failed = [collapsed_row["fell_back_from"], f"lr {collapsed_row['lr']} {collapsed_row['collapse']}"]
    return [lr for lr in rates if lr < float(collapsed_row["lr"])], [text for text in failed if text]


def collapse(curve: list[tuple[int, float]], chance: float | None) -> str:
    """How a run's ``curve`` [(round, value)] failed, if it did: it first collapsed (an evaluation at
    half the best before it or below; ``fedray run`` warns by the same rule) or it ended no better
    than guessing (at most 1.5 × ``chance``, the accuracy of a uniform guess; None: not checked); else ''."""
    best = None
    for round, value in curve:
        if best is not None and collapsed(value, best):
            return f"collapsed in round {round} ({100 * value:.2f} %, best before it {100 * best:.2f} %)"
        best = value if best is None else max(best, value)
    if chance is not None and curve and curve[-1][1] <= 1.5 * chance:
        return f"ended at chance level ({100 * curve[-1][1]:.2f} %, best {100 * best:.2f} %)"
    return ""


def run_or_resume(config: Any, run_dir: Path, spec: dict[str, Any]) -> dict[str, Any]:
    """Run ``config`` in ``run_dir`` (resume it, or read it back if it finished); a run directory left
    by another config (an earlier tuning) is started again from scratch."""
    if (run_dir / SAVED_CONFIG_FILE).is_file() and load_config(run_dir / SAVED_CONFIG_FILE).to_dict() != config.to_dict():
        print(f"{run_dir} was run with other hyperparameters: starting it again", file=sys.stderr)
        shutil.rmtree(run_dir)
    summary_file = run_dir / SUMMARY_FILE
    finished = summary_file.is_file() and json.loads(summary_file.read_text()).get("rounds") == config.train.rounds
    diverged_round = None
    if not finished:
        try:
            if (run_dir / SAVED_CONFIG_FILE).is_file():
                print(f"resuming {run_dir}", file=sys.stderr)
                resume_experiment(run_dir, progress=False)
            else:
                run_experiment(config, run_dir=run_dir, progress=False)
        except TrainingDiverged as error:  # a result of these hyperparameters, not a failure of the benchmark
            diverged_round = error.round
    metrics = read_metrics(run_dir)  # round rows only (its default scope)
    totals = round_totals(metrics)
    try:
        result = run_result(metrics, spec["metric"], spec["also"])
    except ValueError:  # it diverged before its first evaluation
        if diverged_round is None:
            raise
        result = {"final": "", "best": "", "curve": []}
    rounds = config.train.rounds if diverged_round is None else diverged_round
    return {
        "rounds": rounds,
        "excluded_updates": totals["excluded_updates"],
        "seconds": round(totals["seconds"], 1),
        "seconds_per_round": round(totals["seconds"] / rounds, 2),
        "diverged": "" if diverged_round is None else f"diverged in round {diverged_round}",
        **result,
    }


def round_totals(rounds: list[dict[str, Any]]) -> dict[str, float]:
    """Over all of a run's ``rounds`` (its round metrics, across resumes): ``excluded_updates`` (client
    updates left out of aggregation as non-finite, NaN/inf) and ``seconds`` (training and evaluation,
    start-ups not counted)."""
    return {key: sum(row[key] for row in rounds) for key in ("excluded_updates", "seconds")}


def table_algorithms(spec: dict[str, Any]) -> list[str]:
    """A group's rows: its ``algorithms``, then its ``more_algorithms``."""
    return spec["algorithms"] + spec["more_algorithms"]


def planned(groups: list[str], algorithms: list[str] | None, seeds: list[int]) -> list[tuple[str, str, str, int]]:
    """(group, algorithm, setting, seed) in run order: every group's ``algorithms`` before any of its
    ``more_algorithms``; within each, seed by seed, and within a seed every group's first setting (the
    strong-skew one most papers' claims are about) before any group's second, so that a partial run
    already checks each paper's main claim on one seed."""
    order = []
    for tier in ("algorithms", "more_algorithms"):
        for seed in seeds:
            for setting_index in range(max(len(spec["settings"]) for spec in GROUPS.values())):
                for group in groups:
                    spec = GROUPS[group]
                    if setting_index < len(spec["settings"]):
                        order += [
                            (group, algorithm, spec["settings"][setting_index], seed)
                            for algorithm in spec[tier]
                            if algorithms is None or algorithm in algorithms
                        ]
    return order


def current_rows(results: list[dict[str, str]], extra: list[str], tuning: list[dict[str, str]]) -> list[dict[str, str]]:
    """The finished entries whose hyperparameters are today's tuned values (a row written before the
    CSV recorded them ran with its example's defaults)."""
    current = []
    for row in results:
        group, algorithm, setting, seed = entry_key(row)
        ran_with = row.get("hyperparameters") or hyperparameters(config_for(algorithm, setting, seed, extra, []), algorithm)
        if ran_with == hyperparameters(config_for(algorithm, setting, seed, extra, tuning), algorithm):
            current.append(row)
    return current


def run_all(args: argparse.Namespace) -> None:
    results_csv, curves_csv = args.out.with_suffix(".csv"), args.out.with_name(args.out.stem + "_curves.csv")
    tuning = read_csv(TUNING_CSV)
    current = current_rows(read_csv(results_csv), args.extra, tuning)
    curves = curves_by_entry(read_csv(curves_csv))
    # A row that collapsed at a rate with lower ones left (one written before collapses fell back) runs again there.
    collapsed = {}
    for r in current:
        if not r["diverged"] and fallback_learning_rates(r["algorithm"], float(r["lr"])):
            how = collapse(curves.get(entry_key(r), []), GROUPS[r["group"]]["chance"])
            if how:
                collapsed[entry_key(r)] = {**r, "collapse": how}
    done = {entry_key(r) for r in current} - set(collapsed)
    todo = [entry for entry in planned(args.groups, args.algorithms, args.seeds) if entry not in done]
    print(f"{len(done)} entries done with the current tuning, {len(todo)} to run", file=sys.stderr)
    # SIGTERM stops like Ctrl-C: the current run keeps its last checkpoint and resumes next time.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    for entry in todo:
        group, algorithm, setting, seed = entry
        sweep = tuning_source(algorithm)[0]
        if not any(row["sweep"] == sweep for row in tuning):
            tune(sweep, args.runs_dir.with_name(args.runs_dir.name + "_sweeps"), args.trust_tune_state)
            tuning = read_csv(TUNING_CSV)
        provenance = provenance_columns(machine())
        result = {**run_entry(group, algorithm, setting, seed, args.runs_dir, args.extra, tuning, collapsed.get(entry)), **provenance}
        replace_entry(
            curves_csv,
            CURVE_FIELDS,
            entry,
            [
                {"group": group, "algorithm": algorithm, "setting": setting, "seed": seed, "round": r, "value": v}
                for r, v in result["curve"]
            ],
        )
        replace_entry(results_csv, RESULT_FIELDS, entry, [result])
        outcome = result["diverged"] or f"final={result['final']:.4f}  best={result['best']:.4f}"
        print(
            f"{group:12s} {algorithm:18s} {setting:8s} seed={seed}  {outcome}  ({result['seconds_per_round']:.1f} s/round)",
            file=sys.stderr,
            flush=True,
        )


def sweep_order() -> list[str]:
    """Every sweep of tune_configs/fmnist/, in the order their algorithms appear in the table."""
    order = [tuning_source(a)[0] for spec in GROUPS.values() for a in table_algorithms(spec)]
    names = {path.stem for path in SWEEPS.glob("*.yaml")}
    return [name for name in dict.fromkeys(order) if name in names]


def tune(sweep: str, runs_dir: Path, trust_tune_state: bool = False) -> None:
    """Run sweep ``tune_configs/fmnist/<sweep>.yaml`` (or continue it if it was interrupted), then add
    its trials to the tuning CSV with the best one ``chosen``. ``trust_tune_state``: see ``fedray
    tune --resume --trust-tune-state``."""
    from fedray.tune import resume_sweep, run_sweep
    from fedray.tune.results import read_meta, read_table
    from fedray.tune.summary import ranked_trials

    spec = load_sweep(SWEEPS / f"{sweep}.yaml")
    spec.output.dir = str(runs_dir.resolve())  # as recorded in a started sweep's file, whatever the working directory
    # A sweep started from an older version of its file would resume with the old settings.
    started = sorted(
        path.parent for path in runs_dir.glob(f"{sweep}-*/{META_FILE}") if load_sweep(path.parent / SWEEP_FILE).to_yaml() == spec.to_yaml()
    )
    if started and read_meta(started[-1])["status"] == "finished":
        sweep_dir = started[-1]
    else:
        print(f"{'resuming' if started else 'starting'} the {sweep} sweep", file=sys.stderr, flush=True)
        outcome = resume_sweep(started[-1], trust_tune_state=trust_tune_state) if started else run_sweep(spec)
        if outcome.status != "finished":  # a trial that diverged (ERROR) is a result: it is never chosen
            raise RuntimeError(f"the {sweep} sweep did not finish ({outcome.sweep_dir}); run again to continue it")
        sweep_dir = outcome.sweep_dir
    meta = read_meta(sweep_dir)
    trials = read_table(sweep_dir / TRIALS_FILE)
    ranked = ranked_trials(trials, meta["mode"])
    unranked = trials[~trials["trial_id"].isin(ranked["trial_id"])]  # errored, or reported nothing
    rows = [
        {
            "sweep": sweep,
            "trial_id": trial["trial_id"],
            "hyperparameters": json.dumps(
                {key: trial[key].item() if hasattr(trial[key], "item") else trial[key] for key in meta["swept_keys"]}, sort_keys=True
            ),
            "status": trial["status"],
            "rounds": int(trial["round"]),
            "metric": meta["metric"],
            "best_metric": "" if pd.isna(trial["best_metric"]) else round(float(trial["best_metric"]), 4),
            "best_round": "" if pd.isna(trial["best_round"]) else int(trial["best_round"]),
            "chosen": position == 0,
        }
        for position, (_, trial) in enumerate(pd.concat([ranked, unranked]).iterrows())
    ]
    write_csv(TUNING_CSV, TUNING_FIELDS, read_csv(TUNING_CSV) + rows)
    print(
        f"{sweep}: chose {rows[0]['hyperparameters']} (validation {meta['metric']} {rows[0]['best_metric']:.4f})",
        file=sys.stderr,
        flush=True,
    )


def cell(rows: list[dict[str, str]], key: str, seeds_wanted: int) -> str:
    """Mean ± std over the seeds that trained to the end, and how many diverged; ``(lr 0.1†)`` when every
    seed ran at a lower rate than its tuned one, ``(seed 1 lr 0.1†)`` when only some did."""
    if not rows:
        return "pending"
    trained = [r for r in rows if not r.get("diverged")]
    if trained:
        values = 100 * np.array([float(r[key]) for r in trained])
        text = f"{values.mean():.2f} ± {values.std():.2f}" if len(values) > 1 else f"{values[0]:.2f}"
        fell_back = [r for r in trained if r.get("fell_back_from")]
        if fell_back and len(fell_back) == len(trained) and len({r["lr"] for r in fell_back}) == 1:
            text += f" (lr {fell_back[0]['lr']}†)"  # every seed at the same lower rate
        elif fell_back:
            text += " (" + ", ".join(f"seed {r['seed']} lr {r['lr']}†" for r in fell_back) + ")"
        if len(trained) < len(rows):
            text += f" ({len(rows) - len(trained)} diverged)"
    else:
        text = "diverged"
    return text + (f" ({len(rows)}/{seeds_wanted} seeds)" if len(rows) < seeds_wanted else "")


def entries(count: int) -> str:
    return f"{count} {'entry' if count == 1 else 'entries'}"


def rows_by_cell(results: list[dict[str, str]]) -> dict[tuple[str, str, str], list[dict[str, str]]]:
    """The finished entries of ``results`` grouped by table cell: (group, algorithm, setting) -> its seeds' rows."""
    cells: dict[tuple[str, str, str], list[dict[str, str]]] = {}
    for r in results:
        cells.setdefault((r["group"], r["algorithm"], r["setting"]), []).append(r)
    return cells


def window_label(rounds: int) -> str:
    """The last fifth of ``rounds`` as the tables name it: ``rounds 81–100``."""
    first, last = fifths(rounds)[0]
    return f"rounds {first + 1}–{last}"


def summary_lines(results: list[dict[str, str]], seeds_wanted: int) -> list[str]:
    """The summary page's short tables: one row per algorithm (best first, by its first setting), each cell the
    mean ± std over seeds of the group's ``summary`` value (:func:`cell`); the best cell of a column
    among those that ran on every planned seed (a further seed does not exclude a row) is bold."""
    wanted = set(planned(list(GROUPS), None, list(range(seeds_wanted))))
    finished = {(r["group"], r["algorithm"], r["setting"], int(r["seed"])) for r in results}
    done = (
        f"All {len(wanted)} entries of {seeds_wanted} seeds have finished"
        if wanted <= finished
        else f"{len(wanted & finished)} of {len(wanted)} entries of {seeds_wanted} seeds have finished; a cell marked "
        f"(1/{seeds_wanted} seeds) has not run on every seed yet"
    )
    more_seeds = len(finished - wanted)
    if more_seeds:
        done += f", and {entries(more_seeds)} of further seeds"
    lines = [
        f"{done}; † marks a seed run at a lower learning rate than its tuned one. ± is the standard deviation over "
        "the seeds with divisor n (for 2 seeds: half their gap)."
    ]
    cells_rows = rows_by_cell(results)
    for group, spec in GROUPS.items():
        title, key = spec["summary"]

        def trained(algorithm: str, setting: str) -> list[dict[str, str]]:
            return [r for r in cells_rows.get((group, algorithm, setting), []) if not r.get("diverged")]

        def mean(algorithm: str, setting: str) -> float:
            values = [float(r[key]) for r in trained(algorithm, setting)]
            return float(np.mean(values)) if values else -np.inf

        best = {
            setting: max(
                (a for a in table_algorithms(spec) if len(trained(a, setting)) >= seeds_wanted),
                key=lambda a: mean(a, setting),
                default=None,
            )
            for setting in spec["settings"]
        }
        what = {"last_fifth": f"mean of {window_label(spec['rounds'])}", "final": f"round {spec['rounds']}"}[key]
        lines += [
            "",
            f"| {title}, `{spec['metric']}` (%), {what} | " + " | ".join(SETTING_LABELS[s] for s in spec["settings"]) + " |",
            "|---" * (1 + len(spec["settings"])) + "|",
        ]
        for algorithm in sorted(table_algorithms(spec), key=lambda a: -mean(a, spec["settings"][0])):
            cells = []
            for setting in spec["settings"]:
                text = cell(cells_rows.get((group, algorithm, setting), []), key, seeds_wanted)
                cells.append(f"**{text}**" if best[setting] == algorithm else text)
            lines.append(f"| {LABELS[algorithm]} | " + " | ".join(cells) + " |")
    return lines + paired_lines(results) + [""]  # a blank line ends the last table before the end marker


def paired_cell(rows: list[dict[str, str]], reference_rows: list[dict[str, str]], key: str) -> str:
    """An algorithm's ``key`` minus the reference's, seed by seed (the same seed gives both the same data,
    cohorts, data order and initial weights), over the seeds both trained to the end (:func:`paired_text`)."""
    mine = {r["seed"]: float(r[key]) for r in rows if not r.get("diverged")}
    theirs = {r["seed"]: float(r[key]) for r in reference_rows if not r.get("diverged")}
    return paired_text(mine, theirs, decimals=2, with_n=False) or "–"


def paired_lines(results: list[dict[str, str]]) -> list[str]:
    """The summary page's paired comparisons: per group, every algorithm against the group's reference
    (:data:`GROUPS`' ``reference``) on the summary value, by :func:`paired_cell`."""
    cells_rows = rows_by_cell(results)
    lines = [
        "",
        "**Paired by seed.** Each algorithm's value minus the reference's of the same seed, in points: mean [95 % "
        "confidence interval, Student's t with n − 1 degrees of freedom, n the seeds both trained to the end]; "
        "**bold**: the interval excludes 0. With 2 seeds t has one degree of freedom (t = 12.71), so only a "
        "difference that both seeds show almost equally is resolved.",
    ]
    for group, spec in GROUPS.items():
        title, key = spec["summary"]
        reference = spec["reference"]
        lines += [
            "",
            f"| {title}: minus {LABELS[reference]} | " + " | ".join(SETTING_LABELS[s] for s in spec["settings"]) + " |",
            "|---" * (1 + len(spec["settings"])) + "|",
        ]
        for algorithm in table_algorithms(spec):
            if algorithm == reference:
                continue
            cells = [
                paired_cell(cells_rows.get((group, algorithm, s), []), cells_rows.get((group, reference, s), []), key)
                for s in spec["settings"]
            ]
            lines.append(f"| {LABELS[algorithm]} | " + " | ".join(cells) + " |")
    return lines


def replace_between(text: str, start: str, end: str, block: str, where: Path) -> str:
    """``text`` with what lies between the marker lines ``start`` and ``end`` replaced by ``block``."""
    before, found, rest = text.partition(start)
    if not found or end not in rest:
        raise SystemExit(f"{where}: no generated block to replace; it needs the lines {start!r} and {end!r}")
    return before + start + "\n" + block + "\n" + end + rest.partition(end)[2]


def excluded_line(results: list[dict[str, str]], group: str) -> str:
    """Which finished entries of ``group`` had client updates excluded as non-finite, and how many
    (a run excludes a NaN/inf update from aggregation instead of stopping; see docs/architecture.md)."""
    counted = [r for r in results if r["group"] == group and r.get("excluded_updates", "") != ""]
    hit = [f"{r['algorithm']} {r['setting']} seed {r['seed']}: {r['excluded_updates']}" for r in counted if int(r["excluded_updates"]) > 0]
    updates = GROUPS[group]["rounds"] * GROUPS[group]["clients_per_round"]
    return (
        f"Non-finite client updates excluded from aggregation (of {updates:,} per entry): "
        + ("; ".join(hit) if hit else "none")
        + f" ({entries(len(counted))} counted)."
    )


def fifths(rounds: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """The windows (first, last] of the last fifth of ``rounds`` and of the fifth before it."""
    return (4 * rounds // 5, rounds), (3 * rounds // 5, 4 * rounds // 5)


def curves_by_entry(curves: list[dict[str, str]]) -> dict[tuple[str, str, str, int], list[tuple[int, float]]]:
    """The rows of a curves CSV as each entry's curve [(round, value)], in round order."""
    by_entry: dict[tuple[str, str, str, int], list[tuple[int, float]]] = {}
    for r in curves:
        by_entry.setdefault(entry_key(r), []).append((int(r["round"]), float(r["value"])))
    return {key: sorted(curve) for key, curve in by_entry.items()}


def window_means(curves: list[dict[str, str]], window: tuple[int, int]) -> dict[tuple[str, str, str, int], float]:
    """Per entry of ``curves``, the mean of its evaluations in rounds ``window[0] < round <= window[1]``
    (entries with none there are left out)."""
    inside = {key: [v for r, v in curve if window[0] < r <= window[1]] for key, curve in curves_by_entry(curves).items()}
    return {key: float(np.mean(v)) for key, v in inside.items() if v}


def fallback_line(results: list[dict[str, str]], group: str) -> str:
    """The finished entries of ``group`` whose tuned learning rate diverged or collapsed, and the rate shown (†)."""
    fell_back = [
        f"{r['algorithm']} {r['setting']} seed {r['seed']} ({r['fell_back_from']}; shown at lr {r['lr']})"
        for r in results
        if r["group"] == group and r.get("fell_back_from")
    ]
    return (
        "† The tuned learning rate diverged or collapsed; the entry ran again at the next lower rate of its sweep's grid: "
        + ("; ".join(fell_back) if fell_back else "none")
        + "."
    )


def flatness_line(curves: list[dict[str, str]], group: str) -> str:
    """Whether ``group``'s curves have flattened by the last round: per finished entry, the mean of
    its evaluations in the last fifth of the rounds minus the mean of those in the fifth before."""
    last_fifth, fifth_before = fifths(GROUPS[group]["rounds"])
    last, before = (window_means([r for r in curves if r["group"] == group], w) for w in (last_fifth, fifth_before))
    changes = {key: 100 * (last[key] - before[key]) for key in last if key in before}
    if not changes:
        return "Flattening: no finished curve yet."
    largest = max(changes, key=lambda key: abs(changes[key]))
    return (
        f"Flattening: mean over rounds {last_fifth[0] + 1}–{last_fifth[1]} minus mean over rounds "
        f"{fifth_before[0] + 1}–{fifth_before[1]}, "
        f"median {np.median(list(changes.values())):+.2f} points over {entries(len(changes))}; largest "
        f"{changes[largest]:+.2f} ({largest[1]} {largest[2]} seed {largest[3]})."
    )


def in_progress(runs_dir: Path, done: set[tuple[str, str, str, int]]) -> list[str]:
    """One line per started but unfinished entry in ``runs_dir``: its last evaluated round and value."""
    lines = []
    for group, spec in GROUPS.items():
        for run_dir in sorted(runs_dir.glob(f"{group}-*")):
            # run_entry's <group>-<algorithm>-<setting>-s<seed>, and -lr<lr> for a fallback learning rate
            _, algorithm, setting, seed, *fallback = run_dir.name.split("-")
            if (group, algorithm, setting, int(seed[1:])) in done:
                continue
            rows = [r for r in read_metrics(run_dir) if r.get(spec["metric"]) is not None]
            if rows:
                lines.append(
                    f"- {group} / {algorithm} / {setting} / seed {seed[1:]}{''.join(f' / {f}' for f in fallback)}: "
                    f"round {rows[-1]['round']} "
                    f"of {spec['rounds']}, `{spec['metric']}` {100 * rows[-1][spec['metric']]:.2f} %"
                )
    return lines


def tuning_lines(tuning: list[dict[str, str]]) -> list[str]:
    """The tuning table: each sweep's chosen values and validation score."""
    lines = [
        "**Tuning** — each algorithm's sweep (`tune_configs/fmnist/`), ranked by the best validation score over "
        "20 rounds at Dirichlet α = 0.1 (the self-supervised sweeps: 10 rounds of the `classes2` setting); every "
        "trial is in `docs/results/fmnist_tuning.csv`:",
        "",
        "| sweep | chosen values | validation score | trials: all rounds / stopped early / diverged |",
        "|---|---|---|---|",
    ]
    for sweep in sweep_order():
        rows = [row for row in tuning if row["sweep"] == sweep]
        if not rows:
            lines.append(f"| {sweep} | pending | | |")
            continue
        [chosen] = [row for row in rows if row["chosen"] == "True"]
        values = ", ".join(f"`{key}={value}`" for key, value in json.loads(chosen["hyperparameters"]).items())
        diverged = sum(row["status"] == "ERROR" for row in rows)
        full = sum(int(row["rounds"]) == max(int(r["rounds"]) for r in rows) for row in rows)
        lines.append(
            f"| {sweep} | {values} | {chosen['metric']} {100 * float(chosen['best_metric']):.2f} | "
            f"{full} / {len(rows) - full - diverged} / {diverged} |"
        )
    return lines + [""]


def table_entries(out: Path, extra: list[str], tuning: list[dict[str, str]]) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """The finished entries of ``<out>.csv`` run with today's tuned values (:func:`current_rows`), each with
    ``last_fifth``: the mean of its evaluations over the last fifth of its rounds (empty for one that
    diverged); and the curves (``<out>_curves.csv``) of those that trained to the end."""
    results = current_rows(read_csv(out.with_suffix(".csv")), extra, tuning)
    trained = {entry_key(row) for row in results if not row.get("diverged")}
    curves = [row for row in read_csv(out.with_name(out.stem + "_curves.csv")) if entry_key(row) in trained]
    # The final round alone swings with the clients it sampled (the same for every algorithm of a seed).
    last_fifth = {
        key: mean
        for group, spec in GROUPS.items()
        for key, mean in window_means([r for r in curves if r["group"] == group], fifths(spec["rounds"])[0]).items()
    }
    return [{**row, "last_fifth": last_fifth.get(entry_key(row), "")} for row in results], curves


def report_blocks(out: Path, seeds_wanted: int, runs_dir: Path | None, extra: list[str]) -> tuple[str, str, list[dict[str, str]]]:
    """From the CSVs next to ``out`` alone (running nothing): the generated block of ``out``'s Markdown
    file (between its table markers), the summary page's short tables (between its summary markers)
    and the curves of the entries that trained to the end (the figure's). Unfinished entries under
    ``runs_dir`` are listed after the tables (``None``: none are)."""
    tuning = read_csv(TUNING_CSV)
    results, curves = table_entries(out, extra, tuning)
    current = {entry_key(row) for row in results}
    lines = ["", *tuning_lines(tuning)]
    cells_rows = rows_by_cell(results)
    for group, spec in GROUPS.items():
        settings = spec["settings"]
        window = window_label(spec["rounds"])
        header = [f"{s} final | {s} mean of {window} | {s} best" for s in settings]
        if spec["also"]:
            header = [f"{s} final | {s} mean of {window} | {s} best | {s} std across clients (final)" for s in settings]
        lines += [
            f"**{group}** — `{spec['metric']}` (%), mean ± std (divisor n) over seeds, {spec['rounds']} rounds:",
            "",
            "| algorithm | " + " | ".join(header) + " |",
            "|---|" + "---|" * (len(settings) * (4 if spec["also"] else 3)),
        ]
        for algorithm in table_algorithms(spec):
            cells = []
            for setting in settings:
                rows = cells_rows.get((group, algorithm, setting), [])
                cells += [cell(rows, key, seeds_wanted) for key in ("final", "last_fifth", "best")]
                if spec["also"]:
                    cells.append(cell(rows, f"{spec['also'][0]}_final", seeds_wanted))
            lines.append(f"| {algorithm} | " + " | ".join(cells) + " |")
        lines += ["", fallback_line(results, group), "", excluded_line(results, group), "", flatness_line(curves, group), ""]
    seconds = [float(r["seconds_per_round"]) for r in results]
    if seconds:
        lines.append(f"{len(results)} entries finished; median {np.median(seconds):.1f} s per round on a shared 2-core CPU.")
    unfinished = in_progress(runs_dir, current) if runs_dir is not None else []
    if unfinished:
        lines += ["", "Started, not finished (not in the table; they resume from their last checkpoint):", "", *unfinished]
    return "\n".join(lines) + "\n", "\n".join(summary_lines(results, seeds_wanted)), curves


def report(out: Path, seeds_wanted: int, runs_dir: Path, extra: list[str], summary_page: Path | None = None) -> None:
    """Rewrites the generated table of ``out``'s Markdown file and its figure from the CSVs next to it
    (:func:`report_blocks`), and the short tables of ``summary_page`` (when given; a docs page, never
    the README) between its summary markers. A missing page is created with just a heading and the
    generated block."""
    table, summary, curves = report_blocks(out, seeds_wanted, runs_dir, extra)
    md = out.with_suffix(".md")
    text = md.read_text() if md.is_file() else f"# Fashion-MNIST results\n\n{TABLE_START}\n{TABLE_END}\n"
    md.write_text(replace_between(text, TABLE_START, TABLE_END, table, md))
    if summary_page is not None:
        page = summary_page.read_text() if summary_page.is_file() else f"# Fashion-MNIST summary\n\n{SUMMARY_START}\n{SUMMARY_END}\n"
        summary_page.write_text(replace_between(page, SUMMARY_START, SUMMARY_END, summary, summary_page))
    plot_curves(curves, out.with_suffix(".png"))
    print(table, end="")


#: Round-row columns every run has; the others are the algorithm's own diagnostics (SCAFFOLD's control_norm).
COMMON_ROUND_COLUMNS = {
    "scope",
    "client_id",
    "round",
    "clients",
    "excluded_updates",
    "worker_restarts",
    "train_loss",
    "lr",
    "seconds",
    "test_loss",
}


def diagnose(run_dir: Path, first: int, last: int) -> str:
    """Round by round, from a run's metrics: the evaluated accuracy, the algorithm's diagnostics, and
    the clients' loss (``ce`` where the algorithm reports it, else ``train_loss``) as the cohort's
    median against its largest, with the client that had it. A client update that blows up but stays
    finite shows here as one client far above the median (docs/results/fmnist.md, SCAFFOLD)."""
    from fedray.tracking.metrics_file import read_metrics_table
    from fedray.tracking.health import client_loss_key

    table = read_metrics_table(run_dir).to_pandas()
    table = table[table["round"].between(first, last)]
    rounds = table[table["scope"] == "round"].dropna(axis=1, how="all").set_index("round")
    clients = table[table["scope"] == "client"].dropna(axis=1, how="all")
    loss = client_loss_key(clients.columns)
    own = [c for c in rounds.columns if c not in COMMON_ROUND_COLUMNS and c != "test_accuracy"]
    lines = [
        f"{run_dir.name}: client {loss}, median and largest per round",
        "| round | test_accuracy | " + " | ".join(own) + f" | median {loss} | largest {loss} (client) |",
        "|---" * (4 + len(own)) + "|",
    ]
    for round, cohort in clients.groupby("round"):
        worst = cohort.loc[cohort[loss].idxmax()]
        row = rounds.loc[round] if round in rounds.index else {}
        accuracy = row.get("test_accuracy") if len(row) else None
        cells = [f"{round}", "" if accuracy is None or accuracy != accuracy else f"{100 * accuracy:.2f}"]
        cells += [f"{row[c]:.4g}" if len(row) and row[c] == row[c] else "" for c in own]
        cells += [f"{cohort[loss].median():.4g}", f"{worst[loss]:.4g} ({int(worst['client_id'])})"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def warning_replay(run_dir: Path, num_classes: int = 10) -> dict[str, Any] | None:
    """Replays the progress output's blow-up warning (:func:`fedray.tracking.health.loss_outliers`, with
    the chance loss ln C of ``num_classes`` classes) over the client rows of the run in ``run_dir``,
    beside how it ended: its first collapse (the rule of :func:`collapse`; personalised runs judged by
    ``personal_accuracy``, as in the table) and its last round against the rounds its config planned (a
    run that diverged stops before them). None for a folder without metrics. ``first_warning`` names the
    first warned round's largest outlier."""
    from fedray.tracking.metrics_file import read_metrics_table
    from fedray.tracking.health import loss_outliers

    table = read_metrics_table(run_dir)
    if table is None:
        return None
    rows = table.to_pylist()
    by_round: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        if row["scope"] == "client":
            by_round.setdefault(row["round"], []).append({k: v for k, v in row.items() if v is not None})
    warned, first_warning = [], ""
    for round, cohort in sorted(by_round.items()):
        key, median, outliers = loss_outliers(cohort, math.log(num_classes))
        if outliers:
            warned.append(round)
            client, loss = outliers[0]
            first_warning = first_warning or f"round {round} (client {client}: {key} {loss:.3g}, median {median:.3g})"
    round_rows = [r for r in rows if r["scope"] == "round"]
    metric = "personal_accuracy" if any(r.get("personal_accuracy") is not None for r in round_rows) else "test_accuracy"
    return {
        "run": run_dir.name,
        "rounds": len(by_round),
        "warned_rounds": " ".join(map(str, warned)),
        "first_warning": first_warning,
        "first_collapse": collapse([(r["round"], r[metric]) for r in round_rows if r.get(metric) is not None], None),
        "last_round": max((r["round"] for r in round_rows), default=0),
        "planned_rounds": load_config(run_dir / SAVED_CONFIG_FILE).train.rounds if (run_dir / SAVED_CONFIG_FILE).is_file() else "",
    }


def replay_warnings(run_dirs: list[Path], num_classes: int = 10) -> str:
    """:func:`warning_replay` over every run in ``run_dirs``: how many rounds it read, and a row per run
    warned about or collapsed."""
    replays = [replay for run_dir in run_dirs if (replay := warning_replay(run_dir, num_classes)) is not None]
    lines = ["| run | rounds | warned in rounds | first collapse | last round |", "|---|---|---|---|---|"]
    for r in replays:
        if r["warned_rounds"] or r["first_collapse"]:
            warned = r["warned_rounds"].replace(" ", ", ") or "—"
            lines.append(f"| {r['run']} | {r['rounds']} | {warned} | {r['first_collapse'] or '—'} | {r['last_round']} |")
    rounds = sum(r["rounds"] for r in replays)
    return "\n".join([f"{len(run_dirs)} runs, {rounds} rounds with client rows; the runs warned about or collapsed:", *lines])


def plot_curves(curves: list[dict[str, str]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(group, setting) for group, spec in GROUPS.items() for setting in spec["settings"]]
    fig, axes = plt.subplots(len(GROUPS), 2, figsize=(12, 4 * len(GROUPS)), squeeze=False)
    for ax in axes.flat[len(panels) :]:
        ax.axis("off")
    by_entry = curves_by_entry(curves)
    for ax, (group, setting) in zip(axes.flat, panels):
        for algorithm in table_algorithms(GROUPS[group]):
            seeds = [curve for key, curve in by_entry.items() if key[:3] == (group, algorithm, setting)]
            if seeds:
                plot_mean_band(ax, seeds, algorithm)
        ax.set_title(f"Fashion-MNIST, {group}, {setting}")
        ax.set_xlabel("round")
        ax.set_ylabel(GROUPS[group]["metric"])
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "pending", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", nargs="+", choices=list(GROUPS), default=list(GROUPS))
    parser.add_argument("--algorithms", nargs="+", default=None, help="only these algorithms (default: all of each group)")
    parser.add_argument("--seeds", nargs="+", type=int, default=SEEDS)
    parser.add_argument(
        "--set",
        dest="extra",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra override for every run (changes the protocol: use another --out)",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="table to write; the CSVs and the PNG sit next to it")
    parser.add_argument(
        "--runs-dir", type=Path, default=REPO / "runs" / "real_table", help="run directories (checkpoints of unfinished entries)"
    )
    parser.add_argument("--report", action="store_true", help="only regenerate the table and the figure from the CSVs")
    parser.add_argument(
        "--diagnose",
        type=Path,
        metavar="RUN_DIR",
        help="only print a run's accuracy, diagnostics and client losses per round (a run folder "
        "under --runs-dir, e.g. runs/real_table/global-scaffold-dir0.1-s0-lr0.05)",
    )
    parser.add_argument(
        "--replay-warnings",
        nargs="+",
        type=Path,
        metavar="FOLDER",
        help="only replay the blow-up warning over every run folder in these folders (e.g. "
        "runs/real_table runs/real_table_sweeps/*/trials) and print where it fires",
    )
    parser.add_argument(
        "--rounds", type=int, nargs=2, default=[1, 10**9], metavar=("FIRST", "LAST"), help="with --diagnose: only these rounds"
    )
    parser.add_argument(
        "--trust-tune-state",
        action="store_true",
        help="resume a sweep whose Tune state changed after fedray recorded it (this script was "
        "stopped while Tune was saving); only for a sweep folder you trust",
    )
    args = parser.parse_args(argv)
    if args.diagnose:
        print(diagnose(args.diagnose, *args.rounds))
        return 0
    if args.replay_warnings:
        print(replay_warnings(sorted(run for folder in args.replay_warnings for run in folder.iterdir() if run.is_dir())))
        return 0
    if not args.report:
        try:
            run_all(args)
        except KeyboardInterrupt:
            print("stopped; the same command resumes (finished entries are in the CSV)", file=sys.stderr)
            return 130
    # The summary page's short tables are this protocol's: another --out leaves them alone.
    summary_page = SUMMARY_PAGE if args.out == DEFAULT_OUT else None
    report(args.out, len(args.seeds), args.runs_dir, args.extra, summary_page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
