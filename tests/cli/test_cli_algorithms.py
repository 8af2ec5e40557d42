"""``fedray algorithms`` and ``fedray run --print-config``, through the real console entry point in a
subprocess (neither starts Ray nor writes a run directory)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from fedray.algorithms import ALGORITHMS


def fedray(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path.cwd()), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "fedray.cli.main", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_algorithms_lists_every_algorithm_with_its_keys_and_defaults(tmp_path):
    result = fedray("algorithms", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    headings = {line.split()[0] for line in result.stdout.splitlines() if line and not line.startswith(" ")}
    assert headings == set(ALGORITHMS)
    lines = result.stdout.splitlines()
    fedproto = lines.index(next(line for line in lines if line.startswith("fedproto ")))
    section = lines[fedproto : lines.index("", fedproto)]
    assert any(line.split()[:2] == ["algorithm.mu", "1.0"] for line in section)  # FedProto's λ, default 1
    assert any(line.split()[:2] == ["algorithm.inference", "classifier"] and "nearest_prototype" in line for line in section)
    assert "Tan et al., AAAI 2022" in section[1]
    assert "(no algorithm.* keys)" in result.stdout  # fedbn and local have none
    assert not (tmp_path / "runs").exists()


def test_algorithms_yaml_is_a_config_section_per_algorithm(tmp_path):
    result = fedray("algorithms", "fedprox", "moon", "--format", "yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    documents = list(yaml.safe_load_all(result.stdout))
    assert [document["algorithm"]["name"] for document in documents] == ["fedprox", "moon"]
    assert documents[0]["algorithm"]["mu"] == 0.01
    assert documents[0]["algorithm"]["server_optimizer"] == "none"


def test_algorithms_rejects_an_unknown_name(tmp_path):
    result = fedray("algorithms", "no_such_algorithm", cwd=tmp_path)
    assert result.returncode == 2
    assert "unknown algorithm 'no_such_algorithm'" in result.stderr


def test_print_config_prints_the_resolved_config_and_runs_nothing(tmp_path):
    result = fedray(
        "run",
        "--print-config",
        "--set",
        "algorithm.name=fedprox",
        "--set",
        "algorithm.mu=0.25",
        "--set",
        "data.alpha=0.1",
        "--set",
        "output.dir=out",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    config = yaml.safe_load(result.stdout)
    assert config["data"]["alpha"] == 0.1 and config["algorithm"]["mu"] == 0.25  # the --set overrides
    assert config["algorithm"]["server_optimizer"] == "none"  # the algorithm's defaults are filled in
    assert config["train"]["rounds"] == 30
    assert list(tmp_path.iterdir()) == []  # no run directory (neither out/ nor runs/)
    assert "Ray" not in result.stderr


def test_print_config_reports_an_invalid_override(tmp_path):
    result = fedray("run", "--print-config", "--set", "algorithm.name=fedprox", "--set", "algorithm.mu=-1", cwd=tmp_path)
    assert result.returncode == 2
    assert "algorithm.mu" in result.stderr
