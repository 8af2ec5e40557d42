"""Linear-probe accuracy of untrained encoders on Fashion-MNIST: the floor of the self-supervised rows.

The self-supervised rows of ``real_table.py`` are scored by a linear probe on frozen encoders. A
randomly initialised CNN already gives features a linear classifier can use, so a probe accuracy
means something only next to this floor. For every architecture those rows probe (the encoders of
Hetero-SSFL's ``algorithm.architectures`` and of FedAvg+BYOL's ``model``) and each seed, this builds
the model as the algorithm does, untrained, and probes it exactly as the table does: embed the
whole labelled training set and the test set, then train ``Linear(feature_dim, 10)`` with Adam for
``probe_epochs`` at ``probe_lr`` and batch ``probe_batch_size`` (the table's values). Rows go to
``docs/results/fmnist_probe_floor.csv``::

    python benchmarks/probe_floor.py            # ~1 minute per architecture and seed on 2 cores
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

import real_table
from fedray.algorithms.ssl import embed, linear_probe
from fedray.data import build_federated_dataset
from fedray.runtime.worker import build_algorithm

OUT = real_table.REPO / "docs" / "results" / "fmnist_probe_floor.csv"
ALGORITHMS = ["hetero_ssfl", "fedavg_byol"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()

    tuning = real_table.read_csv(real_table.TUNING_CSV)
    rows, probed = [], set()
    for algorithm_name in ALGORITHMS:
        for seed in args.seeds:
            config = real_table.config_for(algorithm_name, real_table.GROUPS["ssl"]["settings"][0], seed, [], tuning)
            data = build_federated_dataset(config.data, config.seed)
            algorithm = build_algorithm(config, data)
            params = algorithm.params
            train = torch.tensor(data.train.x), torch.tensor(data.train.y)
            test = torch.tensor(data.test.x), torch.tensor(data.test.y)
            for key in dict.fromkeys(algorithm.model_key(c) for c in range(data.num_clients)):
                architecture = algorithm.model_config(key)
                name = f"{architecture.name}_w{architecture.width}"
                if (name, seed) in probed:  # the same encoder another algorithm probes
                    continue
                probed.add((name, seed))
                started = time.perf_counter()
                torch.manual_seed(seed)
                model = algorithm.build_model(key)
                train_features = embed(model, model.encode, train[0], data.info, config.eval.batch_size)
                test_features = embed(model, model.encode, test[0], data.info, config.eval.batch_size)
                result = linear_probe(
                    train_features,
                    train[1],
                    test_features,
                    test[1],
                    data.info.num_classes,
                    params.probe_epochs,
                    params.probe_lr,
                    params.probe_batch_size,
                    torch.Generator().manual_seed(seed),
                )
                rows.append(
                    {
                        "architecture": name,
                        "probed_for": algorithm_name,
                        "seed": seed,
                        "probe_accuracy": round(result["accuracy"], 4),
                        "probe_epochs": params.probe_epochs,
                        "seconds": round(time.perf_counter() - started, 1),
                    }
                )
                print(rows[-1], flush=True)
                real_table.write_csv(args.out, list(rows[0]), rows)  # after each row: a stop keeps the finished ones


if __name__ == "__main__":
    main()
