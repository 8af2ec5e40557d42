"""Compression of model weights a client sends in its payload (``Upload.model_weights``): FedSKC
outside ``gda_mode: fedavg`` uploads each client's flat weights for GDA to weigh one by one. They
were sent uncompressed while the config said ``method: topk`` (a warning logged on the worker, the
bytes unchanged); now each is encoded as its update against the broadcast weights, as the weights'
sums are, and the server's ``aggregate`` receives w + decode(C(Δ_k)). Ray-free: real engines and
workers in this process (fedray.testing.Federation)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from fedray.algorithms import get_algorithm_class
from fedray.config import ConfigError
from fedray.plugins import load_config
from fedray.runtime.experiment import prepare_data
from fedray.systems.clock import payload_bytes
from fedray.systems.compression import RESIDUAL_KEY, TopK, UploadCompression, check_compression, compressed_parts
from fedray.testing import Federation

FEDSKC_TOPK = ["algorithm.name=fedskc", "systems.enabled=true", "systems.compression.method=topk"]


def test_fedskc_uploads_its_weights_top_k_compressed_and_the_server_aggregates_what_it_decodes(tmp_path):
    run = Federation(tmp_path, FEDSKC_TOPK)
    assert run.algorithm.params.gda_mode == "paper"  # the weights travel per client, in the payload
    reference = run.state["weights"].double()
    compression = UploadCompression(run.config.systems.compression, run.config.seed)
    expected, expected_knowledge, sizes = {}, {}, {}
    for client in (1, 4):
        update = run.client_update(1, client)  # the same seeded client step as in the round
        received = compression.compress(1, client, update.payload["weights"].double() - reference, None).received
        expected[client] = (reference + received.double()).float()
        assert not torch.equal(expected[client], update.payload["weights"])  # compression changed what arrives
        assert compressed_parts(run.algorithm) == [("knowledge", "payload")]  # its logit knowledge: part 1
        knowledge = compression.compress(1, client, update.payload["knowledge"].reshape(-1), None, part=1)
        expected_knowledge[client] = knowledge.received.view(update.payload["knowledge"].shape)
        rest = {key: value for key, value in update.payload.items() if key not in ("weights", "knowledge")}
        # float32 values and int32 indices of the weights' and the knowledge's top 1 %
        sizes[client] = payload_bytes(rest) + 8 * TopK(0.01).kept(reference.numel()) + knowledge.wire_bytes
    row = run.run_round(1, [1, 4])
    results = run.results[-1]
    for client in (1, 4):
        assert torch.equal(results.payloads[client]["weights"], expected[client])
        assert torch.equal(results.payloads[client]["knowledge"], expected_knowledge[client])
        assert results.client_metrics[client]["upload_bytes"] == sizes[client]
    assert row["bytes_up"] == sum(sizes.values())
    assert all(size < 4 * reference.numel() / 10 for size in sizes.values())  # 1 % of the entries at 8 bytes, not 4 bytes each


def test_fedskc_error_feedback_keeps_what_its_weights_upload_left_out(tmp_path):
    run = Federation(tmp_path, [*FEDSKC_TOPK, "systems.compression.error_feedback=true"])
    update = run.client_update(1, 2)
    delta = (update.payload["weights"].double() - run.state["weights"].double()).float()
    run.run_round(1, [2, 5])
    residual = run.client_state(2)[RESIDUAL_KEY]
    kept = torch.topk(delta.abs(), TopK(0.01).kept(delta.numel())).indices
    assert torch.equal(residual[kept], torch.zeros(len(kept)))
    assert torch.equal(residual.index_fill(0, kept, 0), delta.index_fill(0, kept, 0))
    second = run.client_update(2, 2)
    carried = (second.payload["weights"].double() - run.state["weights"].double()).float() + residual
    run.run_round(2, [2, 5])
    kept = torch.topk(carried.abs(), len(kept)).indices
    assert torch.equal(run.client_state(2)[RESIDUAL_KEY], carried.index_fill(0, kept, 0))


@pytest.mark.parametrize("gda_mode", ["paper", "normalized", "fedavg"])
def test_fedskc_with_compression_passes_the_checks_in_every_gda_mode(gda_mode):
    """In gda_mode=fedavg the weights travel in the sums (MODEL_WEIGHTS), otherwise per client: both compressed."""
    config = load_config(
        None, [*FEDSKC_TOPK, f"algorithm.gda_mode={gda_mode}", "model.name=mlp", "data.num_clients=4", "train.clients_per_round=2"]
    )
    prepare_data(config)


def test_an_algorithm_whose_run_uploads_nothing_compressible_is_refused_by_what_it_uploads_in_this_run():
    """The check reads the run's uploads (Algorithm.run_uploads), not every upload the class may make."""
    config = load_config(None, [*FEDSKC_TOPK, "model.name=mlp", "data.num_clients=4", "train.clients_per_round=2"])
    fedskc = get_algorithm_class("fedskc")
    data = prepare_data(config)

    class KnowledgeOnly(fedskc):  # a variant that uploads its logit knowledge alone, declared not compressible
        name = ""

        def run_uploads(self):
            return frozenset(replace(upload, compressed=()) for upload in super().run_uploads() if upload.kind == "logit knowledge")

    with pytest.raises(ConfigError, match="uploads logit knowledge, none of it declared compressible") as error:
        check_compression(config, KnowledgeOnly(config, data.info))
    assert error.value.key == "systems.compression.method"
    check_compression(config, fedskc(config, data.info))
