"""The local Ray of a run started in the background (fedray.runtime.ray_start): it overlaps the
driver's imports without printing out of turn, an abandoned start leaves nothing behind, and the
shutdown stops every process of the instance. Each case runs in a fresh interpreter: a process holds
one Ray, and the test session's is already up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from fedray.runtime.ray_start import ACTOR_MODULE
from fedray.runtime.server import Server

REPO = Path(__file__).resolve().parents[1]

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


def test_a_background_start_prints_ray_s_lines_when_joined_and_its_shutdown_stops_every_process():
    result = run_script(
        """
        import sys
        from fedray.config import load_config_sections
        from fedray.runtime import ray_start

        config = load_config_sections(None, ["resources.backend=ray", "resources.num_workers=1"])
        ray_start.start_local_ray_in_background(config, None)
        torch_imported_by_the_start = "torch" in sys.modules
        import torch  # the driver's own work meanwhile

        ray_start._background._started.wait()  # Ray is up and has logged its start, in the other thread
        print("MARK started", file=sys.stderr, flush=True)
        seconds = ray_start.ensure_ray(None, config)
        print("MARK joined", file=sys.stderr, flush=True)
        pids = instance_pids()
        ray_start.shutdown_ray()
        everything = [pid for group in pids["daemons"].values() for pid in group] + [pids["worker"]]
        print(json.dumps({"torch": torch_imported_by_the_start, "seconds": seconds, "pids": pids,
                          "alive": still_running(everything), "initialized": ray.is_initialized()}))
        """
    )
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["torch"] is False  # the start overlaps torch's import instead of waiting for it
    assert report["seconds"] > 0
    stderr = result.stderr
    started_line = stderr.find("Started a local Ray instance")
    # Held back while the driver worked, printed when it joined the start (where a start in the
    # main thread would have printed it), and Ray's warning about the thread is dropped.
    assert stderr.find("MARK started") < started_line < stderr.find("MARK joined"), stderr
    assert "SIGTERM handler is not set" not in stderr
    assert "monitor" in report["pids"]["daemons"]  # the process shutdown_ray kills first
    assert report["alive"] == []
    assert report["initialized"] is False
    assert "The autoscaler failed" not in stderr  # the monitor is killed, not asked to report its end


def test_an_abandoned_start_prints_nothing_and_leaves_no_process():
    """What the CLI does when the data or the algorithm's keys turn out invalid during the start."""
    result = run_script(
        """
        import sys
        from fedray.config import load_config_sections
        from fedray.runtime import ray_start

        config = load_config_sections(None, ["resources.backend=ray", "resources.num_workers=1"])
        ray_start.start_local_ray_in_background(config, None)
        ray_start._background._started.wait()
        pids = instance_pids()
        ray_start.abandon_background_start()
        everything = [pid for group in pids["daemons"].values() for pid in group] + [pids["worker"]]
        print(json.dumps({"alive": still_running(everything), "initialized": ray.is_initialized(),
                          "starts_again": ray_start.starts_local_ray(None)}))
        """
    )
    report = json.loads(result.stdout.splitlines()[-1])
    assert report == {"alive": [], "initialized": False, "starts_again": True}
    assert result.stderr.strip() == "", result.stderr  # not even Ray's start-up lines
