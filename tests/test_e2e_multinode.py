"""A real two-node Ray cluster on this machine (fedray.cluster.local): runs submitted with
``fedray submit`` spread their workers over both nodes, return their results through a ``file://``
URI, and survive losing the second node mid-run with the same final model.

The cluster is isolated from the session's ``ray_session`` and from any other Ray on the machine
(own ports, temp dir and token) and only its own processes are stopped.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time

import pyarrow.parquet as pq
import pytest
import torch
import yaml

from fedray.cluster.local import LocalCluster
from fedray.cluster.placement import WORKERS_FILE
from fedray.runtime import list_checkpoints, load_checkpoint
from fedray.tracking import read_metrics

from e2e_helpers import final_weights, comparable_rows

pytestmark = [pytest.mark.slow, pytest.mark.ray]

ROUNDS = 5
RUN_CONFIG = f"""\
algorithm: {{name: fedprox, mu: 0.1}}
data: {{num_clients: 8}}
train: {{rounds: {ROUNDS}, clients_per_round: 4, local_epochs: 1}}
checkpoint: {{every: 1, keep: 1}}
resources: {{num_workers: 2, placement_strategy: SPREAD}}
output: {{name: run, tensorboard: false, plots: false}}
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Head (2 CPUs) + second node (2 CPUs); yields the cluster, the second node and both node ids."""
    # A short directory: Ray's Unix socket paths under it must stay below 108 bytes.
    with LocalCluster(tmp_path_factory.mktemp("c")) as cluster:
        cluster.start_head(num_cpus=2)
        second = cluster.add_node(num_cpus=2, resources={"second_node": 2})
        nodes = {("head" if node["is_head_node"] else "second"): node["node_id"] for node in cluster.alive_nodes()}
        yield cluster, second, nodes


@pytest.fixture(scope="module")
def work_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("work")
    (directory / "run.yaml").write_text(RUN_CONFIG)
    return directory


def fedray(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess:
    """The ``fedray`` command, with only this cluster's address and token in its environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")} | cluster.client_env
    return subprocess.run(["fedray", *args], env=env, capture_output=True, text=True, timeout=300)


def submit(cluster: LocalCluster, work_dir, *args: str) -> subprocess.CompletedProcess:
    return fedray(cluster, "submit", "--address", cluster.dashboard_url, "--working-dir", str(work_dir), *args)


def job_id(result: subprocess.CompletedProcess) -> str:
    match = re.search(r"submitted job (\S+):", result.stdout)
    assert match, result.stdout + result.stderr
    return match.group(1)


@pytest.fixture(scope="module")
def fault_free_run(cluster, work_dir, tmp_path_factory):
    """A run submitted with --follow whose output.dir is a file:// URI; returns its synced run dir."""
    results, staging = tmp_path_factory.mktemp("results"), tmp_path_factory.mktemp("staging")
    result = submit(
        cluster[0], work_dir, "--follow", "--", "run", str(work_dir / "run.yaml"), "--quiet",
        "--set", f"output.dir=file://{results}", "--set", f"output.staging_dir={staging}",
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"job {job_id(result)}: SUCCEEDED" in result.stderr
    return results / "run"


def test_submitted_run_spreads_workers_over_both_nodes(cluster, fault_free_run):
    the_cluster, _, nodes = cluster
    assert json.loads((fault_free_run / "summary.json").read_text())["rounds"] == ROUNDS
    assert [r["round"] for r in read_metrics(fault_free_run)] == list(range(1, ROUNDS + 1))
    placement = json.loads((fault_free_run / WORKERS_FILE).read_text())
    assert placement["driver_node_id"] == nodes["head"]
    assert sorted(placement["placements"][0]["worker_node_ids"]) == sorted(nodes.values())
    servers = the_cluster.state("actors", class_name="Server")
    assert servers and {server["node_id"] for server in servers} == {nodes["head"]}


def test_submitted_sweep_runs_fedray_tune_on_the_cluster(cluster, work_dir, tmp_path):
    sweep = work_dir / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({
        "name": "cluster-sweep",
        "base": "run.yaml",  # relative to the sweep file: uploaded with the working directory
        "overrides": ["train.rounds=2", "resources.num_workers=1", "resources.placement_strategy=PACK"],
        "space": {"data.alpha": {"grid": [0.5]}},
        "output": {"dir": str(tmp_path / "sweeps")},
    }))
    result = submit(cluster[0], work_dir, "--follow", "--", "tune", str(sweep))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    [sweep_dir] = (tmp_path / "sweeps").iterdir()
    [trial] = pq.read_table(sweep_dir / "trials.parquet").to_pylist()
    assert (trial["status"], trial["round"]) == ("TERMINATED", 2)


def test_run_survives_losing_the_second_node(cluster, work_dir, fault_free_run, tmp_path):
    the_cluster, second, nodes = cluster
    result = submit(the_cluster, work_dir, "--", "run", str(work_dir / "run.yaml"), "--quiet", "--set", f"output.dir={tmp_path}")
    assert result.returncode == 0, result.stdout + result.stderr
    job = job_id(result)
    run_dir = tmp_path / "run"

    deadline = time.monotonic() + 240
    while not read_metrics(run_dir):  # round 1 is done: both nodes have workers at work
        assert time.monotonic() < deadline, fedray(the_cluster, "jobs", "logs", job).stdout[-3000:]
        time.sleep(0.2)
    second.kill()

    followed = fedray(the_cluster, "jobs", "logs", job, "--follow", "--address", the_cluster.dashboard_url)
    assert followed.returncode == 0, followed.stdout[-3000:] + followed.stderr[-3000:]
    assert [node["node_id"] for node in the_cluster.alive_nodes()] == [nodes["head"]]
    assert load_checkpoint(list_checkpoints(run_dir)[-1][1])["worker_restarts"] >= 1  # a worker really died
    placements = json.loads((run_dir / WORKERS_FILE).read_text())["placements"]
    assert nodes["second"] in placements[0]["worker_node_ids"]
    assert placements[-1]["worker_node_ids"] == [nodes["head"], nodes["head"]]  # recovered on the head
    assert torch.equal(final_weights(run_dir), final_weights(fault_free_run))
    assert comparable_rows(read_metrics(run_dir)) == comparable_rows(read_metrics(fault_free_run))
