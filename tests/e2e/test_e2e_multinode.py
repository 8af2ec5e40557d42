"""A real two-node Ray cluster on this machine (fedray.testing.cluster): a run submitted with
``fedray submit`` spreads its workers over both nodes, returns its results through a ``file://``
URI, and survives losing the second node mid-run with the same final model; a submitted sweep runs
``fedray tune`` on the cluster. A stateful algorithm
(FedCoSR's personal layers) keeps its client state on a real S3 endpoint (moto's server on loopback)
instead of a shared directory and survives the same loss; a run whose client state would be
node-local is refused before its first round. (The S3 state store itself, and SCAFFOLD's state in
it, are proven on the local backend: tests/runtime/test_state_store.py, tests/runtime/test_support_walk.py.)

The cluster is isolated from the session's ``ray_session`` and from any other Ray on the machine
(own ports, temp dir and token) and only its own processes are stopped.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

import pyarrow.fs
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from fedray import load_config
from fedray.testing.cluster import LocalCluster
from fedray.testing.s3 import LocalS3
from fedray.cluster.placement import WORKERS_FILE
from fedray.runtime import list_checkpoints, load_checkpoint, run_experiment
from fedray.runtime.state_store import open_location
from fedray.tracking import read_metrics

from e2e_helpers import final_weights, comparable_rows

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.xdist_group("clusters")]  # with pytest -n: on one worker

ROUNDS = 5
RUN_CONFIG = f"""\
algorithm: {{name: fedprox, mu: 0.1}}
data: {{num_clients: 8}}
train: {{rounds: {ROUNDS}, clients_per_round: 4, local_epochs: 1}}
checkpoint: {{every: 1, keep: 1}}
resources: {{num_workers: 2, placement_strategy: SPREAD}}
output: {{name: run, tensorboard: false, plots: false}}
"""


def node_ids(cluster: LocalCluster) -> dict[str, str]:
    return {("head" if node["is_head_node"] else "second"): node["node_id"] for node in cluster.alive_nodes()}


@pytest.fixture(scope="module")
def cluster():
    """Head (2 CPUs) + second node (2 CPUs); yields the cluster, the second node and both node ids.
    Every node gets the local S3 endpoint's dummy credentials in its environment."""
    previous = LocalS3.export_credentials()
    # A short directory, not pytest's (longer under pytest -n): Ray's Unix socket paths under it must stay below 108 bytes.
    with tempfile.TemporaryDirectory(prefix="fedray-c", dir="/tmp") as short, LocalCluster(Path(short)) as cluster:
        cluster.start_head(num_cpus=2)
        second = cluster.add_node(num_cpus=2, resources={"second_node": 2})
        yield cluster, second, node_ids(cluster)
    LocalS3.restore(previous)


