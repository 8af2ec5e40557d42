"""Start-up: the driver starts the workers so that they boot while the server actor does, kills them
at the end, and reports the time to the first round (summary.json and the CLI)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import ray
from ray.exceptions import RayActorError

from fedray.cli.run import print_summary, seconds_since_process_start
from fedray.config import save_config
from fedray.plugins import load_config
from fedray.runtime import RunSummary, run_experiment
from fedray.tracking import Callback

MODULE_IMPORTED = time.monotonic()
REPO = Path(__file__).resolve().parents[2]

# An algorithm whose server refuses to finish preparing (init_server_state) until every worker has
# built its own copy of the algorithm: it can only succeed if the workers start alongside the server.
WAIT_FOR_WORKERS = textwrap.dedent(
    """
    import os
    import time
    from pathlib import Path

    from fedray import AlgorithmParams
    from fedray.algorithms.fedavg import FedAvg


    class Params(AlgorithmParams):
        record: str
        driver_pid: int
        workers: int


    class WaitForWorkers(FedAvg):
        name = "wait_for_workers"
        Params = Params

        def __init__(self, config, info):
            super().__init__(config, info)
            with open(self.params.record, "a") as record:
                record.write(f"{os.getpid()}\\n")

        def init_server_state(self, model):
            others = set()
            deadline = time.monotonic() + 120
            while len(others) < self.params.workers and time.monotonic() < deadline:
                others = set(Path(self.params.record).read_text().split()) - {str(os.getpid()), str(self.params.driver_pid)}
                time.sleep(0.05)
            if len(others) < self.params.workers:
                raise RuntimeError(f"the server prepared alone: {len(others)} worker(s) had started")
            return super().init_server_state(model)
    """
)


class WorkerHandles(Callback):
    def on_run_start(self, run) -> None:
        self.workers = run.server.worker_handles()
        self.pids = ray.get([worker.pid.remote() for worker in self.workers])


@pytest.fixture
def wait_for_workers_module(tmp_path, monkeypatch):
    project = tmp_path / "project"
    project.mkdir()
    (project / "startprobe.py").write_text(WAIT_FOR_WORKERS)
    monkeypatch.chdir(project)
    monkeypatch.setattr(sys, "path", [str(project), *sys.path])
    yield project
    sys.modules.pop("startprobe", None)


@pytest.mark.slow
def test_workers_boot_with_the_server_and_are_killed_at_the_end(ray_session, wait_for_workers_module, tiny_overrides, tmp_path):
    config = load_config(
        None,
        [
            *tiny_overrides,
            "train.rounds=2",
            "resources.num_workers=2",
            "algorithm.name=startprobe:WaitForWorkers",
            f"algorithm.record={tmp_path / 'constructed.txt'}",
            f"algorithm.driver_pid={os.getpid()}",
            "algorithm.workers=2",
        ],
    )
    handles = WorkerHandles()
    summary = run_experiment(config, progress=False, extra_callbacks=[handles])

    assert summary.rounds == 2
    assert len(set(handles.pids)) == 2 and os.getpid() not in handles.pids
    for worker in handles.workers:  # the driver started them, so the driver kills them
        with pytest.raises(RayActorError):
            ray.get(worker.pid.remote(), timeout=60)

    # the time to the first round: after the start of the call, within the run
    assert 0 < summary.first_round_seconds <= summary.seconds
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert saved["first_round_seconds"] == summary.first_round_seconds


RESUME_PROBE = textwrap.dedent(
    """
    import json, sys
    import ray
    from fedray.cli.main import main

    code = main(["run", "--resume", sys.argv[1], "--quiet"])
    print(json.dumps({"code": code, "torch": "torch" in sys.modules, "ray": ray.is_initialized()}))
    """
)
WALL_TIME_LINE = re.compile(r"^wall time +([0-9.]+) s from the command's start \(the run ([0-9.]+) s, ", re.MULTILINE)


@pytest.mark.slow
def test_a_finished_run_s_resume_is_refused_before_torch_and_ray(tmp_path, tiny_overrides):
    """`fedray run --resume` of a run that finished all its rounds is refused from its saved config's
    schema and summary, before torch is imported and Ray started; the error is the only line. The
    resume that finished it reports the command's wall time, its imports included."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    save_config(load_config(None, [*tiny_overrides, "train.rounds=2", "resources.num_workers=1"]), run_dir / "config.yaml")
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_ADDRESS": ""}

    def resume() -> tuple[dict, subprocess.CompletedProcess, float]:
        began = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-c", RESUME_PROBE, str(run_dir)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        assert result.stdout.strip(), result.stderr[-3000:]
        return json.loads(result.stdout.splitlines()[-1]), result, time.monotonic() - began

    report, result, elapsed = resume()  # no checkpoint yet: it runs from round 1
    assert report["code"] == 0, result.stderr[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["rounds"] == 2
    command_seconds, run_seconds = map(float, WALL_TIME_LINE.search(result.stdout).groups())
    assert run_seconds < command_seconds <= elapsed + 0.1  # the interpreter's start and the imports count

    report, result, _ = resume()
    assert report == {"code": 2, "torch": False, "ray": False}
    assert [line for line in result.stderr.splitlines() if line.strip()] == [f"fedray: {run_dir} already finished all 2 rounds"]


def test_the_cli_prints_the_command_s_wall_time_and_the_first_round_from_the_process_start(capsys):
    summary = RunSummary(
        run_dir="runs/x",
        rounds=3,
        final_test_accuracy=0.5,
        best_test_accuracy=0.6,
        best_round=2,
        seconds=9.0,
        ray_startup_seconds=3.0,
        first_round_seconds=5.25,
        final_metrics={},
    )
    print_summary(summary, before_run=2.5, command_seconds=12.3)
    out = capsys.readouterr().out
    assert "wall time          12.3 s from the command's start (the run 9.0 s, Ray start-up 3.0 s)" in out
    assert "first round after  7.8 s (from the command's start)" in out

    print_summary(RunSummary(**{**summary.__dict__, "first_round_seconds": None}), before_run=2.5, command_seconds=12.3)
    assert "first round" not in capsys.readouterr().out  # no round ran


def test_the_process_age_counts_from_the_process_start():
    first = seconds_since_process_start()
    time.sleep(0.05)
    second = seconds_since_process_start()
    assert second - first >= 0.04
    # pytest started and collected tests well before it imported this module
    assert first > time.monotonic() - MODULE_IMPORTED + 0.1


def test_client_sgd_steps_exactly_like_torch_sgd():
    """Momentum, weight decay, a frozen parameter and a layer without a gradient for some steps."""
    import torch

    from fedray.algorithms.local import ClientSGD

    def train(make_optimizer) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3), torch.nn.Linear(3, 2))
        model[0].bias.requires_grad_(False)
        optimizer = make_optimizer(model.parameters())
        for step in range(12):
            head = model[3] if step % 3 else torch.nn.Identity()  # the last layer gets no gradient in every third step
            loss = head(model[:3](torch.randn(4, 5))).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return [p.detach().clone() for p in model.parameters()]

    ours = train(lambda parameters: ClientSGD(parameters, lr=0.1, momentum=0.9, weight_decay=5e-4))
    theirs = train(lambda parameters: torch.optim.SGD(parameters, lr=0.1, momentum=0.9, weight_decay=5e-4))
    assert all(torch.isfinite(a).all() and torch.equal(a, b) for a, b in zip(ours, theirs))
    assert not torch.equal(ours[0], train(lambda parameters: ClientSGD(parameters, lr=0.1, momentum=0.0, weight_decay=0.0))[0])


@pytest.mark.slow
def test_a_client_update_does_not_import_torch_dynamo(tmp_path):
    """torch.optim optimisers import torch._dynamo (~1.5 CPU-s per worker process); SGD clients do not."""

    probe = textwrap.dedent(
        """
        import sys
        from fedray.testing import Federation
        Federation(sys.argv[1], ["train.optimizer=sgd", "train.momentum=0.9"]).run_round(1)
        print("torch._dynamo" in sys.modules)
        """
    )
    repository = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    result = subprocess.run([sys.executable, "-c", probe, str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=repository)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split()[-1] == "False"
