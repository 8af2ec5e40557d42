"""Hugging Face models (``model.name: hf:<directory>``) and LoRA adapters (``model.adapters``).

Every model is a tiny random one built here and written with ``save_pretrained`` into a temporary
directory (with a tokenizer built offline): nothing is downloaded, and fedray reads the directory with
``local_files_only=True``.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers  # the test extra installs it and peft (users: pip install 'fedray[hf]')

from fedray import load_config
from fedray.algorithms import get_algorithm_class
from fedray.algorithms.base import ClientContext
from fedray.config import ConfigError
from fedray.config.schema import AdaptersConfig, ModelConfig
from fedray.data import DatasetInfo
from fedray.data.augment import get_augmentation
from fedray.models import build_model, get_flat_weights, num_flat_weights, parameter_counts, state_keys
from fedray.models.checks import check_model_output
from fedray.runtime.experiment import prepare_data
from fedray.seeding import seed_client
from preloaded_cli import run_fedray_preloaded
from test_bad_inputs import assert_rejected

VOCAB, HIDDEN, INNER, SEQ = 50, 16, 64, 12
LM = "language_modeling"


def tokens(vocab: int = VOCAB, seq_len: int = SEQ, classes: int | None = None) -> DatasetInfo:
    """Token data: a language model's outputs are the vocabulary, a classifier's its classes."""
    return DatasetInfo("tokens", classes or vocab, 0, 0, (), (), "none", modality="tokens", input_shape=(seq_len,), vocab_size=vocab)


def _tokenizer(directory: Path) -> None:
    """A word-level tokenizer over VOCAB ids ([PAD] = 0, [UNK] = 1, w2 … w49), built without the network."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocabulary = {"[PAD]": 0, "[UNK]": 1} | {f"w{i}": i for i in range(2, VOCAB)}
    backend = Tokenizer(models.WordLevel(vocabulary, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]").save_pretrained(directory)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, Path]:
    """Directories written by save_pretrained: a GPT-2 language model (with its tokenizer), a BERT
    sequence classifier with 3 labels, and a GPT-2 whose vocabulary and positions fit pystdlib_chars."""
    root = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    gpt2 = dict(n_layer=1, n_head=2, n_embd=HIDDEN, n_inner=INNER, bos_token_id=1, eos_token_id=1)
    transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=VOCAB, n_positions=64, **gpt2)).save_pretrained(root / "gpt2")
    _tokenizer(root / "gpt2")
    bert = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=1, num_attention_heads=2, intermediate_size=INNER, num_labels=3
    )
    transformers.BertForSequenceClassification(bert).save_pretrained(root / "bert")
    transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=128, n_positions=128, **gpt2)).save_pretrained(root / "chars")
    return {name: root / name for name in ("gpt2", "bert", "chars")}


def hf(directory: Path, **keys: object) -> ModelConfig:
    return ModelConfig(name=f"hf:{directory}", **keys)


def lora(rank: int = 4, **keys: object) -> AdaptersConfig:
    return AdaptersConfig(method="lora", rank=rank, **keys)


