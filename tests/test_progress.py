"""The progress bar's warnings (Ray-free): a collapse of the evaluated accuracy is told once, when it happens."""

from __future__ import annotations

from fedray import load_config
from fedray.tracking import RunContext
from fedray.tracking.progress import ProgressBar


def test_a_collapse_of_the_accuracy_is_warned_once_with_what_to_do(tmp_path, capsys):
    run = RunContext(config=load_config(None, ["train.rounds=5", "train.lr=0.2"]), run_dir=tmp_path, data=None,
                     server=None, start_round=0)
    bar = ProgressBar()
    bar.on_run_start(run)
    accuracies = {1: 0.80, 2: 0.91, 3: 0.0887, 4: 0.09, 5: 0.85}
    for round, accuracy in accuracies.items():
        bar.on_round_end(run, {"round": round, "train_loss": 0.5, "seconds": 1.0, "excluded_updates": 0,
                               "test_accuracy": accuracy}, [])
    bar.on_run_end(run)

    warnings = [line for line in "".join(capsys.readouterr()).splitlines() if line.startswith("warning")]
    assert warnings == [
        "warning: round 3: test_accuracy fell to 0.0887 from 0.9100 (round 2): training collapsed; "
        "a lower train.lr (now 0.2) or a train.grad_clip may keep it stable"
    ]  # not again in round 4, still collapsed; round 5 recovered (0.85 > 0.455)
