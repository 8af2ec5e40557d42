"""No silent combination: cells of the support matrix (fedray.runtime.support) run for real, each
doing what the matrix says. A supported cell (✓ or ~) is the cell's own config run by ``fedray run``
on the local backend for one round, and its feature shows in the metrics: bytes_up smaller by exactly
what compression saves on the model weights and on every other tensor the algorithm declares
compressed (Upload.compressed), dp_epsilon under DP, malicious_clients counted, personal_* metrics, FedBuff's
staleness, client state on a real S3 API (moto's server). A refused cell (✗) exits with code 2 before
Ray starts, its problem lines exactly the cell's reasons.

Every algorithm is walked with top-k compression and central DP, and the systems model (compression's
baseline) but for the heavy self-supervised ones; the other features on a representative set of
algorithms; the heavy cells once.
The real CLI: a refused cell's command is a fork of a preloaded process (tests/preloaded_cli.py), whose
exit code, output and unstarted Ray are the process's; a supported cell's ``fedray run`` runs in this
process (what its run records is what it proves), with the installed plug-ins' entry points read once
for the module (each read scans every installed distribution's metadata: most of a one-round run's time
otherwise; nothing is installed meanwhile)."""

from __future__ import annotations

import contextlib
import io
import math
import signal
import subprocess
from pathlib import Path

import pyarrow.fs as pafs
import pytest

import fedray
import fedray.algorithms
from e2e_helpers import final_weights
from fedray.algorithms import ALGORITHMS
from fedray.cli.main import main
from fedray.runtime.support import DEVIATES, FEATURES, REFUSED, SUPPORTED, Cell
from fedray.systems.clock import payload_bytes, sums_bytes
from fedray.systems.compression import compressed_parts, compressed_uploads
from fedray.testing import Federation
from fedray.tracking import read_metrics
from preloaded_cli import RAY_STARTED, run_fedray_preloaded
from test_support_matrix import full_matrix

pytestmark = pytest.mark.xdist_group("support_matrix")  # with pytest -n: one worker computes the matrix once for both files

RUN_ONLY = ["resources.backend=local", "resources.num_workers=1", "output.plots=false", "output.tensorboard=false"]

#: (algorithm, feature) walked besides every algorithm's top-k and central DP cells
REPRESENTATIVE = [
    *[("fedavg", key) for key in ("fp16", "int8", "topk_ef", "local_dp", "attackers", "personalised", "async", "secagg")],
    *[("fedsc", key) for key in ("local_dp", "async", "median", "personalised", "secagg")],
    *[("fedskc", key) for key in ("fp16", "int8", "topk_ef", "local_dp", "attackers", "async")],
    *[("scaffold", key) for key in ("topk_ef", "local_dp", "async")],
    *[("moon", key) for key in ("async", "attackers", "krum")],
    *[("fedavg", key) for key in ("attack_alie", "attack_label_flip", "attack_backdoor", "attackers_per_round")],
    ("fedproto", "attack_label_flip"),
    *[("ditto", key) for key in ("personalised", "fp16", "async")],
    ("fedper", "median"),  # a personalised split's shared part
    *[("fedproto", key) for key in ("topk_ef", "median")],  # prototypes compressed with their residuals, the per-class rule
    ("scaffold", "median"),  # the rule over the control-variate deltas too
    ("fedavg_byol", "personalised"),  # heavy (the linear probe at each evaluation): once
    ("hetero_ssfl", "personalised"),
]
RULES = [feature.key for feature in FEATURES if any(key.startswith("robust.rule=") for key in feature.overrides)]
#: Self-supervised algorithms with a linear probe at each evaluation, and
#: Hetero-SSFL's per-client probes: seconds to tens of seconds a run, so their supported cells run once
HEAVY = ("fedavg_byol", "fedema", "fedu", "hetero_ssfl")
WALKED = sorted(
    {
        *[(name, key) for name in ALGORITHMS for key in ("topk", "central_dp")],
        *[(name, "systems") for name in ALGORITHMS if name not in HEAVY],  # compression's baseline too
        *REPRESENTATIVE,
    }
)


@pytest.fixture(scope="module")
def matrix():
    """The whole matrix: the one test_support_matrix.py checks against the page, computed once for both."""
    return full_matrix()


def run_args(overrides: tuple[str, ...] | list[str], directory: Path) -> list[str]:
    directory.mkdir(parents=True, exist_ok=True)
    args = ["run", "--quiet"]
    for key in [*overrides, *RUN_ONLY, f"output.dir={directory / 'out'}", "output.name=run"]:
        args += ["--set", key]
    return args


