"""How evenly the scheduler splits each round's compute across the workers (no training, no Ray).

For every round's cohort it places the clients as the server does, then reports the slowest
worker's compute (samples × epochs × forward FLOPs per image of the client's model) over the mean,
averaged over the rounds: once with costs of samples × epochs alone (the scheduling before model
FLOPs were counted) and once with the server's costs::

    python benchmarks/schedule_balance.py examples/hetero_ssfl_digits.yaml --set data.name=fmnist \
        --set data.num_clients=100 --set data.alpha=0.1 --rounds 100
"""

from __future__ import annotations

import argparse

import numpy as np

from fedray import load_config
from fedray.data import build_federated_dataset
from fedray.runtime.scheduler import assign_clients, client_forward_flops
from fedray.runtime.worker import build_algorithm
from fedray.seeding import sample_cohort


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--rounds", type=int, default=100)
    args = parser.parse_args()

    config = load_config(args.config, args.overrides)
    data = build_federated_dataset(config.data, config.seed)
    algorithm = build_algorithm(config, data)
    samples = data.clients.sizes * config.train.local_epochs
    compute = samples * client_forward_flops(algorithm, data)
    workers = config.resources.num_workers

    def slowest_over_mean(costs: np.ndarray) -> float:
        ratios = []
        for round in range(1, args.rounds + 1):
            cohort = sample_cohort(config.seed, round, data.num_clients, config.train.clients_per_round)
            parts = assign_clients(cohort, costs[cohort], workers, sticky=algorithm.keeps_client_state)
            loads = [compute[part].sum() for part in parts]
            ratios.append(max(loads) / np.mean(loads))
        return float(np.mean(ratios))

    print(f"{config.algorithm.name}, {data.num_clients} clients, {workers} workers, {args.rounds} rounds: "
          f"slowest worker's compute / mean {slowest_over_mean(samples * 1.0):.3f} (costed by samples) -> "
          f"{slowest_over_mean(compute):.3f} (by samples × model FLOPs)")


if __name__ == "__main__":
    main()
