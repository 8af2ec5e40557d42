"""Compression of every upload kind (``Upload.compressed``): prototype and representation sums,
per-client prototypes, control-variate deltas and representations are encoded as the model weights
are, each tensor on its own random stream, and what the server's ``aggregate`` receives is what it
decodes; ``bytes_up`` counts their encoded size; error feedback keeps one residual per tensor; under
central DP a clipped tensor is clipped to its bound again after decoding. Ray-free: real engines and
workers in this process (fedray.testing.Federation)."""

from __future__ import annotations

import pytest
import torch

from fedray.algorithms import get_algorithm_class
from fedray.privacy.clipping import clip_jointly
from fedray.runtime.support import base_overrides
from fedray.systems.clock import payload_bytes, sums_bytes
from fedray.systems.compression import RESIDUAL_KEY, TopK, UploadCompression, compressed_parts
from fedray.testing import Federation

INT8 = ["systems.enabled=true", "systems.compression.method=int8", "train.clients_per_round=2"]
CLIENTS = (1, 4)


def federation(tmp_path, name: str, *overrides: str) -> Federation:
    return Federation(tmp_path, [*base_overrides(get_algorithm_class(name), name), *overrides])


# Hetero-SSFL's representations (its only upload) take ~20 s a client here: the support-matrix walk checks their bytes
@pytest.mark.parametrize("name", ["fedproto", "fedproc", "fedcosr", "scaffold", "fedsc"])
def test_every_declared_tensor_arrives_as_the_server_decodes_it_and_counts_its_encoded_bytes(tmp_path, name):
    run = federation(tmp_path, name, *INT8)
    parts = compressed_parts(run.algorithm)
    assert parts, f"{name} declares no tensor to compress"
    compression = UploadCompression(run.config.systems.compression, run.config.seed)
    summed: dict[str, torch.Tensor] = {}
    uncompressed: dict[str, torch.Tensor] = {}
    per_client: dict[tuple[int, str], torch.Tensor] = {}
    sizes: dict[int, float] = {}
    for client in CLIENTS:
        update = run.client_update(1, client)  # the same seeded client step as in the round
        encoded = {}
        if "weights" in update.sums:
            delta = update.sums["weights"] / update.sums["num_samples"] - run.state["weights"].double()
            encoded["weights"] = compression.compress(1, client, delta, None).wire_bytes
        for index, (key, travels_in) in enumerate(parts, start=1):
            value = (update.sums if travels_in == "sums" else update.payload)[key]
            sent = compression.compress(1, client, value.reshape(-1), None, part=index)
            received = sent.received.view(value.shape).to(value.dtype)
            assert not torch.equal(received, value)  # int8 changed it
            encoded[key] = sent.wire_bytes
            if travels_in == "sums":
                summed[key] = summed.get(key, 0) + received.double()
                uncompressed[key] = uncompressed.get(key, 0) + value.double()
            else:
                per_client[client, key] = received
        rest = sums_bytes({k: v for k, v in update.sums.items() if k not in encoded})
        rest += payload_bytes({k: v for k, v in update.payload.items() if k not in encoded})
        sizes[client] = float(rest + sum(encoded.values()))
    row = run.run_round(1, list(CLIENTS))
    results = run.results[-1]
    for key, value in summed.items():  # the cohort's sum of what each client's tensor decodes to
        assert torch.allclose(results.sums[key].double(), value, rtol=1e-6, atol=1e-9)
        assert not torch.allclose(results.sums[key].double(), uncompressed[key], rtol=1e-6, atol=1e-9)
    for (client, key), value in per_client.items():
        assert torch.equal(results.payloads[client][key], value)
    assert {client: results.client_metrics[client]["upload_bytes"] for client in CLIENTS} == sizes
    assert row["bytes_up"] == sum(sizes.values())


def test_scaffold_keeps_one_residual_per_compressed_tensor(tmp_path):
    """Top-k with error feedback: the control-variate delta's residual is Δc_i less what top-k kept,
    stored next to the weights' residual and SCAFFOLD's own control variate, never shown to SCAFFOLD."""
    fraction = ["systems.compression.topk_fraction=0.05", "systems.compression.error_feedback=true"]
    run = federation(tmp_path, "scaffold", "systems.enabled=true", "systems.compression.method=topk", *fraction)
    delta_control = run.client_update(1, 2).sums["delta_control"].float()
    run.run_round(1, [2, 5])
    stored = run.client_state(2)
    assert set(stored) == {"control", RESIDUAL_KEY, f"{RESIDUAL_KEY}:delta_control"}
    residual = stored[f"{RESIDUAL_KEY}:delta_control"]
    kept = torch.topk(delta_control.abs(), TopK(0.05).kept(delta_control.numel())).indices
    assert torch.equal(residual, delta_control.index_fill(0, kept, 0))
    assert set(run.client_context(2, 2).state) == {"control"}


def test_under_central_dp_a_decoded_part_is_clipped_to_its_bound_again(tmp_path):
    """int8's stochastic rounding can take a prototype sum clipped to C_p past C_p; the noise is
    calibrated to C_p, so the decoded sum is clipped once more before it is summed."""
    bound = 0.5
    privacy = ["privacy.mechanism=central", "privacy.noise_multiplier=0", "privacy.clip=.inf", "privacy.clip_counts=.inf"]
    run = federation(tmp_path, "fedproto", *INT8, *privacy, f"privacy.clip_prototypes={bound}")
    path, compression = run.worker.upload_path, UploadCompression(run.config.systems.compression, run.config.seed)
    (index,) = [index for index, (key, _) in enumerate(compressed_parts(run.algorithm), start=1) if key == "class_sums"]
    broadcast = run.algorithm.broadcast(run.state, 1)
    past_the_bound = 0
    for client in range(run.num_clients):
        update = run.client_update(1, client)
        (clipped, _), _ = clip_jointly([update.sums["class_sums"], update.sums["class_counts"]], [bound, float("inf")])
        decoded = compression.compress(1, client, clipped.reshape(-1), None, part=index).received
        past_the_bound += float(decoded.norm()) > bound
        sent = path.apply(1, client, update, broadcast).sums["class_sums"]
        assert float(sent.norm()) <= bound * (1 + 1e-9)
    assert past_the_bound > 0  # the re-clip was needed by at least one client
