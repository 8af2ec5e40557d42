"""Tasks beyond classification (issue "Any task, any model"), two measurements in one invocation:

1. **Overhead on each task** against a plain single-process PyTorch loop on the same data: a regression
   (scikit-learn's diabetes table, ``mlp``, MSE on the standardised target) and language modelling
   (the stdlib corpus, ``char_lstm``, next-character cross-entropy at every position). Both sides do
   the same client training (same partition, cohorts, initial weights, SGD, batch size and epochs)
   in this process; fedray on its local backend (one worker). Steady state = median seconds per round
   over rounds 3..R-1; the two sides alternate ``--repeats`` times and each side's median run is kept.
   The plain loop's batch order is its own draw, so its RMSE/perplexity is close to fedray's, not equal.
2. **LoRA against full fine-tuning** of the same tiny GPT-2 (2 layers, 64 wide, written here with
   ``save_pretrained``: a random stand-in for a pretrained checkpoint) on the stdlib corpus with
   FedAvg: bytes uploaded per round (``systems.enabled``: the systems model counts them), parameters
   uploaded, and the test perplexity after ``--lora-rounds`` rounds.

Raw output (commit, torch, machine, load, date) goes to ``docs/results/raw/tasks_cpu.json``; the
table in docs/benchmarks.md ("Tasks") is printed by ``--table`` from that file::

    python benchmarks/tasks_table.py                 # measure (about 10 minutes on 2 cores) and write the JSON
    python benchmarks/tasks_table.py --table         # the Markdown table from the committed JSON
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
import transformers

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
from vectorized import machine  # noqa: E402
from w1_overhead import RoundClock, steady  # noqa: E402

import fedray  # noqa: E402
from fedray.data import build_federated_dataset  # noqa: E402
from fedray.models import build_model, get_flat_weights, set_flat_weights  # noqa: E402
from fedray.seeding import sample_cohort  # noqa: E402
from fedray.tasks import IGNORE_INDEX  # noqa: E402

DEFAULT_JSON = REPO / "docs" / "results" / "raw" / "tasks_cpu.json"
COMMON = [
    "resources.backend=local",
    "resources.num_workers=1",
    "checkpoint.every=1000",
    "output.tensorboard=false",
    "output.plots=false",
    "train.optimizer=sgd",
]
WORKLOADS = {
    "regression (diabetes, mlp)": [
        f"{REPO}/examples/regression_diabetes.yaml",
        "data.partition=iid",
        "data.num_clients=20",
        "train.clients_per_round=10",
        "train.rounds=12",
        "train.local_epochs=1",
    ],
    "language modelling (stdlib, char_lstm)": [
        f"{REPO}/examples/lm_stdlib.yaml",
        "data.max_samples_per_client=10",
        "data.seq_len=32",
        "train.clients_per_round=10",
        "train.rounds=8",
        "train.lr=0.5",
    ],
}
LORA = [
    "data.max_samples_per_client=20",
    "data.seq_len=32",
    "train.clients_per_round=8",
    "systems.enabled=true",
]


def load(workload: list[str]) -> fedray.RunConfig:
    return fedray.load_config(workload[0], [*COMMON, *workload[1:]])


def run_fedray(config: fedray.RunConfig, out_dir: str) -> dict:
    clock = RoundClock()
    summary = fedray.run_experiment(
        config.model_copy(update={"output": config.output.model_copy(update={"dir": out_dir})}), progress=False, extra_callbacks=[clock]
    )
    last = fedray.read_metrics(summary.run_dir)[-1]
    return {
        "steady_round_s": steady(clock.seconds),
        "headline": summary.headline,
        "final": summary.final_headline,
        "bytes_up": last.get("bytes_up"),
    }


def plain_loss(config: fedray.RunConfig, info) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The task's loss written out in plain PyTorch: MSE on the standardised target, or next-token CE."""
    if config.data.task == "regression":
        mean, std = torch.tensor(info.target_mean), torch.tensor(info.target_std)
        return lambda output, y: F.mse_loss(output, (y - mean) / std)
    return lambda output, y: F.cross_entropy(output.flatten(0, 1), y.flatten(), ignore_index=IGNORE_INDEX)


