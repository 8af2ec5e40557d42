"""Workload W1: fedray's overhead against a plain single-process PyTorch loop (scaling in the number
of registered clients is benchmarks/scale.py).

W1: digits (80/20 split), 1000 clients, Dirichlet α=0.5, 100 clients per round, 20 rounds,
CNN conv(1→16,3×3,pad 1)-ReLU-conv(16→32,3×3,pad 1)-ReLU-maxpool2-fc(512→64)-ReLU-fc(64→10)
(``cnn_small``), 1 local epoch, batch 16, SGD lr 0.05, global evaluation every round.

Both sides do the same client training on the same partition and cohorts, in the same invocation:
fedray on the local backend (one worker in this process, ``resources.backend: local``), on Ray with
one worker actor and on Ray with 2 worker actors (1 CPU each), and the plain loop in this process
with one torch thread (its fastest setting for this model; see run_plain). Steady state = median
seconds per round over rounds 3..19 (warm-up and the final checkpoint round left out), measured at
the driver. End to end = from the call to its return, the data's preparation (and Ray's start-up)
included, for fedray and for the plain loop alike; the plain loop and the local backend run
``--repeats`` times, alternating, and their median run is reported.

``--service`` compares instead, each side a fresh process timed from its spawn to its exit (the
clocks of benchmarks/startup.py), alternating, medians of ``--repeats``: the plain loop; ``fedray
run`` of W1 on Ray (``--service-workers`` workers) with the service of ``fedray up`` running, which
it joins; and the same ``fedray run`` starting its own Ray, as without a service. The service is
started once before (not timed) and stopped after; each side starts when none of its workers is
still booting, so the service refilling its warm workers after a run slows no other side.
Target (issue 46): the service's end to end <= 1.2x the plain loop's.

    python benchmarks/w1_overhead.py            # prints the table; --json FILE to save it
    python benchmarks/w1_overhead.py --service  # fedray run with `fedray up` against the plain loop
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from fedray import load_config
from fedray.config import RunConfig
from fedray.data import FederatedDataset, build_federated_dataset
from fedray.models import build_model, get_flat_weights, set_flat_weights
from fedray.seeding import sample_cohort
from fedray.tracking import Callback

W1 = [
    "data.name=digits",
    "data.test_fraction=0.2",
    "data.num_clients=1000",
    "data.partition=dirichlet",
    "data.alpha=0.5",
    "data.min_samples_per_client=1",
    "model.name=cnn_small",
    "algorithm.name=fedavg",
    "train.rounds=20",
    "train.clients_per_round=100",
    "train.local_epochs=1",
    "train.batch_size=16",
    "train.lr=0.05",
    "eval.every=1",
    "resources.cpus_per_worker=1",
    "checkpoint.every=1000",  # one checkpoint, at the end: the plain loop writes none
    "output.tensorboard=false",
    "output.plots=false",
]


class RoundClock(Callback):
    """Wall-clock seconds of each round as the driver sees them (callbacks included)."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self.ends: list[float] = []  # time.perf_counter() at the end of each round
        self._last = 0.0

    def on_run_start(self, run) -> None:
        self._last = time.perf_counter()

    def on_round_end(self, run, row, client_rows) -> None:
        now = time.perf_counter()
        self.seconds.append(now - self._last)
        self.ends.append(now)
        self._last = now


def steady(seconds: list[float], skip: int = 2) -> float:
    """Median seconds per round without the warm-up rounds and the last round (which writes the
    run's only checkpoint)."""
    return float(np.median(seconds[skip:-1]))


def run_fedray(overrides: list[str], out_dir: str) -> dict:
    from fedray.runtime import run_experiment  # Ray: imported here, so that run_plain's process never loads it

    config = load_config(None, overrides + [f"output.dir={out_dir}"])
    clock = RoundClock()
    started = time.perf_counter()
    summary = run_experiment(config, progress=False, extra_callbacks=[clock])
    return {
        "end_to_end_s": time.perf_counter() - started,
        "ray_startup_s": summary.ray_startup_seconds,
        "steady_round_s": steady(clock.seconds),
        "round_s": clock.seconds,
        "round_ends": clock.ends,
        "final_accuracy": summary.final_test_accuracy,
    }


