"""Safe defaults: configs and checkpoints never execute code, a local Ray exposes no dashboard."""

from __future__ import annotations

import pytest
import torch

from fedray.config import ConfigError
from fedray import load_config
from fedray.runtime import CheckpointError, load_checkpoint
from fedray.runtime import ray_start
from fedray.runtime.checkpoint import save_checkpoint
from fedray.runtime.state_store import ClientStateError, ClientStateStore, encode_state


class TouchOnUnpickle:
    """Unpickling this object creates ``marker``: proof that a loader executed code."""

    def __init__(self, marker) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_yaml_python_tags_are_rejected_without_running_them(tmp_path):
    marker = tmp_path / "executed"
    config = tmp_path / "evil.yaml"
    config.write_text(f"seed: !!python/object/apply:os.system ['touch {marker}']\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(config)
    assert not marker.exists()


def test_yaml_python_object_tag_is_rejected(tmp_path):
    config = tmp_path / "object.yaml"
    config.write_text("!!python/object:fedray.config.schema.RunConfig {seed: 1}\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(config)


def test_checkpoint_with_a_pickled_object_is_refused_as_corrupt(tmp_path):
    marker = tmp_path / "executed"
    save_checkpoint(tmp_path, 1, {"server_state": {"w": torch.zeros(2)}, "state_versions": torch.zeros(3)}, keep=5)
    good = load_checkpoint(tmp_path / "checkpoints" / "round_000001.pt")  # the same layout loads fine
    assert torch.equal(good["server_state"]["w"], torch.zeros(2))
    save_checkpoint(
        tmp_path,
        2,
        {"server_state": {"w": torch.zeros(2)}, "state_versions": torch.zeros(3), "extra": TouchOnUnpickle(marker)},
        keep=5,
    )
    with pytest.raises(CheckpointError, match="round_000002.pt is corrupt"):
        load_checkpoint(tmp_path / "checkpoints" / "round_000002.pt")
    assert not marker.exists()


def test_client_state_with_a_pickled_object_is_not_executed(tmp_path):
    marker = tmp_path / "executed"
    store = ClientStateStore(tmp_path / "client_state")
    path = tmp_path / "client_state" / "0000003" / "r000001.pt"
    path.parent.mkdir(parents=True)
    path.write_bytes(encode_state({"w": torch.ones(1), "extra": TouchOnUnpickle(marker)}))  # a valid checksum
    with pytest.raises(ClientStateError, match="Weights only load failed"):
        store.load(3, 1, torch.device("cpu"))
    assert not marker.exists()


@pytest.fixture
def captured_ray_init(monkeypatch):
    calls = []
    monkeypatch.setattr(ray_start.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray_start.ray, "init", lambda **kwargs: calls.append(kwargs))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return calls


def test_local_ray_is_a_new_instance_without_a_dashboard(captured_ray_init):
    ray_start.ensure_ray(None, load_config())
    [kwargs] = captured_ray_init
    assert kwargs["address"] == "local"  # never another Ray of the machine, found in /tmp/ray
    assert kwargs["include_dashboard"] is False
    assert kwargs["dashboard_host"] == "127.0.0.1"
    # One process per worker and one for the server boot with Ray (importing torch), none after it.
    workers = load_config().resources.num_workers
    assert kwargs["num_cpus"] >= workers + 1
    assert kwargs["_system_config"]["worker_maximum_startup_concurrency"] == workers + 1


def test_inside_a_ray_job_the_run_joins_the_cluster(captured_ray_init, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")  # what Ray sets for a job's entrypoint
    ray_start.ensure_ray(None, load_config())
    [kwargs] = captured_ray_init
    assert kwargs["address"] == "10.0.0.1:6379"
    assert "num_cpus" not in kwargs  # Ray refuses resource arguments when joining a cluster