def second_node(cluster) -> tuple[LocalCluster, object, dict[str, str]]:
    """The cluster with a live second node (a new one if an earlier test killed it)."""
    the_cluster, second, nodes = cluster
    if len(the_cluster.alive_nodes()) < 2:
        second = the_cluster.add_node(num_cpus=2, resources={"second_node": 2})
    return the_cluster, second, node_ids(the_cluster)


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A real S3 API (moto's server) on a free loopback port, reachable from every node."""
    pytest.importorskip("moto.server", reason="needs moto[server] (pip install -e '.[test]')")
    with LocalS3(tmp_path_factory.mktemp("s3")) as server:
        yield server


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


def test_submitted_sweep_runs_fedray_tune_on_the_cluster(cluster, work_dir, tmp_path):
    sweep = work_dir / "sweep.yaml"
    sweep.write_text(
        yaml.safe_dump(
            {
                "name": "cluster-sweep",
                "base": "run.yaml",  # relative to the sweep file: uploaded with the working directory
                # DP-FedAvg with simulated devices and int8 uploads: privacy and systems work on a cluster
                "overrides": [
                    "train.rounds=2",
                    "resources.num_workers=1",
                    "resources.placement_strategy=PACK",
                    "privacy.mechanism=central",
                    "privacy.clip=0.5",
                    "privacy.noise_multiplier=1.0",
                    "privacy.delta=1e-3",
                    "systems.enabled=true",
                    "systems.compression.method=int8",
                ],
                "space": {"data.alpha": {"grid": [0.5]}},
                "output": {"dir": str(tmp_path / "sweeps")},
            }
        )
    )
    result = submit(cluster[0], work_dir, "--follow", "--", "tune", str(sweep))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"job {job_id(result)}: SUCCEEDED" in result.stderr
    [sweep_dir] = (tmp_path / "sweeps").iterdir()
    [trial] = pq.read_table(sweep_dir / "trials.parquet").to_pylist()
    assert (trial["status"], trial["round"]) == ("TERMINATED", 2)
    rounds = read_metrics(sweep_dir / trial["run_dir"], "round")
    assert all(r["dp_epsilon"] > 0 and r["dp_noise_multiplier"] == 1.0 for r in rounds)
    assert all(0 < r["bytes_up"] < r["bytes_down"] / 3 and r["sim_time"] > 0 for r in rounds)


# ------------------------------------------------------------------ stateful algorithms, state on S3

STATEFUL = {
    "moon": "algorithm: {name: moon}\nmodel: {projection_dim: 16}\n",
    "fedcosr": "algorithm: {name: fedcosr}\ndata: {num_clients: 8, client_test_fraction: 0.25}\neval: {personalized: true}\n",
}
STATEFUL_ROUNDS = 4


def stateful_config(work_dir, algorithm: str) -> str:
    base = yaml.safe_load(RUN_CONFIG)
    for key, value in yaml.safe_load(STATEFUL[algorithm]).items():
        base[key] = value if key == "algorithm" else {**base.get(key, {}), **value}
    base["train"]["rounds"] = STATEFUL_ROUNDS
    path = work_dir / f"{algorithm}.yaml"
    path.write_text(yaml.safe_dump(base))
    return str(path)


def state_objects(s3: LocalS3, prefix: str) -> list[str]:
    filesystem, root = open_location(s3.uri(prefix))
    selector = pyarrow.fs.FileSelector(root, recursive=True, allow_not_found=True)
    return sorted(info.path for info in filesystem.get_file_info(selector) if info.path.endswith(".pt"))


def start_run(cluster: LocalCluster, work_dir, log, *args: str) -> subprocess.Popen:
    """``fedray run ARGS`` submitted to the cluster as a job whose log ``fedray jobs logs --follow``
    follows to its end, its output going to the file ``log``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")} | cluster.client_env
    submitted = submit(cluster, work_dir, "--", "run", *args)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    command = ["fedray", "jobs", "logs", job_id(submitted), "--follow", "--address", cluster.dashboard_url]
    with open(log, "w") as output:
        process = subprocess.Popen(command, cwd=work_dir, env=env, stdout=output, stderr=subprocess.STDOUT)
    process.log = log
    return process


def finish(process: subprocess.Popen) -> None:
    process.wait(timeout=400)
    assert process.returncode == 0, process.log.read_text()[-4000:]


def test_stateful_run_with_state_on_s3_survives_losing_the_second_node(cluster, work_dir, s3, tmp_path):
    """A submitted run spreads its workers over both nodes, keeps its driver and server on the head
    and writes its run directory through a ``file://`` URI (synced from a staging directory after
    every checkpoint). No directory is shared for client state: it lives on the S3 endpoint. Clients
    of the second node's worker move to its replacement on the head, which reads their state from S3;
    the run ends with the weights and metrics of an uninterrupted run (the same config on the local
    backend in this process, bit-identical to an uninterrupted cluster run:
    tests/runtime/test_backends.py). The run is a submitted job that ``fedray jobs logs --follow``
    follows to its end."""
    algorithm = "fedcosr"
    the_cluster, second, nodes = second_node(cluster)
    config = stateful_config(work_dir, algorithm)
    results = tmp_path / "runs"
    state_dir = f"output.client_state_dir={s3.uri(f'state-{algorithm}')}"
    reference = load_config(config, [f"output.dir={results}", state_dir, "output.name=reference", "resources.backend=local"])
    run_experiment(reference, progress=False)

    settings = [f"output.dir=file://{results}", f"output.staging_dir={tmp_path / 'staging'}", state_dir, "output.name=faulted"]
    common = [config, "--quiet", *[word for setting in settings for word in ("--set", setting)]]
    faulted = start_run(the_cluster, work_dir, tmp_path / "faulted.log", *common)
    run_dir = results / "faulted"
    deadline = time.monotonic() + 300
    while not list_checkpoints(run_dir):  # round 1 is done and synced: both nodes have workers at work
        assert time.monotonic() < deadline and faulted.poll() is None, faulted.log.read_text()[-3000:]
        time.sleep(0.1)
    servers = the_cluster.state("actors", class_name="Server", state="ALIVE")
    assert [server["node_id"] for server in servers] == [nodes["head"]]  # this run's server (the sweep's has ended)
    second.kill()
    finish(faulted)

    reference_dir = results / "reference"
    assert json.loads((run_dir / "summary.json").read_text())["rounds"] == STATEFUL_ROUNDS  # the last file, synced
    workers = json.loads((run_dir / WORKERS_FILE).read_text())
    assert workers["driver_node_id"] == nodes["head"]
    assert sorted(workers["placements"][0]["worker_node_ids"]) == sorted(nodes.values())  # spread over both nodes
    assert workers["placements"][-1]["worker_node_ids"] == [nodes["head"], nodes["head"]]  # recovered on the head
    assert [node["node_id"] for node in the_cluster.alive_nodes()] == [nodes["head"]]
    assert load_checkpoint(list_checkpoints(run_dir)[-1][1])["worker_restarts"] >= 1  # a worker really died
    assert torch.equal(final_weights(run_dir), final_weights(reference_dir))
    assert comparable_rows(read_metrics(run_dir)) == comparable_rows(read_metrics(reference_dir))
    assert comparable_rows(read_metrics(run_dir, "client")) == comparable_rows(read_metrics(reference_dir, "client"))
    assert not any(results.rglob("client_state"))  # nothing on a local disk...
    assert state_objects(s3, f"state-{algorithm}/faulted")  # ...the state is on S3


def test_node_local_client_state_is_refused_before_the_first_round(cluster, work_dir, tmp_path):
    """A node whose view of the client-state directory is its own (a private tmpfs mounted over it,
    as on a machine that does not share the disk) makes a stateful run fail before round 1."""
    the_cluster = cluster[0]
    local_dir = tmp_path / "node-local"
    local_dir.mkdir()
    private_view = (
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--",
        "sh",
        "-c",
        'mount -t tmpfs node-local "$0" && exec "$@"',
        str(local_dir),
    )
    node = the_cluster.add_node(num_cpus=1, wrapper=private_view)
    try:
        config = stateful_config(work_dir, "moon")
        result = submit(
            the_cluster,
            work_dir,
            "--follow",
            "--",
            "run",
            config,
            "--quiet",
            "--set",
            f"output.dir={tmp_path}",
            "--set",
            f"output.client_state_dir={local_dir}",
            "--set",
            "output.name=refused",
        )
    finally:
        node.kill()
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert "output.client_state_dir: moon keeps per-client state in" in output and "which is node-local" in output
    assert not (tmp_path / "refused").exists()  # not a single round ran: nothing was kept
