"""The dashboard server under load (issue 42, item 9): a run directory with a multi-million-row
client metrics Parquet and a large figure, served by a real ``DashboardServer`` in its own process,
and three loads, one after the other:

1. ``--idle`` connections opened and left silent, then one normal request (``/api/version``): its
   latency while they are open;
2. one ``GET /api/run`` of the run (the run view: curves, per-client values), then ``--readers`` at once;
3. ``--downloads`` concurrent downloads of its ``partition.png`` (``--download-mb`` MB).

Each load gets a freshly started server, which answers ``/api/overview`` first (as the page does:
the run's metrics are read then). Measured: the server's resident memory (``/proc/<pid>/status``:
before the load, and the peak during it, sampled every 20 ms), each load's
wall time, and ``/api/run``'s response size. A server whose
resident memory passes ``--memory-cap-gb`` is killed (so that measuring an unbounded server cannot
exhaust the machine) and the load is reported as having passed the cap.

``--pythonpath DIR`` runs the server from another copy of the package (e.g. the code before a change,
copied to ``/tmp/before/fedray``), so that both are measured on the same data in the same way:

    python benchmarks/dashboard_load.py --data /tmp/dashboard_load --pythonpath /tmp/before --json before.json
    python benchmarks/dashboard_load.py --data /tmp/dashboard_load --json after.json
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
CLIENT_METRICS = ("train_loss", "train_accuracy", "num_samples", "seconds", "update_norm")


def build_run(directory: Path, rows: int, rounds: int, download_mb: int) -> Path:
    """A run directory ``directory/run`` (written once; kept between invocations): ``config.yaml``,
    ``summary.json``, a ``metrics.parquet`` of ``rounds`` round rows and ``rows`` client rows
    (``rows // rounds`` clients per round, random values) and a ``partition.png`` of ``download_mb`` MB."""
    run_dir = directory / "run"
    stamp = run_dir / ".built"
    wanted = f"{rows} {rounds} {download_mb}"
    if stamp.is_file() and stamp.read_text() == wanted:
        return run_dir
    sys.path.insert(0, str(REPO))
    from fedray import load_config
    from fedray.config import save_config
    from fedray.tracking.metrics_file import METRICS_FILE

    run_dir.mkdir(parents=True, exist_ok=True)
    save_config(load_config(None, [f"train.rounds={rounds}"]), run_dir / "config.yaml")
    (run_dir / "summary.json").write_text(json.dumps({"rounds": rounds, "seconds": 1.0}))
    clients = rows // rounds
    generator = np.random.default_rng(0)
    schema = pa.schema(
        [("scope", pa.string()), ("client_id", pa.int64()), ("round", pa.int64()), ("test_accuracy", pa.float64())]
        + [(name, pa.float64()) for name in CLIENT_METRICS]
    )
    with pq.ParquetWriter(run_dir / METRICS_FILE, schema) as writer:
        for first in range(1, rounds + 1, 50):  # the engine's compaction writes parts of consecutive rounds
            batch = range(first, min(first + 50, rounds + 1))
            count = len(batch) * clients
            round_of = np.repeat(np.array(batch), clients)
            columns = {
                "scope": ["round"] * len(batch) + ["client"] * count,
                "client_id": [None] * len(batch) + np.tile(np.arange(clients), len(batch)).tolist(),
                "round": np.concatenate([np.array(batch), round_of]),
                "test_accuracy": np.concatenate([np.linspace(0.1, 0.9, rounds)[np.array(batch) - 1], np.full(count, np.nan)]),
            }
            for name in CLIENT_METRICS:
                columns[name] = np.concatenate([generator.random(len(batch)), generator.random(count)])
            writer.write_table(pa.table(columns, schema=schema))
    with open(run_dir / "partition.png", "wb") as figure:
        block = generator.bytes(1 << 20)
        for _ in range(download_mb):
            figure.write(block)
    stamp.write_text(wanted)
    return run_dir


class Server:
    """The dashboard server in a child process, with a thread sampling its resident memory."""

    def __init__(self, folder: Path, pythonpath: str | None, memory_cap: float) -> None:
        # -P below: the current directory's fedray must not shadow the one on --pythonpath
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [pythonpath, str(REPO)]))}
        code = (
            "import sys\nfrom fedray.dashboard import DashboardServer\n"
            "server = DashboardServer(sys.argv[1], port=0)\nprint(server.server_address[1], flush=True)\nserver.serve_forever()\n"
        )
        self.process = subprocess.Popen(
            [sys.executable, "-P", "-c", code, str(folder)], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        self.port = int(self.process.stdout.readline())
        self.memory_cap = memory_cap
        self.peak = self.rss()
        self.capped = False
        self._stop = threading.Event()
        threading.Thread(target=self._sample, daemon=True).start()

    def rss(self) -> float:
        """Resident memory in bytes (0 once the process is gone)."""
        try:
            for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return float(line.split()[1]) * 1024
        except OSError:
            pass
        return 0.0

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            rss = self.rss()
            self.peak = max(self.peak, rss)
            if rss > self.memory_cap and not self.capped:
                self.capped = True
                self.process.kill()

    def reset_peak(self) -> None:
        self.peak = self.rss()

    def stop(self) -> None:
        self._stop.set()
        self.process.kill()
        self.process.wait()


def get(port: int, target: str, timeout: float = 600) -> tuple[int, int, float]:
    """(status, body bytes, seconds) of one GET, reading the body in 1 MB chunks."""
    started = time.perf_counter()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request("GET", target, headers={"Host": f"127.0.0.1:{port}"})
        response = connection.getresponse()
        size = 0
        while chunk := response.read(1 << 20):
            size += len(chunk)
        return response.status, size, time.perf_counter() - started
    finally:
        connection.close()


def concurrently(port: int, target: str, count: int) -> list[tuple[int, int, float] | str]:
    def one(_: int) -> tuple[int, int, float] | str:
        try:
            return get(port, target)
        except OSError as error:
            return f"{type(error).__name__}: {error}"

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(one, range(count)))


