"""``eval.personalized``: every evaluated round records the distribution of the clients' headline metric on
their own held-out splits — ``personal_<headline>_worst``, ``_p10`` (the value 10 % of the clients are
worse than: the 10th percentile of a metric where higher is better, the 90th of one where lower is
better), ``_median``, ``_std`` and ``_client_mean`` — checked against each client's own value, read from
the engine after the round. Local backend, tiny runs; a classification (accuracy, higher is better) and a
regression (RMSE, lower is better)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import fedray
from fedray.tracking import Callback, read_metrics

REPO = Path(__file__).resolve().parents[2]
COMMON = [
    "resources.backend=local",
    "resources.num_workers=1",
    "data.num_clients=8",
    "train.clients_per_round=4",
    "train.local_epochs=1",
    "train.rounds=2",
    "checkpoint.every=2",
    "data.client_test_fraction=0.3",
    "eval.personalized=true",
    "output.tensorboard=false",
    "output.plots=false",
]


class ClientValues(Callback):
    """Each client's headline on its held-out split after each evaluated round, asked of the engine."""

    def __init__(self) -> None:
        self.by_round: dict[int, np.ndarray] = {}

    def on_round_end(self, run, row, client_rows):
        engine = run.server
        task = engine.algorithm.task
        if f"personal_{task.headline}" not in row:
            return
        clients = np.flatnonzero(engine.client_test_sizes > 0)
        per_client = engine.evaluate_each_client(
            "evaluate_clients", row["round"], clients, np.ones(len(clients)), engine.broadcast(row["round"] + 1)
        )
        self.by_round[row["round"]] = np.array([task.metrics(sums)[task.headline] for sums in per_client.values()])


def run(tmp_path: Path, overrides: list[str]) -> tuple[list[dict], ClientValues]:
    config = fedray.load_config(
        REPO / "examples" / "fedavg_digits.yaml", [f"output.dir={tmp_path}", "output.name=run", *COMMON, *overrides]
    )
    values = ClientValues()
    fedray.run_experiment(config, progress=False, extra_callbacks=[values])
    return read_metrics(tmp_path / "run", "round"), values


def linear_percentile(values: np.ndarray, q: float) -> float:
    """The q-th percentile with linear interpolation between the sorted values (numpy's default), by hand."""
    ordered = np.sort(values)
    position = q / 100 * (len(ordered) - 1)
    low = int(np.floor(position))
    high = min(low + 1, len(ordered) - 1)
    return float(ordered[low] + (position - low) * (ordered[high] - ordered[low]))


def check_distribution(rows: list[dict], values: ClientValues, key: str, mode: str) -> None:
    assert sorted(values.by_round) == [1, 2]
    for row in rows:
        clients = values.by_round[row["round"]]
        assert len(clients) == 8 and len(set(clients.tolist())) > 2  # enough distinct values for a percentile to mean something
        worse_first = np.sort(clients) if mode == "max" else np.sort(clients)[::-1]
        assert row[f"{key}_worst"] == pytest.approx(worse_first[0])
        assert row[f"{key}_median"] == pytest.approx(linear_percentile(clients, 50))
        assert row[f"{key}_p10"] == pytest.approx(linear_percentile(clients, 10 if mode == "max" else 90))
        assert row[f"{key}_std"] == pytest.approx(float(np.sqrt(np.mean((clients - clients.mean()) ** 2))))  # population std
        assert row[f"{key}_client_mean"] == pytest.approx(clients.mean())
        # p10 lies between the worst client and the median, on the worse side of the median
        if mode == "max":
            assert row[f"{key}_worst"] <= row[f"{key}_p10"] <= row[f"{key}_median"]
        else:
            assert row[f"{key}_worst"] >= row[f"{key}_p10"] >= row[f"{key}_median"]


def test_personal_accuracy_distribution_worst_p10_median(tmp_path):
    rows, values = run(tmp_path, ["algorithm.name=fedper"])
    check_distribution(rows, values, "personal_accuracy", "max")


def test_personal_rmse_distribution_takes_the_high_values_as_the_worse_ones(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 4))
    y = x @ np.array([1.0, -2.0, 0.5, 0.0]) + rng.normal(scale=0.5, size=400)
    pd.DataFrame({**{f"x{i}": x[:, i] for i in range(4)}, "y": y}).to_csv(tmp_path / "table.csv", index=False)
    rows, values = run(
        tmp_path,
        [
            "data.name=table",
            f"data.path={tmp_path / 'table.csv'}",
            "data.task=regression",
            "data.target_columns=[y]",
            "data.partition=iid",
            "model.name=mlp",
            "model.width=16",
        ],
    )
    check_distribution(rows, values, "personal_rmse", "min")
