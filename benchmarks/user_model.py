"""A user's plain ``nn.Module`` against the built-in model it copies: does wrapping cost anything?

``PlainSmallCNN`` below is ``cnn_small`` written as a researcher would, as one ``nn.Sequential`` that
maps a batch to logits; fedray wraps it into its encoder / classifier contract (the last ``nn.Linear``
is the classifier). Both train the same FedAvg workload (W1's shape on digits: 1000 clients under
Dirichlet 0.5, 100 per round, 1 local epoch, batch 16) on the local backend (one worker, in this
process), alternately, ``--repeats`` times each; steady state = median seconds per round over rounds
3..N-1. The target (issue 40): the user module within 10 % of the built-in's seconds per round.

    python benchmarks/user_model.py               # 3 repeats of 12 rounds each
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from w1_overhead import RoundClock, steady  # noqa: E402

from fedray import load_config, run_experiment  # noqa: E402

WORKLOAD = [
    "data.name=digits",
    "data.num_clients=1000",
    "data.partition=dirichlet",
    "data.alpha=0.5",
    "data.min_samples_per_client=1",
    "algorithm.name=fedavg",
    "train.clients_per_round=100",
    "train.local_epochs=1",
    "train.batch_size=16",
    "train.lr=0.05",
    "resources.backend=local",
    "resources.num_workers=1",
    "checkpoint.every=1000",
    "output.tensorboard=false",
    "output.plots=false",
]


class PlainSmallCNN(nn.Sequential):
    """``cnn_small`` (conv(1→16)-ReLU-conv(16→32)-ReLU-maxpool2-fc(512→64)-ReLU-fc(64→10)) as a plain module."""

    def __init__(self, in_channels: int, image_size: int, num_classes: int, width: int = 16) -> None:
        pooled = image_size // 2
        super().__init__(
            nn.Conv2d(in_channels, width, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(2 * width * pooled * pooled, 64),
            nn.ReLU(),
            nn.Linear(64, num_classes),
        )


def steady_seconds(model: str, rounds: int, out_dir: str) -> tuple[float, float | None]:
    config = load_config(None, [*WORKLOAD, f"model.name={model}", f"train.rounds={rounds}", f"output.dir={out_dir}"])
    clock = RoundClock()
    summary = run_experiment(config, progress=False, extra_callbacks=[clock])
    return steady(clock.seconds), summary.final_test_accuracy


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args(argv)
    models = {"built-in cnn_small": "cnn_small", "user PlainSmallCNN": "user_model:PlainSmallCNN"}
    seconds: dict[str, list[float]] = {name: [] for name in models}
    accuracy: dict[str, float | None] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for _ in range(args.repeats):
            for name, model in models.items():
                value, accuracy[name] = steady_seconds(model, args.rounds, scratch)
                seconds[name].append(value)
    for name, runs in seconds.items():
        print(
            f"{name:<20} {statistics.median(runs):.4f} s/round   (runs {', '.join(f'{s:.4f}' for s in runs)}; final acc. {accuracy[name]:.4f})"
        )
    ratio = statistics.median(seconds["user PlainSmallCNN"]) / statistics.median(seconds["built-in cnn_small"])
    print(f"ratio user / built-in: {ratio:.3f}   target <= 1.10 -> {'met' if ratio <= 1.10 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
