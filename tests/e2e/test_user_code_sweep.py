"""User code under ``fedray tune`` on a real local Ray (issue 40: "a user module with its own model and
dataset under fedray run and fedray tune"): one sweep whose trials use a researcher's out-of-tree
algorithm (``mylab.fedavgm:FedAvgM``, a copy of ``examples/plugins/mylab``) and run callback
(``mylab.loggers:JsonLinesLogger``), and their own model and dataset from one module of theirs
(``lab:WineNet`` on ``lab:vineyards``). The sweep varies a key of the user's model
(``model.kwargs.hidden``, a grid) and a parameter of the user's algorithm (``algorithm.server_momentum``,
a choice). The trials, created by Tune, import both from the job's runtime_env, which the separate
``fedray tune`` process sets when it starts its own local Ray (PYTHONPATH holds only fedray; the
``--address`` branch, joining a running Ray, is proven with user code by
``test_e2e_tune_failures.py``); each trial's server and workers import them from the server's. The
data's natural client ids reach the client rows.

The sweep is made by ``tests/user_code_sweep_rig.py`` through the session fixture ``user_code_sweep``
(``tests/conftest.py``), once for this test and the dashboard's tests that read its directory
(``tests/dashboard/test_dashboard_browser.py``): both modules are in its xdist group."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
import yaml
from user_code_sweep_rig import CLIENTS, HIDDEN, MOMENTUM, ROUNDS, XDIST_GROUP

from fedray.tracking import read_metrics


@pytest.mark.slow
@pytest.mark.xdist_group(XDIST_GROUP)
def test_fedray_tune_runs_a_users_algorithm_callback_model_and_dataset_in_every_trial(user_code_sweep):
    result = user_code_sweep.result
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-3000:])
    [sweep_dir] = user_code_sweep.sweep_dirs  # what `fedray tune` left in the project's sweeps/
    trials = pq.read_table(sweep_dir / "trials.parquet").to_pylist()
    assert sorted(trial["model.kwargs.hidden"] for trial in trials) == sorted(HIDDEN)
    assert all(trial["status"] == "TERMINATED" and trial["round"] == ROUNDS for trial in trials), trials
    for trial in trials:
        run_dir = sweep_dir / trial["run_dir"]
        saved = yaml.safe_load((run_dir / "config.yaml").read_text())
        assert saved["model"]["kwargs"] == {"hidden": trial["model.kwargs.hidden"]}
        assert trial["algorithm.server_momentum"] in MOMENTUM
        assert saved["algorithm"]["server_momentum"] == trial["algorithm.server_momentum"]  # the swept plug-in parameter
        clients = read_metrics(run_dir, "client")
        assert {row["client_name"] for row in clients} == {f"vineyard-{i}" for i in range(CLIENTS)}
        rows = read_metrics(run_dir, "round")
        assert rows[-1]["test_accuracy"] > 0.4  # 3 classes: trained beyond chance
        assert len(rows) == ROUNDS and all(row["server_step_norm"] > 0 for row in rows)  # FedAvgM's own aggregate ran
        logged = [json.loads(line) for line in (run_dir / "rounds.jsonl").read_text().splitlines()]
        assert [row["round"] for row in logged] == list(range(1, ROUNDS + 1))  # the out-of-tree callback saw every round of the trial