@dataclass
class PlainWorkload:
    """A config's data and seeded initial model, held as the plain loop holds them (tensors on one device)."""

    config: RunConfig
    data: FederatedDataset
    x_train: torch.Tensor  # as stored (uint8 images): normalised per batch, as fedray's workers do
    y_train: torch.Tensor
    x_test: torch.Tensor  # normalised once
    y_test: torch.Tensor
    model: torch.nn.Module

    def client_data(self, client: int) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.from_numpy(self.data.clients.client(int(client))).to(self.x_train.device)
        return self.x_train[index], self.y_train[index]


def prepare_workload(overrides: list[str], device: str = "cpu") -> PlainWorkload:
    """The partition of fedray's data pipeline and the initial model drawn under ``seed`` (the same
    weights fedray starts from)."""
    config = load_config(None, overrides)
    data = build_federated_dataset(config.data, config.seed)
    x_train, y_train = torch.from_numpy(data.train.x.copy()).to(device), torch.from_numpy(data.train.y.copy()).to(device)
    x_test = data.info.normalize(torch.from_numpy(data.test.x.copy()).to(device))
    y_test = torch.from_numpy(data.test.y.copy()).to(device)
    torch.manual_seed(config.seed)
    model = build_model(config.model, data.info).to(device)
    return PlainWorkload(config, data, x_train, y_train, x_test, y_test, model)


def batch_order_generator(client: int, round: int) -> torch.Generator:
    """The plain loop's (and the peers', benchmarks/peers) draw of a client's batch order in a round."""
    return torch.Generator().manual_seed(int(client) * 1000 + round)


