"""The systems model at scale: its cost per round and its driver memory with 1,000,000 registered
clients and 1,000 a round, availability on, side by side with the same federation without it.

Both federations run in this process on the local pool (one worker; the engine and workers are the
same code a Ray run uses), on one dataset (scale.py's workload: synthetic 1×8×8, 2 samples a client,
``cnn_small``, 1 local epoch, evaluated every round). With the systems model: log-normal devices,
Bernoulli availability 0.8, over-selection 1.3 and 10 % dropout, so both train 1,000 clients a round.
Reported:

- the median round time of rounds 2..R without and with the systems model, and their ratio;
- the systems model's own time per round (``plan_round``: availability of every client, the draw
  among the online, durations, dropouts; and ``finish_round``), timed directly;
- the memory of the systems model's arrays (tracemalloc while it is built) and the process's peak RSS.

    nice -n 10 python benchmarks/systems_scale.py --clients 1000000 --per-round 1000 --rounds 4
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from statistics import median

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from scale import peak_rss, workload  # noqa: E402

from fedray.data import build_federated_dataset  # noqa: E402
from fedray.plugins import load_config  # noqa: E402
from fedray.runtime.engine import RoundEngine  # noqa: E402
from fedray.runtime.pool import LocalPool  # noqa: E402
from fedray.systems import SystemsModel  # noqa: E402

SYSTEMS = [
    "systems.enabled=true",
    "systems.availability.process=bernoulli",
    "systems.availability.probability=0.8",
    "systems.selection.over_selection=1.3",
    "systems.selection.dropout=0.1",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=1_000_000)
    parser.add_argument("--per-round", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()

    base = [*workload(args.clients, args.per_round, args.rounds), "resources.num_workers=1"]
    off_config, on_config = load_config(None, base), load_config(None, [*base, *SYSTEMS])
    started = time.perf_counter()
    data = build_federated_dataset(off_config.data, off_config.seed)
    print(f"data: {args.clients:,} clients in {time.perf_counter() - started:.1f} s", flush=True)

    tracemalloc.start()
    systems = SystemsModel(on_config, data.clients.sizes, np.ones(args.clients))
    systems_bytes = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del systems

    with tempfile.TemporaryDirectory() as run_dir:
        engines = {
            name: RoundEngine(config, data, run_dir, LocalPool(config, data, run_dir))
            for name, config in (("off", off_config), ("on", on_config))
        }
        seconds: dict[str, list[float]] = {"off": [], "on": []}
        systems_seconds: list[float] = []
        for round in range(1, args.rounds + 1):
            for name, engine in engines.items():  # side by side, alternating, so that load on the machine hits both alike
                started = time.perf_counter()
                row = engine.run_round(round)["round"]
                seconds[name].append(time.perf_counter() - started)
                print(
                    f"round {round} {name}: {seconds[name][-1]:.2f} s, {row['clients']} clients trained"
                    + (f", selected {row['selected']}, dropped {row['dropped']}, late {row['late']}" if name == "on" else ""),
                    flush=True,
                )
            systems = engines["on"].systems
            clock = systems.clock
            started = time.perf_counter()
            plan = systems.plan_round(round + 1, engines["on"].broadcast_bytes)
            systems_seconds.append(time.perf_counter() - started)
            assert systems.clock == clock and len(plan.reporting) > 0

    off, on = median(seconds["off"][1:]), median(seconds["on"][1:])
    figures = {
        "clients": args.clients,
        "per_round": args.per_round,
        "round_seconds_off": off,
        "round_seconds_on": on,
        "ratio_on_off": on / off,
        "systems_plan_seconds": median(systems_seconds),
        "systems_plan_share_of_round": median(systems_seconds) / on,
        "systems_model_mib": systems_bytes / 2**20,
        "peak_rss_gib": peak_rss() / 2**30,
    }
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
