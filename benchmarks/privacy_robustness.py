"""Privacy-utility and robustness tables on digits (docs/guide/privacy.md), in this process on the
local backend: FedAvg under central DP at ε ∈ {1, 4, 8, ∞}, and each robust rule against 0/10/20 %
sign-flipping clients. Prints two Markdown tables.

    python benchmarks/privacy_robustness.py            # about 90 s on two CPU cores
"""

from __future__ import annotations

import tempfile

from fedray.testing import Federation

COMMON = [
    "data.num_clients=20",
    "train.clients_per_round=10",
    "train.local_epochs=1",
    "data.partition=iid",
    "train.lr=0.1",
    "resources.num_workers=1",
]
PRIVACY_ROUNDS, ROBUST_ROUNDS = 20, 15
# 20 simulated clients emulate a population of 5,000 sampling 200 per round (noise_cohort_size)
DP = [
    "privacy.mechanism=central",
    "privacy.clip=0.5",
    "privacy.delta=1e-4",
    "privacy.population_size=5000",
    "privacy.noise_cohort_size=200",
]


def final_accuracy(overrides: list[str], rounds: int) -> dict:
    with tempfile.TemporaryDirectory() as run_dir:
        federation = Federation(run_dir, [*COMMON, f"train.rounds={rounds}", *overrides], defaults=()).run(rounds)
        return federation.rows[-1]


def main() -> None:
    print(f"| ε (δ = 1e-4) | z | test accuracy after {PRIVACY_ROUNDS} rounds |\n|---|---|---|")
    for epsilon in (1, 4, 8, None):
        row = final_accuracy([*DP, f"privacy.target_epsilon={epsilon}"] if epsilon else [], PRIVACY_ROUNDS)
        z = f"{row['dp_noise_multiplier']:.3f}" if epsilon else "–"
        print(f"| {epsilon or '∞'} | {z} | {row['test_accuracy']:.3f} |")
    print(f"\n| rule | 0 % | 10 % | 20 % sign-flipping clients (test accuracy after {ROBUST_ROUNDS} rounds) |\n|---|---|---|---|")
    for rule in ("none", "median", "trimmed_mean", "krum", "multi_krum"):
        cells = []
        for fraction in (0.0, 0.1, 0.2):
            extra = [f"robust.rule={rule}", f"robust.malicious_fraction={fraction}", "robust.trim_fraction=0.2", "robust.krum_f=2"]
            cells.append(f"{final_accuracy(extra, ROBUST_ROUNDS)['test_accuracy']:.3f}")
        print(f"| {rule} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
