"""Federated LoRA fine-tuning, end to end and offline: write a tiny GPT-2 with ``save_pretrained``, then
run ``examples/lora_stdlib.yaml`` on it (``model.name: hf:runs/tiny-gpt2``, ``model.adapters.method:
lora``).

The GPT-2 is randomly initialised: it stands in for a pretrained checkpoint, which this machine cannot
download. Its vocabulary is the corpus's (the characters of ``pystdlib_chars``), so the model's logits
cover exactly the data's token ids. Usage::

    python examples/lora_tiny_gpt2.py [--set KEY=VALUE ...]      # e.g. --set train.rounds=3
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import transformers
import yaml

import fedray
from fedray.config import DataConfig
from fedray.data import build_federated_dataset

EXAMPLE = Path(__file__).with_name("lora_stdlib.yaml")


def save_tiny_gpt2(directory: Path, vocab_size: int, positions: int) -> None:
    """A 2-layer, 64-wide GPT-2 (about 110k parameters with a 100-character vocabulary), seeded."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=vocab_size, n_positions=positions, n_layer=2, n_head=2, n_embd=64, bos_token_id=0, eos_token_id=0
    )
    transformers.GPT2LMHeadModel(config).save_pretrained(directory)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override, as fedray run --set")
    args = parser.parse_args()
    raw = yaml.safe_load(EXAMPLE.read_text())
    directory = Path(raw["model"]["name"].removeprefix("hf:"))
    if not (directory / "config.json").is_file():  # the model's vocabulary and positions are the data's
        info = build_federated_dataset(DataConfig.model_validate(raw["data"]), raw["seed"]).info
        save_tiny_gpt2(directory, vocab_size=info.num_classes, positions=info.seq_len)
        print(f"wrote a tiny GPT-2 to {directory}")
    summary = fedray.run_experiment(fedray.load_config(EXAMPLE, args.set))
    print(f"{summary.headline}: {summary.final_headline:.3f} after {summary.rounds} rounds; run directory {summary.run_dir}")


if __name__ == "__main__":
    main()
