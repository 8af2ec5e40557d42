"""The files in cluster/ (cluster-launcher config, Dockerfile, KubeRay manifests, README) are parsed
and checked: one Ray version everywhere, a CPU head and GPU workers, token authentication, the
dashboard never exposed, fedray installed, a sweep entrypoint that exists. Also the cluster-related
config keys."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

import fedray
from fedray.config import ConfigError
from fedray import load_config

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "cluster"
IMAGE_DIR = "/home/ray/fedray"  # where cluster/Dockerfile puts the repository's files
RAY_IMAGE = re.compile(r"^rayproject/ray:(?P<version>\d+\.\d+\.\d+)-(?P<python>py\d+)(?P<gpu>-gpu)?$")
GPU_INSTANCE = re.compile(r"^(g\d|p\d)")  # AWS GPU instance families


@pytest.fixture(scope="module")
def aws() -> dict:
    return yaml.safe_load((CLUSTER / "aws-gpu.yaml").read_text())


@pytest.fixture(scope="module")
def kuberay() -> dict[str, dict]:
    """Every KubeRay document by kind."""
    documents = [
        document
        for name in ("raycluster.yaml", "rayjob-sweep.yaml")
        for document in yaml.safe_load_all((CLUSTER / "kuberay" / name).read_text())
    ]
    return {document["kind"]: document for document in documents}


@pytest.fixture(scope="module")
def dockerfile() -> list[str]:
    return [line.strip() for line in (CLUSTER / "Dockerfile").read_text().splitlines() if line.strip() and not line.startswith("#")]


def ray_image(image: str) -> re.Match:
    match = RAY_IMAGE.match(image)
    assert match, f"{image} is not a pinned rayproject/ray image"
    return match


def containers(pod_template: dict) -> list[dict]:
    return pod_template["spec"]["containers"]


def test_one_ray_version_everywhere_with_token_authentication(aws, kuberay, dockerfile):
    head, worker = ray_image(aws["docker"]["head_image"]), ray_image(aws["docker"]["worker_image"])
    [base] = [line.split()[1] for line in dockerfile if line.startswith("FROM")]
    versions = {head["version"], worker["version"], ray_image(base)["version"], kuberay["RayCluster"]["spec"]["rayVersion"]}
    assert len(versions) == 1, versions
    [version] = versions
    assert tuple(map(int, version.split("."))) >= (2, 52), "token authentication needs Ray >= 2.52"
    assert {head["python"], worker["python"], ray_image(base)["python"]} == {"py311"}


def test_aws_config_has_a_cpu_head_and_gpu_workers(aws):
    assert aws["provider"]["type"] == "aws"
    node_types = aws["available_node_types"]
    head = node_types[aws["head_node_type"]]
    assert not GPU_INSTANCE.match(head["node_config"]["InstanceType"])
    assert not ray_image(aws["docker"]["head_image"])["gpu"] and ray_image(aws["docker"]["worker_image"])["gpu"]
    workers = [t for name, t in node_types.items() if name != aws["head_node_type"]]
    assert workers and all(GPU_INSTANCE.match(t["node_config"]["InstanceType"]) for t in workers)
    assert all(t["max_workers"] >= t["min_workers"] >= 0 for t in workers)
    assert aws["max_workers"] >= max(t["max_workers"] for t in workers)


def test_aws_nodes_install_fedray_from_the_mounted_repository(aws):
    mounts = aws["file_mounts"]
    assert mounts[IMAGE_DIR] == "."
    assert any(cmd.split()[:2] == ["pip", "install"] and IMAGE_DIR in cmd for cmd in aws["setup_commands"])
    assert mounts["/home/ray/.ray/auth_token"] == "~/.ray/auth_token"
    assert {"runs", "data", ".git"} <= set(aws["rsync_exclude"])


def test_aws_nodes_require_the_token_and_keep_the_dashboard_on_loopback(aws):
    head_start = " ".join(aws["head_start_ray_commands"])
    assert "RAY_AUTH_MODE=token ray start --head" in head_start
    assert "--dashboard-host=127.0.0.1" in head_start
    assert all("RAY_AUTH_MODE=token ray start" in cmd for cmd in aws["worker_start_ray_commands"] if "ray start" in cmd)


def test_dockerfile_installs_fedray_with_its_configs(dockerfile):
    copied = set()
    for line in dockerfile:
        if line.startswith("COPY"):
            *sources, target = [part for part in line.split()[1:] if not part.startswith("--")]
            assert target.startswith(IMAGE_DIR)
            copied.update(sources)
    assert {"fedray", "examples", "tune_configs", "pyproject.toml"} <= copied
    assert all((ROOT / name).exists() for name in copied)
    assert f'RUN pip install --no-cache-dir "{IMAGE_DIR}[cluster]"' in dockerfile  # ray[default]: the head's job server


def test_raycluster_has_a_cpu_head_and_a_gpu_worker_group(kuberay):
    cluster = kuberay["RayCluster"]
    assert cluster["apiVersion"] == "ray.io/v1"
    head = cluster["spec"]["headGroupSpec"]
    [head_container] = containers(head["template"])
    assert "nvidia.com/gpu" not in head_container["resources"]["limits"]
    assert head["rayStartParams"]["num-gpus"] == "0"
    [group] = cluster["spec"]["workerGroupSpecs"]
    [worker_container] = containers(group["template"])
    assert int(worker_container["resources"]["limits"]["nvidia.com/gpu"]) >= 1
    assert group["maxReplicas"] >= group["replicas"] >= group["minReplicas"] >= 0


def test_raycluster_runs_the_fedray_image_with_token_auth_and_no_public_service(kuberay):
    cluster = kuberay["RayCluster"]
    spec = cluster["spec"]
    assert spec["authOptions"]["mode"] == "token"
    assert spec["headGroupSpec"]["serviceType"] == "ClusterIP"
    templates = [spec["headGroupSpec"]["template"]] + [group["template"] for group in spec["workerGroupSpecs"]]
    images = {container["image"] for template in templates for container in containers(template)}
    [image] = images
    assert image.endswith(f"/fedray:{fedray.__version__}")


def test_every_pod_mounts_the_shared_volume(kuberay):
    claim = kuberay["PersistentVolumeClaim"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    spec = kuberay["RayCluster"]["spec"]
    templates = [spec["headGroupSpec"]["template"]] + [group["template"] for group in spec["workerGroupSpecs"]]
    mount_paths = set()
    for template in templates:
        volumes = {v["name"]: v for v in template["spec"]["volumes"]}
        for mount in containers(template)[0]["volumeMounts"]:
            assert volumes[mount["name"]]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
            mount_paths.add(mount["mountPath"])
    assert mount_paths == {"/mnt/fedray"}


def test_rayjob_runs_a_valid_sweep_on_the_raycluster_writing_to_the_shared_volume(kuberay):
    job = kuberay["RayJob"]
    assert job["spec"]["clusterSelector"] == {"ray.io/cluster": kuberay["RayCluster"]["metadata"]["name"]}
    match = re.fullmatch(r"cd (\S+) && fedray tune (\S+)", job["spec"]["entrypoint"])
    assert match, job["spec"]["entrypoint"]
    workdir, sweep = match.groups()
    assert workdir == "/mnt/fedray"
    assert sweep.startswith(f"{IMAGE_DIR}/tune_configs/")
    local_sweep = ROOT / sweep.removeprefix(f"{IMAGE_DIR}/")
    assert local_sweep.is_file()
    load_sweep = pytest.importorskip("fedray.tune").load_sweep
    load_sweep(local_sweep)  # the sweep the image ships validates


def test_readme_covers_every_file_and_safe_access():
    readme = (CLUSTER / "README.md").read_text()
    for name in ("aws-gpu.yaml", "Dockerfile", "kuberay/raycluster.yaml", "kuberay/rayjob-sweep.yaml"):
        assert name in readme, name
    for topic in ("fedray submit", "kubectl port-forward", "ray dashboard", "RAY_AUTH_MODE", "s3://", "output.staging_dir"):
        assert topic in readme, topic


def test_cluster_config_keys_are_validated():
    assert load_config().resources.placement_strategy == "PACK"
    assert load_config(None, ["resources.placement_strategy=SPREAD"]).resources.placement_strategy == "SPREAD"
    with pytest.raises(ConfigError, match="resources.placement_strategy"):
        load_config(None, ["resources.placement_strategy=STRICT_SPREAD"])
    assert load_config(None, ["output.staging_dir=/mnt/shared/staging"]).output.staging_dir == "/mnt/shared/staging"


def test_both_client_state_options_reach_every_pod_and_the_readme_names_the_stateful_algorithms(kuberay, aws):
    from fedray.algorithms import ALGORITHMS, get_algorithm_class

    spec = kuberay["RayCluster"]["spec"]
    pods = [spec["headGroupSpec"]["template"]] + [group["template"] for group in spec["workerGroupSpecs"]]
    claim = kuberay["PersistentVolumeClaim"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    secret = kuberay["Secret"]["metadata"]["name"]
    for pod in pods:
        volumes = {v["name"]: v.get("persistentVolumeClaim", {}).get("claimName") for v in pod["spec"]["volumes"]}
        for container in containers(pod):
            mounted = {m["name"] for m in container["volumeMounts"]}
            assert any(volumes.get(name) == claim["metadata"]["name"] for name in mounted)  # option 1
            assert {"secretRef": {"name": secret, "optional": True}} in container["envFrom"]  # option 2
    readme = (CLUSTER / "README.md").read_text()
    stateful = [name for name in ALGORITHMS if get_algorithm_class(name).keeps_client_state]
    assert {"fedcosr", "fedper", "hetero_ssfl", "local", "moon"} <= set(stateful)
    assert "fedavg" not in stateful
    for name in stateful:  # every algorithm that needs shared state storage is named
        assert f"`{name}`" in readme, name
    for topic in ("output.client_state_dir", "ReadWriteMany", "ray start --head", "ray stop"):
        assert topic in readme, topic
    assert load_config(None, ["output.client_state_dir=s3://b/state"]).output.client_state_dir == "s3://b/state"
