"""``fedray tune`` when a trial is killed (the OOM killer, ``kill -9``): a real sweep in a separate
``fedray tune`` process whose only trial loses its worker process, killed by SIGKILL in its first
client update, past ``resources.max_worker_restarts``.

- the terminal gets no Ray traceback (Tune's ``Trial task failed`` with the 20 lines of
  ``ActorDiedError``), as for a diverged trial: the trial's one-line error in the table and in
  ``trials.parquet``, its whole trace in Tune's ``error.txt``;
- with no trial that succeeded, the top-trials table is one line saying so, not pandas' dump of an
  empty frame.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

pytestmark = [pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
MODULE = "killedlab"
USER_CODE = textwrap.dedent("""
    import os
    import signal

    from fedray.algorithms.fedavg import FedAvg


    class KilledInClientUpdate(FedAvg):
        name = "killed_in_client_update"

        def client_update(self, ctx, broadcast):
            os.kill(os.getpid(), signal.SIGKILL)  # the worker's process, each time it is restarted
""")


@pytest.fixture(scope="module")
def killed_sweep(tmp_path_factory):
    directory = tmp_path_factory.mktemp("killed")
    (directory / f"{MODULE}.py").write_text(USER_CODE)
    sweep = {
        "name": "killed",
        "base": {
            "algorithm": {"name": f"{MODULE}:KilledInClientUpdate"},
            "data": {"num_clients": 4, "alpha": 1.0},
            "train": {"rounds": 2, "clients_per_round": 2, "local_epochs": 1},
            "resources": {"num_workers": 1, "cpus_per_worker": 1},
            "output": {"tensorboard": False, "plots": False},
        },
        "max_failures": 0,
        "space": {"train.lr": {"grid": [0.1]}},
        "output": {"dir": str(directory / "sweeps")},
    }
    (directory / "sweep.yaml").write_text(yaml.safe_dump(sweep))
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_ADDRESS": "", "FEDRAY_SERVICE_DIR": str(directory / "no-service")}
    result = subprocess.run(
        [sys.executable, "-m", "fedray.cli.main", "tune", "sweep.yaml"], cwd=directory, env=env, capture_output=True, text=True, timeout=500
    )
    [sweep_dir] = list((directory / "sweeps").iterdir())
    return result, sweep_dir


def test_a_killed_trial_prints_no_ray_traceback(killed_sweep):
    result, sweep_dir = killed_sweep
    assert result.returncode == 1, (result.stdout[-2000:], result.stderr[-3000:])
    assert "Traceback" not in result.stderr and "Trial task failed" not in result.stderr, result.stderr[-3000:]
    assert "ActorDiedError" not in result.stderr
    assert f"fedray: 1 trial(s) errored: see the table above and the error column of {sweep_dir / 'trials.parquet'}" in result.stderr
    [row] = pq.read_table(sweep_dir / "trials.parquet").to_pylist()
    assert row["status"] == "ERROR"  # with its one-line error: the worker's death, not a pointer to error.txt
    assert row["error"].startswith("fedray.runtime.errors.RunError: worker 0 died"), row["error"]
    assert "errored trials" in result.stdout and row["trial_id"] in result.stdout.split("errored trials", 1)[1]


def test_no_trial_succeeded_is_one_line_not_a_pandas_dump(killed_sweep):
    result, _ = killed_sweep
    assert "Empty DataFrame" not in result.stdout and "Columns: [" not in result.stdout, result.stdout
    assert "no trial reported a result" in result.stdout
    assert "no trial finished with a value of test_accuracy (1 of 1 errored: see below)" in result.stdout