def train_client(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, workload: PlainWorkload, generator: torch.Generator) -> None:
    """``train.local_epochs`` of plain SGD (``train.lr``, ``train.batch_size``) on one client's data, in place."""
    train = workload.config.train
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=train.lr)
    for _ in range(train.local_epochs):
        order = torch.randperm(len(y), generator=generator).to(x.device)
        for start in range(0, len(y), train.batch_size):
            batch = order[start : start + train.batch_size]
            loss = F.cross_entropy(model(workload.data.info.normalize(x[batch])), y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


def evaluates_after(round: int, config: RunConfig) -> bool:
    """Whether the global model is scored after ``round`` (every ``eval.every`` rounds and after the last)."""
    return round % config.eval.every == 0 or round == config.train.rounds


def accuracy_on_test_set(model: torch.nn.Module, workload: PlainWorkload) -> float:
    model.eval()  # batch norm (W3's ResNets) evaluates with its running statistics
    with torch.no_grad():
        return float((model(workload.x_test).argmax(1) == workload.y_test).float().mean())


def run_plain(overrides: list[str], device: str = "cpu") -> dict:
    """The same client training as fedray's FedAvg, written as a plain PyTorch loop (on ``device``:
    the data is moved there once, as fedray's workers do)."""
    started_call = time.perf_counter()
    # One thread: on these tiny convolutions a second thread buys nothing, and an oversubscribed
    # OpenMP pool (any other process busy) makes every op wait (measured here: 30x slower).
    torch.set_num_threads(1)
    workload = prepare_workload(overrides, device)
    config, model = workload.config, workload.model
    global_weights = get_flat_weights(model)
    seconds, ends, accuracy = [], [], 0.0
    for round in range(1, config.train.rounds + 1):
        started = time.perf_counter()
        weighted_sum = torch.zeros_like(global_weights, dtype=torch.float64)
        total = 0
        for client in sample_cohort(config.seed, round, workload.data.num_clients, config.train.clients_per_round):
            x, y = workload.client_data(client)
            set_flat_weights(model, global_weights)
            train_client(model, x, y, workload, batch_order_generator(client, round))
            weighted_sum += get_flat_weights(model).double() * len(y)
            total += len(y)
        global_weights = (weighted_sum / total).float()
        set_flat_weights(model, global_weights)
        if evaluates_after(round, config):
            accuracy = accuracy_on_test_set(model, workload)
        if device != "cpu":
            torch.cuda.synchronize()  # the round ends when the device has done its work
        now = time.perf_counter()
        seconds.append(now - started)
        ends.append(now)
    return {
        "end_to_end_s": time.perf_counter() - started_call,
        "steady_round_s": steady(seconds),
        "round_s": seconds,
        "round_ends": ends,
        "final_accuracy": accuracy,
    }


def median_run(runs: list[dict]) -> dict:
    """The run whose end-to-end time is the median of ``runs`` (the first of the middle two for an even count)."""
    return sorted(runs, key=lambda run: run["end_to_end_s"])[(len(runs) - 1) // 2]


def wait_until_service_idle(service_dir: Path, timeout: float = 300) -> None:
    """Until none of the service's Ray workers is booting (the service refills its warm workers
    after each run; their imports would slow whatever runs next)."""
    from fedray.runtime.service import STATE_FILE, ServiceState, worker_processes

    state = ServiceState.read(service_dir / STATE_FILE)
    deadline = time.monotonic() + timeout
    while worker_processes(state.head_pid)["booting"] and time.monotonic() < deadline:
        time.sleep(0.5)


def compare_with_service(repeats: int, workers: int) -> dict:
    """End to end of the plain loop, of ``fedray run`` with the service up and of ``fedray run``
    starting its own Ray, each a fresh process (see the module's docstring)."""
    from timed_process import run_fedray_once, run_plain_once

    from fedray.runtime.service import SERVICE_DIR_VARIABLE

    overrides = W1 + ["resources.backend=ray", f"resources.num_workers={workers}"]
    runs: dict[str, list[dict]] = {"plain": [], "service": [], "own_ray": []}
    with tempfile.TemporaryDirectory() as scratch:
        service_dir, no_service_dir = Path(scratch) / "service", Path(scratch) / "no-service"
        cli = [sys.executable, "-m", "fedray.cli.main"]
        env = {**os.environ, SERVICE_DIR_VARIABLE: str(service_dir), "RAY_ADDRESS": ""}
        subprocess.run([*cli, "up", "--detach", "--results", scratch], env=env, check=True, stdout=subprocess.DEVNULL)
        try:
            for _ in range(repeats):  # alternating, so that a slower spell of the machine hits every side
                for side, directory in (("plain", service_dir), ("service", service_dir), ("own_ray", no_service_dir)):
                    wait_until_service_idle(service_dir)
                    os.environ[SERVICE_DIR_VARIABLE] = str(directory)
                    with tempfile.TemporaryDirectory() as run_scratch:
                        runs[side].append(run_plain_once(run_scratch) if side == "plain" else run_fedray_once(run_scratch, overrides))
        finally:
            subprocess.run([*cli, "down"], env=env, check=True, stdout=subprocess.DEVNULL)
    if {run["final_accuracy"] for run in runs["service"] + runs["own_ray"]} != {runs["service"][0]["final_accuracy"]}:
        print("note: the runs with and without the service disagree; they should be bit-identical")
    figures = {
        f"{side}_{name}_s": float(np.median([run[name] for run in results]))
        for side, results in runs.items()
        for name in ("first_round", "end_to_end")
    }
    figures["service_ray_startup_s"] = float(np.median([run["ray_startup"] for run in runs["service"]]))
    figures["own_ray_startup_s"] = float(np.median([run["ray_startup"] for run in runs["own_ray"]]))
    for side in ("service", "own_ray"):
        figures[f"ratio_{side}_end_to_end_over_plain"] = figures[f"{side}_end_to_end_s"] / figures["plain_end_to_end_s"]
    return {"figures": figures, "runs": runs}


def plain_child() -> None:
    """``--plain-child``, the plain loop's process timed by benchmarks/timed_process.py: W1 end to end,
    then its time to the first round on stdout."""
    from fedray.cli.run import seconds_since_process_start

    result = run_plain(W1)
    # The rounds run back to back and nothing follows the last: round 1 ended when the others began.
    first_round = seconds_since_process_start() - sum(result["round_s"][1:])
    print(json.dumps({"first_round_s": first_round, "final_accuracy": result["final_accuracy"]}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument("--repeats", type=int, default=3, help="runs of the plain loop and of the local backend, alternating")
    parser.add_argument("--service", action="store_true", help="compare fedray run with the service of `fedray up` with the plain loop")
    parser.add_argument("--service-workers", type=int, default=2, metavar="N", help="with --service: the runs' Ray workers (default 2)")
    parser.add_argument("--plain-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.plain_child:
        plain_child()
        return 0
    if args.service:
        result = compare_with_service(args.repeats, args.service_workers)
        width = max(map(len, result["figures"]))
        for name, value in result["figures"].items():
            print(f"{name:<{width}}  {value:.4f}")
        ratio = result["figures"]["ratio_service_end_to_end_over_plain"]
        print(f"target: ratio_service_end_to_end_over_plain <= 1.2 -> {'met' if ratio <= 1.2 else 'NOT met'}")
        if args.json:
            args.json.write_text(json.dumps(result, indent=2))
        return 0
    import ray

    with tempfile.TemporaryDirectory() as scratch:
        # Alternating, medians: whichever runs first in the process pays torch's one-time warm-up.
        plain_runs, local_runs = [], []
        for _ in range(args.repeats):
            plain_runs.append(run_plain(W1))
            local_runs.append(run_fedray(W1 + ["resources.backend=local", "resources.num_workers=1"], scratch))
        plain_w1, local_w1 = median_run(plain_runs), median_run(local_runs)
        ray1_w1 = run_fedray(
            W1 + ["resources.backend=ray", "resources.num_workers=1"], scratch
        )  # starts Ray: its start-up is measured here
        ray2_w1 = run_fedray(W1 + ["resources.backend=ray", "resources.num_workers=2"], scratch)
    ray.shutdown()
    if local_w1["final_accuracy"] != ray1_w1["final_accuracy"]:  # the same worker count: bit-identical by design
        print(f"note: local and Ray runs of one worker disagree: {local_w1['final_accuracy']} vs {ray1_w1['final_accuracy']}")

    figures = {
        "ray_startup_s": ray1_w1["ray_startup_s"],
        "plain_steady_round_s": plain_w1["steady_round_s"],
        "local_steady_round_s": local_w1["steady_round_s"],
        "ray1_steady_round_s": ray1_w1["steady_round_s"],
        "ray2_steady_round_s": ray2_w1["steady_round_s"],
        "ratio_ray2_steady_over_plain": ray2_w1["steady_round_s"] / plain_w1["steady_round_s"],
        "plain_end_to_end_s": plain_w1["end_to_end_s"],
        "local_end_to_end_s": local_w1["end_to_end_s"],
        "ray1_end_to_end_s": ray1_w1["end_to_end_s"],
        "ray2_end_to_end_s": ray2_w1["end_to_end_s"],
        "ratio_local_end_to_end_over_plain": local_w1["end_to_end_s"] / plain_w1["end_to_end_s"],
        "ratio_ray1_end_to_end_over_plain": ray1_w1["end_to_end_s"] / plain_w1["end_to_end_s"],
        "ratio_ray2_end_to_end_over_plain": ray2_w1["end_to_end_s"] / plain_w1["end_to_end_s"],
        "local_final_accuracy": local_w1["final_accuracy"],
        "ray2_final_accuracy": ray2_w1["final_accuracy"],
        "plain_final_accuracy": plain_w1["final_accuracy"],
    }
    width = max(map(len, figures))
    for name, value in figures.items():
        print(f"{name:<{width}}  {value:.4f}")
    ratio = figures["ratio_local_end_to_end_over_plain"]
    print(f"target: ratio_local_end_to_end_over_plain <= 1.1 -> {'met' if ratio <= 1.1 else 'NOT met'}")
    if args.json:
        rounds = {
            f"{name}_round_s": run["round_s"]
            for name, run in (("plain", plain_w1), ("local", local_w1), ("ray1", ray1_w1), ("ray2", ray2_w1))
        }
        args.json.write_text(json.dumps({**figures, **rounds}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
