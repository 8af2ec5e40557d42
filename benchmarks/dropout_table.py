"""Accuracy against simulated time under dropout: FedAvg, FedProx, FedSC and FedRCL on the digits
data with 0, 10, 30 and 50 % of the selected clients dropping out (docs/guide/systems.md).

Each run: ``examples/fedavg_dropout_digits.yaml``'s devices (phone profiles) and Bernoulli
availability 0.8, K = 10 reports a round of 50 clients, 1.3× over-selection, no deadline (a round
waits for every selected client to report or drop), ``--rounds`` rounds on the local backend; FedSC
and FedRCL with the settings of examples/fedsc_digits.yaml and examples/fedrcl_digits.yaml. The
table gives, per method and dropout, the simulated time the run took, the clients aggregated per
round, and the best test accuracy reached by a quarter, a half and all of the 0 % run's simulated
time: equal simulated time, not equal rounds.

Resumable: each finished run is a row of ``--csv`` (default docs/results/dropout.csv), skipped when
the script runs again with the same ``--rounds``; the Markdown table is printed from that file.

    nice -n 10 python benchmarks/dropout_table.py --rounds 40
"""

from __future__ import annotations

import argparse
import csv
import tempfile
from pathlib import Path

import fedray

REPO = Path(__file__).resolve().parents[1]
METHODS = {
    "FedAvg": ["algorithm.name=fedavg"],
    "FedProx": ["algorithm.name=fedprox", "algorithm.mu=0.01"],
    "FedSC": [
        "algorithm.name=fedsc",
        "algorithm.tau=0.05",
        "algorithm.num_neighbors=2",
        "algorithm.lam_rpcl=1.0",
        "algorithm.lam_cpdr=1.0",
        "algorithm.cpdr_metric=mse",
        "algorithm.rpcl_variant=multi_positive",
        "algorithm.u_mode=batch",
        "algorithm.proto_source=eval_pass",
    ],
    "FedRCL": [
        "algorithm.name=fedrcl",
        "algorithm.variant=official",
        "algorithm.tau=0.05",
        "algorithm.beta=1.0",
        "algorithm.lam=0.7",
        "algorithm.weighted=true",
        "train.lr_decay=0.998",
        "train.grad_clip=10",
    ],
}
COLUMNS = ["method", "dropout", "rounds", "sim_time", "aggregated_per_round", "acc_quarter_T", "acc_half_T", "acc_T"]
DROPOUTS = (0.0, 0.1, 0.3, 0.5)


def run(overrides: list[str], output: str) -> list[dict]:
    config = fedray.load_config(
        REPO / "examples" / "fedavg_dropout_digits.yaml",
        [f"output.dir={output}", "output.plots=false", "output.tensorboard=false", "systems.selection.deadline_seconds=null", *overrides],
    )
    return fedray.read_metrics(fedray.run_experiment(config, progress=False).run_dir)


def best_by(rows: list[dict], sim_time: float) -> float:
    return max((row["test_accuracy"] for row in rows if row["sim_time"] <= sim_time), default=float("nan"))


def table(rows: list[dict[str, str]]) -> str:
    lines = [
        "| method | dropout | sim. time (s) | aggregated / round | acc. @ ¼ T | acc. @ ½ T | acc. @ T |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        accuracies = " | ".join(f"{float(row[key]):.3f}" for key in ("acc_quarter_T", "acc_half_T", "acc_T"))
        lines.append(
            f"| {row['method']} | {float(row['dropout']):.0%} | {float(row['sim_time']):.0f} | {float(row['aggregated_per_round']):.1f} | {accuracies} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--csv", type=Path, default=REPO / "docs" / "results" / "dropout.csv")
    args = parser.parse_args()
    done = list(csv.DictReader(args.csv.open())) if args.csv.exists() else []
    done = [row for row in done if int(row["rounds"]) == args.rounds]
    with tempfile.TemporaryDirectory() as output:
        for method, overrides in METHODS.items():
            for dropout in DROPOUTS:
                if any(row["method"] == method and float(row["dropout"]) == dropout for row in done):
                    continue
                rows = run([*overrides, f"train.rounds={args.rounds}", f"systems.selection.dropout={dropout}"], output)
                horizon = next((float(r["sim_time"]) for r in done if r["method"] == method and float(r["dropout"]) == 0.0), None)
                horizon = horizon or rows[-1]["sim_time"]  # T: the 0 % run's simulated time
                result = {
                    "method": method,
                    "dropout": dropout,
                    "rounds": args.rounds,
                    "sim_time": rows[-1]["sim_time"],
                    "aggregated_per_round": sum(row["aggregated"] for row in rows) / len(rows),
                    **{key: best_by(rows, horizon * share) for key, share in zip(COLUMNS[5:], (0.25, 0.5, 1.0))},
                }
                done.append({key: str(value) for key, value in result.items()})
                with args.csv.open("w", newline="") as file:
                    writer = csv.DictWriter(file, COLUMNS)
                    writer.writeheader()
                    writer.writerows(done)
                print(table(done[-1:]).splitlines()[-1], flush=True)
    print(table(done))


if __name__ == "__main__":
    main()
