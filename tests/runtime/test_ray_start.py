"""The local Ray of a run (fedray.runtime.ray_start): the shutdown stops every process of the
instance. Each case runs in a fresh interpreter: a process holds one Ray, and the test session's is
already up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fedray.runtime.ray_start import ACTOR_MODULE
from fedray.runtime.server import Server

REPO = Path(__file__).resolve().parents[2]

# Prints (to stdout, as JSON) the pids of every process of the instance once it is up: Ray's daemons
# and one worker process.
INSTANCE_PIDS = textwrap.dedent(
    """
    import json, os, ray

    def instance_pids():
        @ray.remote(num_cpus=0)
        def pid():
            return os.getpid()

        node = ray._private.worker._global_node
        daemons = {kind: [info.process.pid for info in infos] for kind, infos in node.all_processes.items()}
        return {"daemons": daemons, "worker": ray.get(pid.remote())}
    """
)

WAIT_UNTIL_GONE = textwrap.dedent(
    """
    import time

    def still_running(pids, within=15.0):
        deadline = time.monotonic() + within
        while True:
            alive = []
            for pid in pids:
                try:
                    state = open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()[0]
                except OSError:
                    continue
                if state != "Z":  # a zombie has exited; its parent has not reaped it yet
                    alive.append(pid)
            if not alive or time.monotonic() > deadline:
                return alive
            time.sleep(0.1)
    """
)


def run_script(body: str) -> subprocess.CompletedProcess:
    script = INSTANCE_PIDS + WAIT_UNTIL_GONE + textwrap.dedent(body)
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_ADDRESS": ""}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_the_preloaded_module_is_the_actors_module():
    assert ACTOR_MODULE == Server.__module__


@pytest.mark.slow
def test_the_shutdown_of_a_local_start_stops_every_process():
    result = run_script(
        """
        from fedray.config import load_config_sections
        from fedray.runtime import ray_start

        config = load_config_sections(None, ["resources.backend=ray", "resources.num_workers=1"])
        seconds = ray_start.ensure_ray(None, config)
        pids = instance_pids()
        ray_start.shutdown_ray()
        everything = [pid for group in pids["daemons"].values() for pid in group] + [pids["worker"]]
        print(json.dumps({"seconds": seconds, "pids": pids, "alive": still_running(everything),
                          "initialized": ray.is_initialized(), "starts_again": ray_start.starts_local_ray(None)}))
        """
    )
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["seconds"] > 0
    assert "monitor" in report["pids"]["daemons"]  # the process shutdown_ray kills first
    assert report["alive"] == []
    assert report["initialized"] is False and report["starts_again"] is True
    assert "The autoscaler failed" not in result.stderr  # the monitor is killed, not asked to report its end
