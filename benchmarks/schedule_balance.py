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
from fedray.config import RunConfig
from fedray.data import build_federated_dataset
from fedray.algorithms.costs import client_forward_flops
from fedray.runtime.scheduler import assign_clients
from fedray.runtime.worker import build_algorithm
from fedray.seeding import sample_cohort


def slowest_over_mean(config: RunConfig, costs: np.ndarray, compute: np.ndarray, rounds: int, sticky: bool) -> float:
    """Mean over rounds 1..``rounds`` of the slowest worker's ``compute`` over the workers' mean,
    each round's cohort placed by ``assign_clients`` with ``costs`` (both ``[num_clients]``)."""
    ratios = []
    for round in range(1, rounds + 1):
        cohort = sample_cohort(config.seed, round, config.data.num_clients, config.train.clients_per_round)
        parts = assign_clients(cohort, costs[cohort], config.resources.num_workers, sticky=sticky)
        loads = [compute[part].sum() for part in parts]
        ratios.append(max(loads) / np.mean(loads))
    return float(np.mean(ratios))


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
    before, after = (
        slowest_over_mean(config, costs, compute, args.rounds, algorithm.keeps_client_state) for costs in (samples * 1.0, compute)
    )
    print(
        f"{config.algorithm.name}, {data.num_clients} clients, {config.resources.num_workers} workers, {args.rounds} rounds: "
        f"slowest worker's compute / mean {before:.3f} (costed by samples) -> {after:.3f} (by samples × model FLOPs)"
    )


if __name__ == "__main__":
    main()