def fedray_run(overrides: tuple[str, ...] | list[str], directory: Path) -> tuple[subprocess.CompletedProcess, Path]:
    """``fedray run`` of a cell that must be refused: a fork of the preloaded process."""
    return run_fedray_preloaded(run_args(overrides, directory), directory), directory / "out" / "run"


def fedray_run_here(overrides: tuple[str, ...] | list[str], directory: Path) -> tuple[subprocess.CompletedProcess, Path]:
    """``fedray run`` of a cell that must run: :func:`fedray.cli.main.main` in this process, its
    output captured (its SIGTERM handler put back afterwards)."""
    args, stdout, stderr = run_args(overrides, directory), io.StringIO(), io.StringIO()
    handler = signal.getsignal(signal.SIGTERM)
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code = main(args)
    finally:
        signal.signal(signal.SIGTERM, handler)
    return subprocess.CompletedProcess(["fedray", *args], code, stdout.getvalue(), stderr.getvalue()), directory / "out" / "run"


def assert_refused_with_its_reasons(result: subprocess.CompletedProcess, cell: Cell, run_dir: Path) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    assert "Traceback" not in result.stderr + result.stdout and RAY_STARTED not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines[0] == "fedray: invalid config:", lines
    assert [line.strip() for line in lines[1:]] == list(cell.notes)
    assert not run_dir.exists()


def ran(result: subprocess.CompletedProcess, run_dir: Path) -> tuple[dict, list[dict]]:
    """The round row and the client rows of a supported cell's run, which must have finished."""
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_metrics(run_dir, "round")
    assert len(rows) == 1
    return rows[0], read_metrics(run_dir, "client")


def encoded_bytes(method: str, n: int) -> int:
    """Bytes of n entries as ``method`` encodes them (docs/guide/systems.md's table)."""
    return {
        "fp16": 2 * n,
        "int8": n + 4 * math.ceil(n / 1024),
        "topk": 8 * max(1, math.ceil(0.01 * n)),
        "topk_ef": 8 * max(1, math.ceil(0.01 * n)),
    }[method]


#: Per algorithm, (entries, bytes as sent uncompressed) of each tensor compression encodes
TENSOR_SIZES: dict[str, list[tuple[int, int]]] = {}


def client_saving(name: str, cell: Cell, method: str, run_dir: Path, directory: Path) -> int:
    """Bytes one client saves under ``method``: on its d float32 model weights (4·d less their encoded
    size), and on each other tensor its algorithm declares compressed, that tensor's size as it
    would travel (from a client update of the cell's config, in this process) less its encoded
    size. The shapes are the same on every client."""
    if not any(upload.compressed for upload in fedray.algorithms.get_algorithm_class(name).uploads):  # model weights alone
        d = final_weights(run_dir).numel()
        return 4 * d - encoded_bytes(method, d)
    if name not in TENSOR_SIZES:  # the shapes are the method's cells' alike: one federation per algorithm
        run = Federation(directory, [*cell.overrides, *RUN_ONLY])
        sizes = [(run.state["weights"].numel(), 4 * run.state["weights"].numel())] if compressed_uploads(run.algorithm) else []
        update = run.client_update(1, 0)
        for key, travels_in in compressed_parts(run.algorithm):
            value = (update.sums if travels_in == "sums" else update.payload)[key]
            sizes.append((value.numel(), sums_bytes({key: value}) if travels_in == "sums" else payload_bytes(value)))
        TENSOR_SIZES[name] = sizes
    return sum(sent - encoded_bytes(method, numel) for numel, sent in TENSOR_SIZES[name])


@pytest.fixture(scope="module")
def systems_runs() -> dict[str, dict]:
    """Each algorithm's systems-model cell's round row, the baseline compression is measured against."""
    return {}


