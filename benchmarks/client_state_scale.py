"""Client state at scale: a stateful algorithm (FedPer) with many registered clients, its state on
local disk and on S3, against the stateless baseline (FedAvg), in one invocation.

Runs (one local Ray, 2 worker actors of 1 CPU): ``synthetic`` 1×8×8 data, 10 classes, ``--clients``
registered clients with 2 samples each (IID), ``--per-round`` clients per round, ``--rounds``
rounds, ``cnn_small``, 1 local epoch, evaluation and one checkpoint at the last round:

1. ``fedavg``: the stateless baseline;
2. ``fedper``, client state on local disk (``<run dir>/client_state``);
3. ``fedper``, client state on S3 (moto's S3 server on 127.0.0.1; skipped without ``moto[server]``).

Per-round time is the median of rounds 2..R-1 at the driver; the cost per stateful client per round
is (FedPer − FedAvg) / clients per round. With many registered clients a client rarely returns
before the workers' caches (256 states each) have evicted it, so a client's round is in general: read
its state from storage, train, write the new version, list its versions and delete the superseded
one. The store part measures exactly that on ``--store-clients`` clients (first write, then a
returning client's read + write + prune) for both stores, without training. ``--fill`` writes one
state for every registered client to a local store, to measure the disk it really takes.

    nice -n 10 python benchmarks/client_state_scale.py --clients 10000 --fill --json benchmarks/results/client_state.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.fs as pafs
import ray
import torch

sys.path.insert(0, str(Path(__file__).parent))
from scale import workload as scale_workload  # noqa: E402
from w1_overhead import RoundClock, steady  # noqa: E402

from fedray import load_config  # noqa: E402
from fedray.runtime import run_experiment  # noqa: E402
from fedray.runtime.state_store import ClientStateStore, client_state_location, open_location  # noqa: E402


# FedPer is personalised: it requires per-client test splits (evaluated with the others, in the last round only).
PERSONALISED = ["data.client_test_fraction=0.25", "eval.personalized=true"]


def workload(clients: int, per_round: int, rounds: int) -> list[str]:
    return scale_workload(clients, per_round, rounds) + [f"eval.every={rounds}", "checkpoint.every=1000"]


def store_size(location: str) -> tuple[int, int]:
    """(files, bytes) of the ``.pt`` files under a store location."""
    filesystem, root = open_location(location)
    infos = filesystem.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    sizes = [info.size for info in infos if info.base_name.endswith(".pt")]
    return len(sizes), sum(sizes)


def run(overrides: list[str], out_dir: str, name: str) -> dict:
    config = load_config(None, overrides + [f"output.dir={out_dir}", f"output.name={name}"])
    clock = RoundClock()
    summary = run_experiment(config, progress=False, extra_callbacks=[clock])
    result = {"round_s": clock.seconds, "steady_round_s": steady(clock.seconds, skip=1), "ray_startup_s": summary.ray_startup_seconds}
    if config.algorithm.name != "fedavg":
        files, size = store_size(client_state_location(config.output, Path(summary.run_dir)))
        result |= {"state_files": files, "state_bytes": size}
    return result


def store_costs(location: str, clients: int, state: dict[str, torch.Tensor]) -> dict:
    """Milliseconds per client: the first write, and a returning client (a fresh store, as on
    another worker: read from storage, write the next version, prune the old one)."""
    writer = ClientStateStore(location)
    started = time.perf_counter()
    for client in range(clients):
        writer.save(client, 1, state, keep=())
    first_write = time.perf_counter() - started
    returning = ClientStateStore(location)
    started = time.perf_counter()
    for client in range(clients):
        loaded = returning.load(client, 1, torch.device("cpu"))
        returning.save(client, 2, loaded, keep=())
    round_trip = time.perf_counter() - started
    return {"first_write_ms": 1000 * first_write / clients, "returning_client_ms": 1000 * round_trip / clients}


def du_bytes(path: Path) -> tuple[int, int]:
    """(apparent bytes, bytes of disk blocks used) of a directory tree."""

    def du(*flags: str) -> int:
        return int(subprocess.run(["du", "-s", *flags, str(path)], capture_output=True, text=True, check=True).stdout.split()[0])

    return du("-b"), du("-B1")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=10_000, help="registered clients (default 10,000)")
    parser.add_argument("--per-round", type=int, default=100, help="clients per round (default 100)")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--store-clients", type=int, default=300, help="clients of the store-only measurement")
    parser.add_argument("--fill", action="store_true", help="write a state for every registered client to a local store (disk size)")
    parser.add_argument("--no-s3", action="store_true", help="skip the S3 (moto) store")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)

    use_s3 = not args.no_s3
    try:
        import moto.server  # noqa: F401
    except ImportError:
        print("moto[server] is not installed: the S3 store is skipped", file=sys.stderr)
        use_s3 = False
    from fedray.testing.s3 import LocalS3

    if use_s3:
        LocalS3.export_credentials()  # before Ray starts: its workers read them
    figures: dict = {"clients": args.clients, "per_round": args.per_round, "rounds": args.rounds}
    base = workload(args.clients, args.per_round, args.rounds)
    with tempfile.TemporaryDirectory() as scratch:
        s3 = LocalS3(scratch).start() if use_s3 else None
        figures["fedavg"] = run(base + ["algorithm.name=fedavg"], scratch, "fedavg")
        fedper = base + ["algorithm.name=fedper", *PERSONALISED]
        figures["fedper_local"] = run(fedper, scratch, "fedper-local")
        if s3 is not None:
            figures["fedper_s3"] = run(fedper + [f"output.client_state_dir={s3.uri('state')}"], scratch, "fedper-s3")
        ray.shutdown()

        local_run = Path(scratch, "fedper-local")
        state_file = next((local_run / "client_state").rglob("*.pt"))
        figures["state_file_bytes"] = state_file.stat().st_size
        state = ClientStateStore(local_run / "client_state").load(
            int(state_file.parent.name), int(state_file.stem[1:]), torch.device("cpu")
        )
        figures["state_tensor_bytes"] = sum(t.numel() * t.element_size() for t in state.values())
        figures["store_local"] = store_costs(str(Path(scratch, "store-local")), args.store_clients, state)
        if s3 is not None:
            figures["store_s3"] = store_costs(s3.uri("store"), args.store_clients, state)
            s3.stop()
        if args.fill:
            filled = Path(scratch, "filled")
            store = ClientStateStore(filled)
            started = time.perf_counter()
            for client in range(args.clients):
                store.save(client, 1, state, keep=())
            apparent, on_disk = du_bytes(filled)
            figures["fill"] = {"seconds": time.perf_counter() - started, "apparent_bytes": apparent, "disk_bytes": on_disk}
            shutil.rmtree(filled)

    baseline = figures["fedavg"]["steady_round_s"]
    for key in ("fedper_local", "fedper_s3"):
        if key in figures:
            figures[key]["ms_per_stateful_client_round"] = 1000 * (figures[key]["steady_round_s"] - baseline) / args.per_round
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
