"""The S3 server going away during a run that keeps client state there (issue 42, item 6): a real
S3 API (moto's server) reached through an :class:`~fedray.testing.s3.InterruptibleEndpoint`, a real
FedPer run on the local backend through the ``fedray`` command. The endpoint goes down after round 3
(checkpoint 2 written, round 3's state stored): the command ends with one ``fedray:`` line naming the
location and the resume command, exit 1 like any other failed run; once the endpoint is back, the
resume ends with the metrics, global model and personal heads of an uninterrupted run, bit for bit.
A deleted location is reported as deleted, not as unreachable storage."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch

from fedray import load_config
from fedray.cli.main import main
from fedray.runtime import list_checkpoints, load_checkpoint, run_experiment
from fedray.runtime.state_store import ClientStateMissing, ClientStateStore, client_state_location, open_location
from fedray.testing.s3 import InterruptibleEndpoint
from fedray.tracking import Callback, RunContext

from e2e_helpers import comparable_rows, final_weights, round_rows
from test_safety_runs import FEDPER, LOCAL_RUN

CPU = torch.device("cpu")
#: The endpoint :class:`TakeS3DownAfterRound3` takes down (once: a resume runs the callback again).
OUTAGE: dict[str, InterruptibleEndpoint] = {}


class TakeS3DownAfterRound3(Callback):
    """``output.callbacks`` entry: the S3 endpoint in ``OUTAGE`` goes away when round 3 ends."""

    def on_round_end(self, run: RunContext, row: dict[str, Any], client_rows: list[dict[str, Any]]) -> None:
        if row["round"] == 3 and "endpoint" in OUTAGE:
            OUTAGE.pop("endpoint").go_down()


def as_arguments(overrides: list[str]) -> list[str]:
    return [argument for override in overrides for argument in ("--set", override)]


def personal_heads(run_dir: Path, config) -> dict[int, torch.Tensor]:
    versions = load_checkpoint(list_checkpoints(run_dir)[-1][1])["state_versions"]
    store = ClientStateStore(client_state_location(config.output, run_dir))
    return {client: store.load(client, int(version), CPU)["personal"] for client, version in enumerate(versions)}


@pytest.fixture
def endpoint(s3):
    with InterruptibleEndpoint(s3) as endpoint:
        yield endpoint
    OUTAGE.clear()


@pytest.mark.slow
def test_s3_going_away_mid_run_is_one_line_and_the_resume_is_bit_identical(tmp_path, endpoint, capsys):
    state_dir = endpoint.uri(f"{tmp_path.name}/state")
    overrides = FEDPER + LOCAL_RUN + [f"output.dir={tmp_path / 'runs'}", "output.name=exp1", f"output.client_state_dir={state_dir}"]
    OUTAGE["endpoint"] = endpoint
    code = main(["run", "--quiet", *as_arguments(overrides + [f"output.callbacks=[{__name__}:TakeS3DownAfterRound3]"])])
    stderr = capsys.readouterr().err
    run_dir = tmp_path / "runs" / "exp1"
    assert code == 1
    lines = [line for line in stderr.splitlines() if line.startswith("fedray:")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    location = f"s3://fedray/{tmp_path.name}/state/exp1"
    assert re.search(rf"the client state location {re.escape(location)} failed while (writing|reading|removing) client \d", lines[0])
    assert lines[0].endswith(f"once it works again, continue it from its checkpoint of round 2 with `fedray run --resume {run_dir}`")
    assert [r for r, _ in list_checkpoints(run_dir)] == [2]

    endpoint.come_back()
    assert main(["run", "--resume", str(run_dir), "--quiet"]) == 0
    reference = run_experiment(load_config(None, FEDPER + LOCAL_RUN + [f"output.dir={tmp_path / 'reference'}"]), progress=False)
    assert comparable_rows(round_rows(run_dir)) == comparable_rows(round_rows(reference.run_dir))
    assert torch.equal(final_weights(run_dir), final_weights(reference.run_dir))
    mine = personal_heads(run_dir, load_config(run_dir / "config.yaml"))
    theirs = personal_heads(Path(reference.run_dir), load_config(Path(reference.run_dir) / "config.yaml"))
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[c], theirs[c]) for c in mine)


def test_a_deleted_location_is_reported_as_deleted(tmp_path, endpoint):
    store = ClientStateStore(endpoint.uri(f"{tmp_path.name}/state/exp1"))
    store.save(0, 1, {"personal": torch.ones(2)}, keep=())
    store.save(1, 1, {"personal": torch.ones(2)}, keep=())
    fresh = ClientStateStore(store.location, cache_size=0)
    filesystem, root = open_location(store.location)
    filesystem.delete_file(f"{root}/0000001/r000001.pt")
    with pytest.raises(
        ClientStateMissing, match=r"client 1: state of round 1 .* is missing although other client state is there \(deleted\?\)"
    ):
        fresh.load(1, 1, CPU)
    filesystem.delete_dir_contents(root)
    with pytest.raises(
        ClientStateMissing, match=rf"is missing, and s3://fedray/{tmp_path.name}/state/exp1 holds no client state at all: it was deleted"
    ):
        fresh.load(0, 1, CPU)
