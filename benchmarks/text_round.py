"""The text benchmark's round time against a plain PyTorch loop on the same clients.

Workload: ``examples/fedavg_text_stdlib.yaml`` (next-character prediction, one client per Python
standard-library module, ``char_lstm``), with plain SGD so that the plain loop of
``benchmarks/w1_overhead.py`` (``run_plain``: the same cohorts, the same client training, one torch
thread) does exactly what fedray's FedAvg does. fedray runs on the local backend (one worker, in this
process) and, in the same invocation, on Ray with two worker actors. Steady state = median seconds
per round over rounds 3..N-1.

    python benchmarks/text_round.py            # 20 rounds
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from w1_overhead import run_fedray, run_plain  # noqa: E402

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "fedavg_text_stdlib.yaml"


def example_overrides(rounds: int) -> list[str]:
    """The example config as ``--set`` overrides, with SGD and ``rounds`` rounds."""
    sections = yaml.safe_load(EXAMPLE.read_text())
    overrides = [
        f"{section}.{key}={value}" for section, values in sections.items() if isinstance(values, dict) for key, value in values.items()
    ]
    return [
        *overrides,
        "train.optimizer=sgd",
        "train.lr=0.5",
        f"train.rounds={rounds}",
        "checkpoint.every=1000",
        "output.tensorboard=false",
        "output.plots=false",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args(argv)
    overrides = example_overrides(args.rounds)
    with tempfile.TemporaryDirectory() as scratch:
        plain = run_plain(overrides)
        local = run_fedray([*overrides, "resources.backend=local", "resources.num_workers=1"], scratch)
        on_ray = run_fedray([*overrides, "resources.backend=ray", "resources.num_workers=2"], scratch)
    print(f"{'':<22}{'s/round':>10}{'× plain':>10}{'end to end s':>14}{'final acc.':>12}")
    for name, run in (("plain PyTorch loop", plain), ("fedray local, 1 worker", local), ("fedray Ray, 2 workers", on_ray)):
        print(
            f"{name:<22}{run['steady_round_s']:>10.3f}{run['steady_round_s'] / plain['steady_round_s']:>10.2f}"
            f"{run['end_to_end_s']:>14.1f}{run['final_accuracy']:>12.4f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