def check_supported(name: str, key: str, cell: Cell, directory: Path, matrix, systems_runs: dict[str, dict]) -> None:
    result, run_dir = fedray_run_here(cell.overrides, directory)
    row, clients = ran(result, run_dir)
    if key == "systems":
        assert row["sim_time"] > 0 and row["bytes_down"] >= 0 and row["bytes_up"] >= 0  # Local uploads nothing
        systems_runs[name] = row
    elif key in ("fp16", "int8", "topk", "topk_ef"):
        if name not in systems_runs:
            check_supported(name, "systems", matrix.cell(name, "systems"), directory / "systems", matrix, systems_runs)
        plain = systems_runs[name]
        assert len(clients) == row["aggregated"] and all(client["upload_bytes"] > 0 for client in clients)
        # exactly the model weights' saving and the other compressed tensors'; counts and masks travel as they were
        saving = client_saving(name, cell, key, run_dir, directory / "federation")
        assert plain["bytes_up"] - row["bytes_up"] == row["aggregated"] * saving, (name, key, cell.notes)
        if key == "topk_ef":
            assert any((run_dir / "client_state").rglob("*.pt"))  # the residuals
    elif key in ("central_dp", "local_dp"):
        assert row["dp_epsilon"] > 0 and math.isfinite(row["dp_epsilon"])
        assert all(client["update_norm"] > 0 for client in clients)
    elif key.startswith("attack"):
        assert row["malicious_clients"] >= 1
        assert row["malicious_clients"] == sum(client.get("malicious") == 1.0 for client in clients)
        if key == "attack_backdoor":
            assert 0 <= row["attack_success_rate"] <= 1
    elif key == "personalised":
        personal = [metric for metric in row if metric.startswith("personal_")]
        if cell.status == DEVIATES:  # the deviation the matrix states: the setting has no effect
            assert not personal and "no personal_* metrics" in cell.notes[0]
        else:
            assert row["personal_accuracy"] > 0
    elif key == "async":
        assert row["staleness_mean"] >= 0 and row["aggregated"] >= 1
    elif key == "secagg":
        assert row["secagg_failed"] == 0.0 and row["clients"] == len(clients) > 0
    elif key in RULES:
        cohort = int(next(k for k in cell.overrides[::-1] if k.startswith("train.clients_per_round=")).partition("=")[2])
        assert row["clients"] == cohort and len(clients) == cohort
    else:
        raise AssertionError(f"no check for {key}")


@pytest.mark.parametrize(("name", "key"), WALKED, ids=[f"{name}-{key}" for name, key in WALKED])
def test_a_cell_does_what_the_matrix_says(name, key, matrix, systems_runs, tmp_path):
    cell = matrix.cell(name, key)
    if cell.status == REFUSED:
        result, run_dir = fedray_run(cell.overrides, tmp_path)
        assert_refused_with_its_reasons(result, cell, run_dir)
    else:
        check_supported(name, key, cell, tmp_path, matrix, systems_runs)


def test_each_robust_rule_changes_the_aggregate(matrix, tmp_path):
    """Every rule on FedAvg's cohort (the trimmed mean cutting one update at each end): each aggregate
    differs from the plain mean's and from the others'."""
    losses = {}
    for rule in ["none", *RULES]:
        overrides = matrix.cell("fedavg", "median").overrides if rule == "none" else matrix.cell("fedavg", rule).overrides
        if rule == "none":
            overrides = tuple(key for key in overrides if not key.startswith("robust."))
        assert rule == "none" or matrix.cell("fedavg", rule).status == SUPPORTED
        row, _ = ran(*fedray_run_here(overrides, tmp_path / rule))
        losses[rule] = row["test_loss"]
    assert len(set(losses.values())) == len(losses), losses


def test_the_task_cells_on_a_regression(matrix, tmp_path):
    """A task the algorithm serves runs on scikit-learn's diabetes table (test_rmse); one it does not is
    refused with the cell's reason, the task requirement's."""
    diabetes = ["data.name=diabetes", "data.task=regression", "data.num_clients=4", "model.name=mlp"]
    assert matrix.cell("fedavg", "regression").status == SUPPORTED
    row, _ = ran(*fedray_run_here([*matrix.cell("fedavg", "regression").overrides, *diabetes], tmp_path / "fedavg"))
    assert row["test_rmse"] > 0
    refused = matrix.cell("fedproto", "regression")
    result, run_dir = fedray_run([*refused.overrides, *diabetes], tmp_path / "fedproto")
    assert_refused_with_its_reasons(result, refused, run_dir)


@pytest.mark.parametrize("name", ["scaffold", "fedavg"])
def test_client_state_on_s3_is_stored_there_or_the_matrix_says_nothing_is(name, matrix, s3, tmp_path):
    """SCAFFOLD keeps its control variates per client (✓): they land in the bucket; FedAvg keeps no
    client state (~, no effect): nothing does. In this process, which holds moto's credentials."""
    cell = matrix.cell(name, "s3_state")
    prefix = f"support-walk/{name}"
    overrides = [
        key if not key.startswith("output.client_state_dir=") else f"output.client_state_dir={s3.uri(prefix)}" for key in cell.overrides
    ]
    config = fedray.load_config(None, [*overrides, *RUN_ONLY, f"output.dir={tmp_path}", "output.name=run"])
    summary = fedray.run_experiment(config, progress=False)
    assert summary.rounds == 1
    stored = s3.filesystem().get_file_info(pafs.FileSelector(f"{s3.bucket}/{prefix}", recursive=True, allow_not_found=True))
    stored = [info for info in stored if info.type == pafs.FileType.File]
    if cell.status == SUPPORTED:
        assert stored, "no client state was written to S3"
    else:
        assert cell.status == DEVIATES and "nothing is stored there" in cell.notes[0]
        assert stored == []