def _batch(saved: dict[str, Path]) -> torch.Tensor:
    """Two sentences through the saved tokenizer, left-padded with [PAD] (id 0) as fedray pads tokens."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(saved["gpt2"], local_files_only=True)
    tokenizer.padding_side = "left"
    encoded = tokenizer(["w3 w4 w5 w6 w7 w8 w9 w10 w11 w12 w13 w14", "w20 w21 w22 w49"], padding="max_length", max_length=SEQ)
    x = torch.tensor(encoded["input_ids"])
    assert x.shape == (2, SEQ) and x[1, :8].eq(0).all() and x[0].ge(3).all()
    return x


def _one_line(error: pytest.ExceptionInfo) -> str:
    message = error.value.detail
    assert "\n" not in message and not error.value.more, message
    return message


# ---------------------------------------------------------------------- the wrapped models


def test_a_causal_lm_maps_tokens_to_per_position_logits_as_transformers_does(saved):
    model = build_model(hf(saved["gpt2"]), tokens(), task=LM).eval()
    x = _batch(saved)
    features = model.encode(x)
    assert features.shape == (2, SEQ, HIDDEN) and model.feature_dim == HIDDEN
    assert model(x).shape == (2, SEQ, VOCAB)
    own = transformers.AutoModelForCausalLM.from_pretrained(saved["gpt2"], local_files_only=True).eval()
    torch.testing.assert_close(model(x), own(input_ids=x).logits)
    check_model_output(model, tokens(), "hf:gpt2", per_position=True)
    with pytest.raises(ValueError, match=r"fedray needs logits \[2, 50\]"):
        check_model_output(model, tokens(), "hf:gpt2")  # a classification task needs one vector per sample
    assert {key.split(".")[0] for key in model.state_dict()} == {"encoder", "classifier"}
    # the output layer is the input embedding (tied): in the layout once, under the embedding's name
    assert model.classifier.weight is model.encoder.transformer.wte.weight
    assert "classifier.weight" not in state_keys(model) and "encoder.transformer.wte.weight" in state_keys(model)
    total = sum(p.numel() for p in own.parameters())
    assert parameter_counts(model) == {"parameters_total": total, "parameters_uploaded": total} and num_flat_weights(model) == total


def test_a_sequence_classifier_loads_its_head_and_masks_the_padding(saved):
    model = build_model(hf(saved["bert"]), tokens(classes=3)).eval()
    x = _batch(saved)
    assert model(x).shape == (2, 3) and model.encode(x).shape == (2, HIDDEN)
    own = transformers.AutoModelForSequenceClassification.from_pretrained(saved["bert"], local_files_only=True).eval()
    mask = (x != 0).long()
    torch.testing.assert_close(model(x), own(input_ids=x, attention_mask=mask).logits)
    assert not torch.allclose(model(x)[1], own(input_ids=x).logits[1])  # the padded sentence: the mask matters
    check_model_output(model, tokens(classes=3), "hf:bert")


def test_a_language_model_directory_gets_a_new_head_for_classification(saved, caplog):
    model = build_model(hf(saved["gpt2"]), tokens(classes=4)).eval()
    x = _batch(saved)
    assert model(x).shape == (2, 4) and model.classifier_name == "score"
    check_model_output(model, tokens(classes=4), "hf:gpt2")
    assert not [record for record in caplog.records if "randomly initialised" in record.getMessage()]  # a new head is expected


# ---------------------------------------------------------------------- LoRA


def test_lora_leaves_only_the_adapters_in_the_layout(saved):
    """r·(in + out) adapter weights per target module (A is r × in, B is out × r), nothing else."""
    model = build_model(hf(saved["gpt2"], adapters=lora(rank=4, target_modules=["c_attn", "c_fc"])), tokens(), task=LM)
    adapters = 4 * (HIDDEN + 3 * HIDDEN) + 4 * (HIDDEN + INNER)
    assert num_flat_weights(model) == adapters == 576
    assert all(".lora_A." in key or ".lora_B." in key for key in state_keys(model)) and len(state_keys(model)) == 4
    plain = build_model(hf(saved["gpt2"]), tokens(), task=LM)
    assert parameter_counts(model) == {
        "parameters_total": parameter_counts(plain)["parameters_total"] + adapters,
        "parameters_uploaded": adapters,
    }
    assert "classifier.weight" in model.frozen_keys  # the tied output layer is frozen with the embedding
    with torch.device("meta"):  # the shapes-only build that parameter masks use has the same layout
        assert state_keys(build_model(hf(saved["gpt2"], adapters=lora(rank=4, target_modules=["c_attn", "c_fc"])), tokens(), task=LM)) == (
            state_keys(model)
        )
    assert state_keys(copy.deepcopy(model).requires_grad_(False)) == state_keys(model)


def test_lora_on_a_classifier_also_trains_its_new_head(saved):
    model = build_model(hf(saved["gpt2"], adapters=lora(rank=2, target_modules=["c_attn"])), tokens(classes=5))
    assert num_flat_weights(model) == 2 * (HIDDEN + 3 * HIDDEN) + 5 * HIDDEN
    assert state_keys(model)[-1] == "classifier.weight"


def test_local_training_moves_the_adapters_and_leaves_the_base_weights(saved):
    """FedAvg's client update, unchanged: it sets, trains and uploads the adapters only."""
    config = load_config(
        None, [f"model.name=hf:{saved['gpt2']}", "model.adapters={method: lora, rank: 4}", f"data.task={LM}", "train.lr=0.5"]
    )
    info = tokens()
    algorithm = get_algorithm_class("fedavg")(config, info)
    model = build_model(config.model, info, task=LM)
    base = {key: value.clone() for key, value in model.state_dict().items() if key in model.frozen_keys}
    assert base and not any("lora" in key for key in base)
    server = algorithm.init_server_state(model)
    generator = torch.Generator().manual_seed(0)
    x = torch.randint(0, VOCAB, (16, SEQ), generator=generator)
    ctx = ClientContext(
        client_id=0,
        round=1,
        model=model,
        x=x,
        y=torch.roll(x, -1, dims=1),
        info=info,
        train=config.train,
        lr=config.train.lr,
        device=torch.device("cpu"),
        generator=seed_client(0, 1, 0),
        augment=get_augmentation("none"),
    )
    update = algorithm.client_update(ctx, algorithm.broadcast(server, 1))
    assert update.sums["weights"].numel() == num_flat_weights(model) == server["weights"].numel()
    assert all(torch.equal(model.state_dict()[key], value) for key, value in base.items())
    assert not torch.equal(get_flat_weights(model), server["weights"])  # the adapters trained


