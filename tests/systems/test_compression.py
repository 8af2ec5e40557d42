"""Upload compression (``systems.compression``): the fp16, int8 and top-k codecs, error feedback and
its residual as client state (dropped clients, resume), bytes_up at the compressed size, the off switch
and bad inputs. Ray-free: real engines and workers in this process (fedray.testing.Federation, the
local backend) and the real CLI for bad inputs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import fedray
from e2e_helpers import CrashAfterRound, comparable_rows, final_weights, round_rows
from fedray.config.schema import CompressionConfig
from fedray.runtime.state_store import NO_STATE, decode_state
from fedray.systems.compression import RESIDUAL_KEY, HalfPrecision, StochasticInt8, TopK, UploadCompression
from fedray.testing import Federation
from test_bad_inputs import assert_rejected, run_fedray

REPO = Path(__file__).resolve().parents[2]
ON = "systems.enabled=true"
TOPK_EF = [ON, "systems.compression.method=topk", "systems.compression.topk_fraction=0.05", "systems.compression.error_feedback=true"]


def generator(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --------------------------------------------------------------------- the codecs


def test_fp16_round_trip_is_half_precision_at_two_bytes_an_entry():
    vector = torch.randn(1000, generator=generator()) * 1e-3
    message = HalfPrecision().encode(vector, generator())
    assert message["values"].dtype == torch.float16 and message["values"].numel() * 2 == 2000
    assert torch.equal(HalfPrecision().decode(message, 1000), vector.half().float())


def test_int8_is_unbiased_within_one_level_and_seeded():
    """The mean of many independently seeded quantisations converges to the vector: within 6 standard
    errors (≤ 0.5 level per draw) of every entry, where rounding to the nearest level, or down, is off
    by up to half a level, or a whole one."""
    vector = torch.randn(700, generator=generator(1)) * torch.linspace(0.01, 3.0, 700)  # magnitudes across buckets
    codec = StochasticInt8(bucket_size=256)
    draws = 4000
    decoded = torch.stack([codec.decode(codec.encode(vector, generator(seed)), 700) for seed in range(draws)])
    scales = torch.nn.functional.pad(vector.abs(), (0, 68)).view(-1, 256).amax(dim=1)  # 3 buckets, the last one padded
    level = (scales / 127).repeat_interleave(256)[:700]
    assert ((decoded - vector).abs() < level * (1 + 1e-5)).all()  # every draw is one of the two levels around v_i
    assert ((decoded.mean(dim=0) - vector).abs() <= 6 * 0.5 * level / draws**0.5).all()
    message = codec.encode(vector, generator(5))
    assert message["values"].dtype == torch.int8 and message["scales"].shape == (3,)
    assert torch.equal(message["values"], codec.encode(vector, generator(5))["values"])


def test_topk_keeps_exactly_the_k_largest_magnitudes():
    vector = torch.randn(1000, generator=generator(2))
    codec = TopK(0.013)
    message = codec.encode(vector, generator())
    assert codec.kept(1000) == 13 == message["values"].numel() and message["indices"].dtype == torch.int32
    decoded = codec.decode(message, 1000)
    largest = torch.argsort(vector.abs(), descending=True)[:13]
    assert set(torch.nonzero(decoded).flatten().tolist()) == set(largest.tolist())
    assert torch.equal(decoded[largest], vector[largest])


def test_error_feedback_compresses_the_update_plus_the_residual_and_keeps_what_was_left_out():
    compression = UploadCompression(CompressionConfig(method="topk", topk_fraction=0.1, error_feedback=True), seed=0)
    first = torch.randn(50, generator=generator(3), dtype=torch.float64)
    sent = compression.compress(1, 7, first, None)
    assert torch.equal(sent.received + sent.residual, first.float())  # the residual is exactly what was not sent
    assert int((sent.received != 0).sum()) == 5 and int((sent.residual == 0).sum()) == 5
    second = torch.randn(50, generator=generator(4), dtype=torch.float64)
    again = compression.compress(2, 7, second, sent.residual)
    carried = second.float() + sent.residual
    assert torch.equal(again.received, TopK(0.1).decode(TopK(0.1).encode(carried, generator()), 50))
    assert torch.equal(again.received + again.residual, carried)


# --------------------------------------------------------------------- in a federation


@pytest.mark.parametrize(
    ("method", "weights_bytes"),
    [("fp16", lambda d: 2 * d), ("int8", lambda d: d + 4 * -(-d // 1024)), ("topk", lambda d: 8 * -(-d // 100))],
)
def test_the_server_aggregates_the_decoded_updates_and_counts_the_compressed_bytes(tmp_path, method, weights_bytes):
    run = Federation(tmp_path, [ON, f"systems.compression.method={method}"])
    reference = run.state["weights"].double()
    expected = torch.zeros_like(reference)
    compression = UploadCompression(run.config.systems.compression, run.config.seed)
    for client in (1, 4):
        update = run.client_update(1, client)  # the same seeded client step as in the round
        n = update.sums["num_samples"]
        received = compression.compress(1, client, update.sums["weights"] / n - reference, None).received
        assert not torch.equal(received.double(), update.sums["weights"] / n - reference)  # compression changed it
        expected += n * (reference + received.double())
    row = run.run_round(1, [1, 4])
    assert torch.equal(run.results[-1].sums["weights"], expected)
    assert row["bytes_up"] == 2 * (weights_bytes(reference.numel()) + 4)  # + n_k
    assert all(metrics["upload_bytes"] == row["bytes_up"] / 2 for metrics in run.results[-1].client_metrics.values())


def test_the_residual_is_client_state_carried_to_the_next_round(tmp_path):
    run = Federation(tmp_path, TOPK_EF)
    update = run.client_update(1, 2)
    delta = (update.sums["weights"] / update.sums["num_samples"] - run.state["weights"].double()).float()
    run.run_round(1, [2, 5])
    residual = run.client_state(2)[RESIDUAL_KEY]
    kept = torch.topk(delta.abs(), TopK(0.05).kept(delta.numel())).indices
    assert torch.equal(residual[kept], torch.zeros(len(kept)))
    assert torch.equal(residual.index_fill(0, kept, 0), delta.index_fill(0, kept, 0))
    assert run.client_context(2, 2).state is None  # FedAvg never sees the residual
    second = run.client_update(2, 2)
    carried = (second.sums["weights"] / second.sums["num_samples"] - run.state["weights"].double()).float() + residual
    run.run_round(2, [2, 5])
    new_residual = run.client_state(2)[RESIDUAL_KEY]
    kept = torch.topk(carried.abs(), len(kept)).indices
    assert torch.equal(new_residual, carried.index_fill(0, kept, 0))


def test_a_dropped_client_keeps_the_residual_of_its_last_upload(tmp_path):
    run = Federation(tmp_path, [*TOPK_EF, "systems.selection.dropout=0.5", "data.num_clients=10", "train.clients_per_round=6"])
    residuals: dict[int, torch.Tensor] = {}
    for round in (1, 2, 3):
        row = run.run_round(round)
        trained = sorted(run.results[-1].client_metrics)
        assert row["dropped"] > 0 and row["aggregated"] == len(trained)
        for client in range(10):
            if client in trained:
                assert run.versions[client] == round
                residuals[client] = run.client_state(client)[RESIDUAL_KEY]
            elif client in residuals:
                assert torch.equal(run.client_state(client)[RESIDUAL_KEY], residuals[client])
            else:
                assert run.versions[client] == NO_STATE


def test_a_stateful_algorithm_keeps_its_own_state_next_to_the_residual(tmp_path):
    run = Federation(tmp_path, ["algorithm.name=scaffold", *TOPK_EF]).run(2)
    client = sorted(run.results[-1].client_metrics)[0]
    stored = run.client_state(client)
    assert set(stored) == {"control", RESIDUAL_KEY, f"{RESIDUAL_KEY}:delta_control"}  # its control delta's residual too
    assert set(run.client_context(3, client).state) == {"control"}


def test_off_changes_nothing(tmp_path):
    """method=none leaves the other compression keys inert: no upload path, the same rows and weights."""
    plain = Federation(tmp_path / "plain", [ON]).run(2)
    off = Federation(tmp_path / "off", [ON, "systems.compression.method=none", "systems.compression.topk_fraction=0.5"]).run(2)
    assert off.worker.upload_path is None and plain.worker.upload_path is None
    assert off.rows == plain.rows and torch.equal(off.state["weights"], plain.state["weights"])
    assert all("upload_bytes" not in metrics for metrics in off.results[-1].client_metrics.values())
    assert not any((tmp_path / "off").rglob("*.pt"))  # FedAvg without error feedback stores no client state


def test_a_resumed_run_with_top_k_and_error_feedback_is_bit_identical(tmp_path):
    """SCAFFOLD: the residuals of its weights and of its control-variate deltas are carried over."""

    def run(name: str, callbacks=()) -> Path:
        config = fedray.load_config(
            None,
            [
                *TOPK_EF,
                "algorithm.name=scaffold",
                "systems.selection.dropout=0.3",
                f"output.dir={tmp_path}",
                f"output.name={name}",
                "resources.num_workers=1",
                "data.num_clients=8",
                "train.clients_per_round=4",
                "train.local_epochs=1",
                "train.rounds=4",
                "checkpoint.every=2",
                "output.tensorboard=false",
                "output.plots=false",
            ],
        )
        return Path(fedray.run_experiment(config, progress=False, extra_callbacks=list(callbacks)).run_dir)

    whole = run("whole")
    with pytest.raises(RuntimeError, match="simulated driver crash"):
        run("cut", [CrashAfterRound(3)])
    fedray.resume_experiment(tmp_path / "cut", progress=False)
    assert comparable_rows(round_rows(tmp_path / "cut")) == comparable_rows(round_rows(whole))
    assert torch.equal(final_weights(tmp_path / "cut"), final_weights(whole))
    stored = [decode_state(path.read_bytes(), str(path)) for path in (whole / "client_state").rglob("*.pt")]
    assert any(f"{RESIDUAL_KEY}:delta_control" in state for state in stored)  # the residuals were stored


# --------------------------------------------------------------------- bad inputs

BAD_INPUTS = [
    ("undeclared_uploads", [ON, "systems.compression.method=topk", "algorithm.name=feddyn"], "feddyn does not declare what it uploads"),
    ("error_feedback_alone", [ON, "systems.compression.error_feedback=true"], "error_feedback needs a compression method"),
    ("systems_off", ["systems.compression.method=fp16"], "systems keys are set but systems.enabled is false"),
    ("zero_fraction", [ON, "systems.compression.method=topk", "systems.compression.topk_fraction=0"], "greater than 0"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("case", "overrides", "expected"), BAD_INPUTS, ids=[case[0] for case in BAD_INPUTS])
def test_bad_compression_input_is_one_line_and_exit_2(tmp_path, case, overrides, expected):
    result = run_fedray(["run", "--set", "resources.num_workers=1", *[f"--set={o}" for o in overrides]], tmp_path)
    assert_rejected(result, expected)
    assert result.stderr.splitlines()[1].lstrip().startswith("systems")
    assert not (tmp_path / "runs").exists()