def plain_metric(config: fedray.RunConfig, info, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """RMSE in the target's units, or perplexity, of ``model`` on the test split."""
    model.eval()
    with torch.no_grad():
        output = model(info.normalize(x))
        if config.data.task == "regression":
            prediction = output * torch.tensor(info.target_std) + torch.tensor(info.target_mean)
            return float(((prediction - y) ** 2).mean().sqrt())
        return float(torch.exp(F.cross_entropy(output.flatten(0, 1), y.flatten(), ignore_index=IGNORE_INDEX)))


def run_plain(config: fedray.RunConfig) -> dict:
    """FedAvg as a plain loop: each cohort client trains the global weights with SGD, the server
    averages by sample count."""
    torch.set_num_threads(1)
    data = build_federated_dataset(config.data, config.seed)
    info, train = data.info, config.train
    x, y = torch.from_numpy(data.train.x.copy()), torch.from_numpy(data.train.y.copy())
    torch.manual_seed(config.seed)
    model = build_model(config.model, info, config.data.task)
    loss_fn = plain_loss(config, info)
    weights = get_flat_weights(model)
    seconds = []
    for round in range(1, train.rounds + 1):
        started = time.perf_counter()
        total, count = torch.zeros_like(weights, dtype=torch.float64), 0
        for client in sample_cohort(config.seed, round, data.num_clients, train.clients_per_round):
            index = torch.from_numpy(data.clients.client(int(client)))
            cx, cy = x[index], y[index]
            set_flat_weights(model, weights)
            model.train()
            optimizer = torch.optim.SGD(model.parameters(), lr=train.lr)
            generator = torch.Generator().manual_seed(int(client) * 1000 + round)
            for _ in range(train.local_epochs):
                order = torch.randperm(len(cy), generator=generator)
                for start in range(0, len(cy), train.batch_size):
                    batch = order[start : start + train.batch_size]
                    loss = loss_fn(model(info.normalize(cx[batch])), cy[batch])
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
            total += get_flat_weights(model).double() * len(cy)
            count += len(cy)
        weights = (total / count).float()
        set_flat_weights(model, weights)
        final = plain_metric(config, info, model, torch.from_numpy(data.test.x.copy()), torch.from_numpy(data.test.y.copy()))
        seconds.append(time.perf_counter() - started)
    return {"steady_round_s": steady(seconds), "final": final}


def median_side(runs: list[dict]) -> dict:
    return sorted(runs, key=lambda run: run["steady_round_s"])[len(runs) // 2]


def overhead(repeats: int) -> dict:
    results = {}
    for name, workload in WORKLOADS.items():
        config = load(workload)
        sides: dict[str, list[dict]] = {"fedray": [], "plain": []}
        for _ in range(repeats):
            with tempfile.TemporaryDirectory() as out_dir:
                sides["fedray"].append(run_fedray(config, out_dir))
            sides["plain"].append(run_plain(config))
        fedray_side, plain_side = median_side(sides["fedray"]), median_side(sides["plain"])
        results[name] = {
            "overrides": workload,
            "fedray": fedray_side,
            "plain": plain_side,
            "ratio": fedray_side["steady_round_s"] / plain_side["steady_round_s"],
        }
        print(f"{name}: fedray {fedray_side['steady_round_s']:.3f} s/round, plain {plain_side['steady_round_s']:.3f} s/round", flush=True)
    return results


def lora_against_full(rounds: int) -> dict:
    with tempfile.TemporaryDirectory() as root:
        model_dir = Path(root) / "gpt2"
        base = fedray.load_config(REPO / "examples" / "lm_stdlib.yaml", LORA)
        info = build_federated_dataset(base.data, base.seed).info
        torch.manual_seed(0)
        gpt2 = transformers.GPT2Config(
            vocab_size=info.num_classes, n_positions=info.seq_len, n_layer=2, n_head=2, n_embd=64, bos_token_id=0, eos_token_id=0
        )
        transformers.GPT2LMHeadModel(gpt2).save_pretrained(model_dir)
        results = {}
        for name, adapters in (("LoRA r=8 on c_attn", []), ("full fine-tuning", ["model.adapters.method=none"])):
            overrides = [*COMMON[:-1], *LORA, f"model.name=hf:{model_dir}", f"train.rounds={rounds}", *adapters]
            config = fedray.load_config(REPO / "examples" / "lora_stdlib.yaml", overrides)
            run = run_fedray(config, root)
            info_file = json.loads(next(Path(root).glob("fedavg-*/run_info.json")).read_text())
            for stale in Path(root).glob("fedavg-*"):  # the next run's run_info.json is then the only one
                stale.rename(Path(root) / f"done-{name.split()[0]}")
            results[name] = {
                "overrides": overrides[len(COMMON) - 1 :],
                **run,
                "bytes_up_per_round": run["bytes_up"],
                "parameters_total": info_file["parameters_total"],
                "parameters_uploaded": info_file["parameters_uploaded"],
            }
            print(f"{name}: perplexity {run['final']:.2f}, {run['bytes_up']:,} bytes up in the last round", flush=True)
    return results


def table(report: dict) -> str:
    lines = [
        "| workload | fedray s/round | plain loop s/round | ratio | fedray final | plain final |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in report["overhead"].items():
        headline = row["fedray"]["headline"].removeprefix("test_")
        lines.append(
            f"| {name} | {row['fedray']['steady_round_s']:.3f} | {row['plain']['steady_round_s']:.3f} | {row['ratio']:.2f} | "
            f"{headline} {row['fedray']['final']:.2f} | {headline} {row['plain']['final']:.2f} |"
        )
    lines += ["", "| tiny GPT-2, FedAvg | parameters uploaded | bytes up per round | test perplexity |", "|---|---|---|---|"]
    for name, row in report["lora"].items():
        lines.append(
            f"| {name} | {row['parameters_uploaded']:,} of {row['parameters_total']:,} | {row['bytes_up_per_round']:,.0f} | {row['final']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--lora-rounds", type=int, default=10)
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    parser.add_argument("--table", action="store_true", help="print the Markdown table of --json and measure nothing")
    args = parser.parse_args(argv)
    if args.table:
        print(table(json.loads(args.json.read_text())))
        return 0
    report = {**machine(), "repeats": args.repeats, "overhead": overhead(args.repeats), "lora": lora_against_full(args.lora_rounds)}
    report["load_average_at_end"] = list(np.round(__import__("os").getloadavg(), 2))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(table(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
