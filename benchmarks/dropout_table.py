"""Accuracy against simulated time under dropout: FedAvg and FedProx on the digits data with 0, 10,
30 and 50 % of the selected clients dropping out (docs/guide/systems.md).

Each run: ``examples/fedavg_dropout_digits.yaml``'s devices (phone profiles) and Bernoulli
availability 0.8, K = 10 reports a round of 50 clients, 1.3× over-selection, no deadline (a round
waits for every selected client to report or drop), ``--rounds`` rounds on the local backend. The
table gives, per method and dropout, the simulated time the run took, the clients aggregated per
round, and the best test accuracy reached by a quarter, a half and all of the 0 % run's simulated
time: equal simulated time, not equal rounds.

    nice -n 10 python benchmarks/dropout_table.py --rounds 20
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import fedray

REPO = Path(__file__).resolve().parents[1]
METHODS = {"FedAvg": ["algorithm.name=fedavg"], "FedProx": ["algorithm.name=fedprox", "algorithm.mu=0.01"]}
DROPOUTS = (0.0, 0.1, 0.3, 0.5)


def run(overrides: list[str], output: str) -> list[dict]:
    config = fedray.load_config(
        REPO / "examples" / "fedavg_dropout_digits.yaml",
        [f"output.dir={output}", "output.plots=false", "output.tensorboard=false", "systems.selection.deadline_seconds=null", *overrides],
    )
    return fedray.read_metrics(fedray.run_experiment(config, progress=False).run_dir)


def best_by(rows: list[dict], sim_time: float) -> float:
    return max((row["test_accuracy"] for row in rows if row["sim_time"] <= sim_time), default=float("nan"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    lines = [
        "| method | dropout | sim. time (s) | aggregated / round | acc. @ ¼ T | acc. @ ½ T | acc. @ T |",
        "|---|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory() as output:
        for method, overrides in METHODS.items():
            horizon = None
            for dropout in DROPOUTS:
                rows = run([*overrides, f"train.rounds={args.rounds}", f"systems.selection.dropout={dropout}"], output)
                horizon = horizon or rows[-1]["sim_time"]  # T: the 0 % run's simulated time
                aggregated = sum(row["aggregated"] for row in rows) / len(rows)
                accuracies = " | ".join(f"{best_by(rows, horizon * share):.3f}" for share in (0.25, 0.5, 1.0))
                lines.append(f"| {method} | {dropout:.0%} | {rows[-1]['sim_time']:.0f} | {aggregated:.1f} | {accuracies} |")
                print(lines[-1], flush=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