def load(run_dir: Path, args: argparse.Namespace, name: str, action) -> dict:
    """Start a server, run ``action(port)``, report, stop the server."""
    server = Server(run_dir, args.pythonpath, args.memory_cap_gb * 1e9)
    try:
        get(server.port, "/api/overview")  # what the page asks first: the metrics are read before the load
        server.reset_peak()
        before = server.rss()
        started = time.perf_counter()
        result = action(server.port)
        seconds = time.perf_counter() - started
        time.sleep(0.1)
    finally:
        server.stop()
    report = {
        "load": name,
        "seconds": round(seconds, 2),
        "rss_before_mb": round(before / 1e6),
        "rss_peak_mb": round(server.peak / 1e6),
        "passed_memory_cap": server.capped,
        **result,
    }
    print(json.dumps(report), flush=True)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="where the run directory is built (and kept)")
    parser.add_argument("--rows", type=int, default=4_000_000, help="client rows in metrics.parquet")
    parser.add_argument("--rounds", type=int, default=400)
    parser.add_argument("--readers", type=int, default=50)
    parser.add_argument("--downloads", type=int, default=8)
    parser.add_argument("--download-mb", type=int, default=200)
    parser.add_argument("--idle", type=int, default=32)
    parser.add_argument("--memory-cap-gb", type=float, default=6.0)
    parser.add_argument("--pythonpath", help="a directory holding the fedray package to serve with (default: this checkout)")
    parser.add_argument("--json", type=Path, help="write the reports here")
    args = parser.parse_args()

    run_dir = build_run(args.data, args.rows, args.rounds, args.download_mb)
    metrics_mb = (run_dir / "metrics.parquet").stat().st_size / 1e6
    print(f"run: {args.rows:,} client rows, {args.rounds} rounds, metrics.parquet {metrics_mb:.0f} MB", flush=True)
    trial = run_dir.name

    def idle_then_request(port: int) -> dict:
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(args.idle)]
        try:
            time.sleep(0.5)  # the server has accepted them
            status, _, seconds = get(port, "/api/version")
        finally:
            for connection in idle:
                connection.close()
        return {"idle_connections": args.idle, "status": status, "request_seconds": round(seconds, 3)}

    def readers(port: int) -> dict:
        """One reader alone (its response's size and time), then ``--readers`` at once."""
        _, alone_bytes, alone_seconds = get(port, f"/api/run?trial={trial}")
        results = concurrently(port, f"/api/run?trial={trial}", args.readers)
        answered = [r for r in results if not isinstance(r, str)]
        return {
            "alone_response_bytes": alone_bytes,
            "alone_seconds": round(alone_seconds, 2),
            "readers": args.readers,
            "ok": sum(1 for r in answered if r[0] == 200),
            "response_bytes": max((r[1] for r in answered), default=0),
            "slowest_seconds": round(max((r[2] for r in answered), default=0.0), 2),
            "errors": sorted({r for r in results if isinstance(r, str)})[:3],
        }

    def downloads(port: int) -> dict:
        results = concurrently(port, f"/api/file?trial={trial}&name=partition.png", args.downloads)
        answered = [r for r in results if not isinstance(r, str)]
        return {
            "downloads": args.downloads,
            "ok": sum(1 for r in answered if r[0] == 200 and r[1] == args.download_mb << 20),
            "errors": sorted({r for r in results if isinstance(r, str)})[:3],
        }

    reports = [
        load(run_dir, args, name, action) for name, action in (("idle", idle_then_request), ("readers", readers), ("downloads", downloads))
    ]
    if args.json:
        args.json.write_text(json.dumps({"rows": args.rows, "rounds": args.rounds, "metrics_mb": metrics_mb, "loads": reports}, indent=2))


if __name__ == "__main__":
    main()
