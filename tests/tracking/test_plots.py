"""The run's figures (fedray/tracking/plots.py): their titles name the partition with the parameter that
shapes it, and only that one (a natural partition has no α)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedray import load_config
from fedray.config.schema import DataConfig
from fedray.tracking import RunContext
from fedray.tracking.plots import Plots, partition_description

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"partition": "natural", "name": "pystdlib_chars"}, "natural"),
        ({"partition": "iid"}, "iid"),
        ({"partition": "dirichlet", "alpha": 0.1}, "dirichlet, α=0.1"),
        ({"partition": "dirichlet_equal_size", "alpha": 0.5, "imbalance_ratio": 10}, "dirichlet_equal_size, α=0.5, ρ=10"),
        ({"partition": "dirichlet_equal_size", "alpha": 0.5}, "dirichlet_equal_size, α=0.5"),
        ({"partition": "shards", "classes_per_client": 3}, "shards, 3 classes per client"),
        ({"partition": "quantity", "quantity_sigma": 0.8}, "quantity, σ=0.8"),
    ],
)
def test_the_title_names_the_partitions_own_parameter(data, expected):
    assert partition_description(DataConfig(**data)) == expected


def test_the_figures_of_a_natural_partition_show_no_alpha(tmp_path):
    """The run's figure titles (``Plots``): the example of a natural partition, whose data.alpha is a default it never uses."""
    config = load_config(REPO / "examples" / "fedavg_text_stdlib.yaml")
    assert config.data.partition == "natural"
    run = RunContext(config=config, run_dir=tmp_path, data=None, server=None, start_round=0)
    assert Plots()._title(run) == f"fedavg on pystdlib_chars (natural, {config.data.num_clients} clients)"