def test_freezing_an_hf_models_parts_needs_no_init_file(saved):
    """Its weights come from the directory, the same on every worker; a new head does not."""
    model = build_model(hf(saved["gpt2"], freeze=["encoder.transformer.wte", "encoder.transformer.wpe"]), tokens(), task=LM)
    assert {"encoder.transformer.wte.weight", "encoder.transformer.wpe.weight", "classifier.weight"} == model.frozen_keys
    assert num_flat_weights(model) == parameter_counts(model)["parameters_total"] - VOCAB * HIDDEN - 64 * HIDDEN
    with pytest.raises(ConfigError) as error:
        build_model(hf(saved["gpt2"], freeze=["classifier"]), tokens(classes=4))
    assert _one_line(error).startswith("model.freeze: classifier.weight would keep a random initialisation")


# ---------------------------------------------------------------------- bad inputs: one line each


@pytest.mark.parametrize(
    ("keys", "info", "expected"),
    [
        ({"adapters": lora(target_modules=["q_proj"])}, tokens(), "model.adapters.target_modules: Target modules {{'q_proj'}} not found"),
        ({}, tokens(seq_len=80), "model.name: hf:{gpt2} takes sequences of at most 64 tokens, the data has 80 (data.seq_len)"),
        ({}, tokens(vocab=60), "model.name: hf:{gpt2} has a vocabulary of 50 tokens, the data 60"),
        ({}, DatasetInfo("digits", 10, 1, 8, (0.5,), (0.25,), "none"), "model.name: hf:{gpt2} takes token ids, not 1×8×8 images"),
        ({"classifier": "head"}, tokens(), "model.classifier: GPT2LMHeadModel has no submodule 'head'"),
    ],
    ids=["lora-target", "too-long", "vocabulary", "images", "classifier"],
)
def test_bad_inputs_are_one_line_naming_the_key(saved, keys, info, expected):
    with pytest.raises(ConfigError) as error:
        build_model(hf(saved["gpt2"], **keys), info, task=LM)
    assert _one_line(error).startswith(expected.format(gpt2=saved["gpt2"]))
    if "target_modules" in expected:
        assert "the model's layers include wte, wpe, c_attn, c_proj, c_fc" in error.value.detail


def test_a_directory_without_a_saved_model_is_refused(tmp_path):
    with pytest.raises(ConfigError) as error:
        build_model(ModelConfig(name=f"hf:{tmp_path}"), tokens())
    assert (
        _one_line(error) == f"model.name: hf:{tmp_path}: {tmp_path} is not a directory written by save_pretrained (it has no config.json)"
    )


def test_a_language_models_vocabulary_must_be_the_datas(saved):
    with pytest.raises(ConfigError) as error:
        build_model(hf(saved["gpt2"]), tokens(vocab=40), task=LM)
    assert _one_line(error).startswith(f"model.name: hf:{saved['gpt2']} predicts 50 tokens, the data's language model 40")


def test_a_run_checks_an_adapted_model_before_ray(saved, tmp_path):
    """prepare_data builds it (and a shapes-only one for the parameter mask) and checks its output."""
    overrides = ["data.name=pystdlib_chars", "data.seq_len=16", "data.max_train_samples=400", "data.num_clients=4"]
    config = load_config(
        None, [*overrides, "train.clients_per_round=2", f"model.name=hf:{saved['chars']}", "model.adapters={method: lora, rank: 2}"]
    )
    data = prepare_data(config)
    assert data.info.num_classes == 102


def test_a_missing_adapter_target_exits_2_with_one_line(saved, tmp_path):
    args = ["run", "--set", "data.name=pystdlib_chars", "--set", f"model.name=hf:{saved['chars']}"]
    result = run_fedray_preloaded([*args, "--set", "model.adapters={method: lora, target_modules: [nope]}"], tmp_path)
    assert_rejected(result, "model.adapters.target_modules: Target modules {'nope'} not found in the base model")


def test_importing_fedray_does_not_import_transformers():
    code = "import sys, fedray, fedray.models, fedray.models.hf; print(sorted({'transformers', 'peft'} & set(sys.modules)))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"
