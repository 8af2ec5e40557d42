"""Each task end to end from its shipped example, on the local backend (bit-identical to Ray by design;
tests/runtime/test_backends.py runs the regression on both): the task's metrics in the rows, its
headline in the summary and run_info.json, the same client updates with one worker or two, and LoRA
exchanging only the adapters."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import transformers

import fedray
from e2e_helpers import comparable_rows, round_rows
from fedray.layout import RUN_INFO_FILE
from fedray.tracking import read_metrics

REPO = Path(__file__).resolve().parents[2]


def run(tmp_path: Path, example: str, name: str, overrides: list[str]) -> fedray.RunSummary:
    config = fedray.load_config(
        REPO / "examples" / example,
        [
            f"output.dir={tmp_path}",
            f"output.name={name}",
            "resources.backend=local",
            "train.rounds=2",
            "output.tensorboard=false",
            "output.plots=false",
            *overrides,
        ],
    )
    return fedray.run_experiment(config, progress=False)


def test_a_regression_reports_rmse_mae_r2_lowest_rmse_best_and_one_or_two_workers_agree(tmp_path):
    one = run(tmp_path, "regression_diabetes.yaml", "one", ["resources.num_workers=1"])
    two = run(tmp_path, "regression_diabetes.yaml", "two", ["resources.num_workers=2"])
    rows, rows_two = round_rows(one.run_dir), round_rows(two.run_dir)
    # the same client updates and model; the test set is cut into one shard per worker, and test_loss
    # adds float32 batch sums, so only it may differ in its last bits (docs/architecture.md: same worker count)
    assert read_metrics(one.run_dir, "client") == read_metrics(two.run_dir, "client")
    assert [row["test_loss"] for row in rows] == pytest.approx([row["test_loss"] for row in rows_two], rel=1e-6)
    without_loss = [{k: v for k, v in row.items() if k != "test_loss"} for row in comparable_rows(rows)]
    assert without_loss == [{k: v for k, v in row.items() if k != "test_loss"} for row in comparable_rows(rows_two)]
    assert {"test_rmse", "test_mae", "test_r2", "test_loss"} <= set(rows[-1]) and "test_accuracy" not in rows[-1]
    assert 0 < rows[-1]["test_rmse"] < 100  # the target's units: the diabetes score's std is about 77
    assert (one.headline, one.headline_mode) == ("test_rmse", "min")
    assert one.best_headline == min(row["test_rmse"] for row in rows)
    info = json.loads((Path(one.run_dir) / RUN_INFO_FILE).read_text())
    assert (info["task"], info["headline"], info["headline_mode"]) == ("regression", "test_rmse", "min")


@pytest.mark.slow
def test_language_modelling_reports_perplexity_per_token(tmp_path):
    summary = run(tmp_path, "lm_stdlib.yaml", "lm", ["data.max_samples_per_client=4", "train.clients_per_round=4", "data.seq_len=16"])
    last = round_rows(summary.run_dir)[-1]
    assert last["test_perplexity"] == pytest.approx(math.exp(last["test_loss"]))
    assert 0 < last["test_accuracy"] < 1  # next-character accuracy
    assert last["test_perplexity"] < 102  # better than a uniform guess over the ~100 characters
    assert summary.headline == "test_perplexity" and summary.final_headline == last["test_perplexity"]


@pytest.mark.slow
def test_federated_lora_exchanges_only_the_adapters(tmp_path):
    model_dir = tmp_path / "gpt2"
    data = fedray.load_config(REPO / "examples" / "lm_stdlib.yaml", ["data.seq_len=16"]).data
    info = fedray.data.build_federated_dataset(data, 0).info
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=info.num_classes, n_positions=16, n_layer=1, n_head=2, n_embd=16)
    transformers.GPT2LMHeadModel(config).save_pretrained(model_dir)
    common = ["data.max_samples_per_client=4", "train.clients_per_round=3", "data.seq_len=16", "systems.enabled=true"]
    lora = run(tmp_path, "lora_stdlib.yaml", "lora", [f"model.name=hf:{model_dir}", *common])
    full = run(tmp_path, "lora_stdlib.yaml", "full", [f"model.name=hf:{model_dir}", "model.adapters.method=none", *common])
    lora_info = json.loads((Path(lora.run_dir) / RUN_INFO_FILE).read_text())
    full_info = json.loads((Path(full.run_dir) / RUN_INFO_FILE).read_text())
    assert lora_info["parameters_total"] == full_info["parameters_total"] + 8 * (16 + 48)  # A [r, in] and B [out, r] on c_attn, one layer
    assert lora_info["parameters_uploaded"] == 8 * (16 + 48) and full_info["parameters_uploaded"] == full_info["parameters_total"]
    lora_up, full_up = (round_rows(run.run_dir)[-1]["bytes_up"] for run in (lora, full))
    assert lora_up / full_up == pytest.approx(lora_info["parameters_uploaded"] / full_info["parameters_uploaded"], rel=0.01)
