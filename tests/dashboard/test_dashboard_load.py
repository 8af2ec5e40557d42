"""The dashboard serving large runs (issue 42, item 9), by behaviour on a real server and real
Parquet: ``/api/run`` of a run with many clients per round stays small and carries exact per-round
summaries of the client metrics; concurrent readers of a changed file parse it once; downloads are
sent without being read into the server's memory; idle connections hold no handler thread, never
keep a request waiting, and are closed after ``request_timeout`` or when too many wait.
The figures under load are in ``benchmarks/dashboard_load.py``."""

from __future__ import annotations

import json
import select
import socket
import threading
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_dashboard_data import write_run_dir
from test_dashboard_server import get

from fedray.dashboard.data import MAX_CLIENT_POINTS, DashboardData, FileCache
from fedray.dashboard.run_metrics import read_run_metrics
from fedray.tracking.metrics_file import METRICS_FILE

from test_dashboard_data import serve

ROUNDS, CLIENTS = 12, 4 * MAX_CLIENT_POINTS


@pytest.fixture(scope="module")
def big_run(tmp_path_factory) -> Path:
    """A run directory whose ``metrics.parquet`` has ``CLIENTS`` client rows per round (two metrics,
    a client in 10 without ``update_norm``), in row groups that split rounds."""
    run_dir = tmp_path_factory.mktemp("big") / "run"
    write_run_dir(run_dir, [f"train.rounds={ROUNDS}"], [0.1 * r for r in range(1, ROUNDS + 1)])
    generator = np.random.default_rng(0)
    rounds = np.repeat(np.arange(1, ROUNDS + 1), CLIENTS)
    norms = generator.random(len(rounds))
    norms[::10] = np.nan
    clients = pa.table(
        {
            "scope": ["client"] * len(rounds),
            "client_id": np.tile(np.arange(CLIENTS), ROUNDS),
            "round": rounds,
            "train_loss": generator.random(len(rounds)) + rounds,
            "update_norm": pa.array(norms, from_pandas=True),
        }
    )
    round_rows = pq.read_table(run_dir / METRICS_FILE).filter(pa.compute.equal(pa.compute.field("scope"), "round"))
    table = pa.concat_tables([round_rows, clients], promote_options="permissive")
    table = table.take(pa.compute.sort_indices(table, [("round", "ascending")]))
    pq.write_table(table, run_dir / METRICS_FILE, row_group_size=CLIENTS // 3)
    return run_dir


def test_run_view_of_many_clients_is_small_and_summarises_every_round(big_run):
    with serve(big_run) as server:
        status, body = get(server, f"/api/run?trial={big_run.name}&round=5")
    assert status == 200
    assert len(body) < 200_000  # every client of a round would be ~4× that
    view = json.loads(body)
    clients = view["clients"]
    assert clients["round"] == 5 and clients["rounds"] == list(range(1, ROUNDS + 1))
    assert clients["num_clients"] == CLIENTS and clients["shown_clients"] == MAX_CLIENT_POINTS
    assert len(clients["client_ids"]) == MAX_CLIENT_POINTS and clients["client_ids"][0] == 0 and clients["client_ids"][-1] == CLIENTS - 1
    assert len(clients["metrics"]["train_loss"]) == MAX_CLIENT_POINTS and all(5 <= v < 6 for v in clients["metrics"]["train_loss"])

    every = pq.read_table(big_run / METRICS_FILE).to_pandas()
    every = every[every["scope"] == "client"]
    summary = view["client_summary"]
    assert set(summary) == {"train_loss", "update_norm"}
    assert summary["train_loss"]["round"] == list(range(1, ROUNDS + 1))
    for round in (1, 5, ROUNDS):
        for metric in ("train_loss", "update_norm"):
            values = every.loc[every["round"] == round, metric].dropna().to_numpy()
            at = summary[metric]["round"].index(round)
            expected = [len(values), values.mean(), values.min(), *np.percentile(values, [25, 50, 75]), values.max()]
            got = [summary[metric][key][at] for key in ("count", "mean", "min", "q25", "median", "q75", "max")]
            assert got == pytest.approx(expected, rel=1e-12), (round, metric)


def test_summaries_over_many_rounds_are_downsampled_keeping_the_ends(big_run):
    view = DashboardData(big_run, max_curve_points=5).run_view(big_run.name)
    rounds = view["client_summary"]["train_loss"]["round"]
    assert len(rounds) <= 5 and rounds[0] == 1 and rounds[-1] == ROUNDS
    assert all(len(values) == len(rounds) for values in view["client_summary"]["train_loss"].values())


def test_a_metrics_file_out_of_round_order_gives_the_same_summaries(big_run, tmp_path):
    shuffled = tmp_path / "run"
    shuffled.mkdir()
    table = pq.read_table(big_run / METRICS_FILE)
    pq.write_table(table.take(np.random.default_rng(1).permutation(len(table))), shuffled / METRICS_FILE, row_group_size=CLIENTS // 3)
    ordered, unordered = read_run_metrics(big_run / METRICS_FILE), read_run_metrics(shuffled / METRICS_FILE)
    assert unordered.client_rounds == ordered.client_rounds
    for metric, statistics in ordered.client_summary.items():
        for key, values in statistics.items():
            np.testing.assert_allclose(unordered.client_summary[metric][key], values, rtol=1e-12)
    assert unordered.rounds["test_accuracy"].tolist() == ordered.rounds["test_accuracy"].tolist()


def test_concurrent_readers_of_a_changed_file_parse_it_once(tmp_path):
    path = tmp_path / "data.txt"
    path.write_text("contents")
    parses = []
    gate = threading.Event()

    def parse(file: Path) -> str:
        parses.append(file)
        gate.wait(5)  # the other readers arrive while this parse runs
        return file.read_text()

    cache = FileCache(tmp_path)
    results: list[str | None] = []
    readers = [threading.Thread(target=lambda: results.append(cache.read(path, parse, []))) for _ in range(16)]
    for reader in readers:
        reader.start()
    gate.set()
    for reader in readers:
        reader.join()
    assert results == ["contents"] * 16 and len(parses) == 1


def test_a_download_is_sent_without_reading_the_file_into_memory(tmp_path):
    run_dir = tmp_path / "run"
    write_run_dir(run_dir, [], [0.5])
    size = 48 << 20
    with open(run_dir / "partition.png", "wb") as figure:
        figure.truncate(size)
    with serve(run_dir) as server:
        get(server, "/api/overview")
        tracemalloc.start()
        try:
            port = server.server_address[1]
            connection = socket.create_connection(("127.0.0.1", port), timeout=30)
            connection.sendall(f"GET /api/file?trial=run&name=partition.png HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
            received, buffer = 0, bytearray(1 << 16)
            while count := connection.recv_into(buffer):
                received += count
            connection.close()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert received > size  # headers and the whole file
    assert peak < size // 8, f"the server held {peak / 1e6:.0f} MB to send a {size / 1e6:.0f} MB file"


def open_idle(server, count: int) -> list[socket.socket]:
    """Connections that are open and send nothing."""
    return [socket.create_connection(server.server_address[:2], timeout=30) for _ in range(count)]


def is_open(connection: socket.socket) -> bool:
    """Whether the server has not closed ``connection`` (nothing to read, and no end of stream)."""
    readable, _, _ = select.select([connection], [], [], 0)
    return not readable or connection.recv(1, socket.MSG_PEEK) != b""


def test_idle_connections_take_no_thread_and_a_request_is_answered_while_they_stay_open(tmp_path):
    run_dir = tmp_path / "run"
    write_run_dir(run_dir, [], [0.5])
    with serve(run_dir, request_timeout=60.0, max_threads=2) as server:
        idle = open_idle(server, 16)
        try:
            assert get(server, "/api/version")[0] == 200  # (before: 16 idle connections held both threads for 60 s each)
            assert all(is_open(connection) for connection in idle)
            deadline = time.monotonic() + 30  # the request's thread ends just after its response
            while server.handler_slots._value < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert server.handler_slots._value == 2  # no handler thread is taken by them
        finally:
            for connection in idle:
                connection.close()


def test_silent_connections_are_closed_after_the_timeout_and_when_too_many_wait(tmp_path):
    run_dir = tmp_path / "run"
    write_run_dir(run_dir, [], [0.5])
    with serve(run_dir, request_timeout=0.5) as server:
        [silent] = open_idle(server, 1)
        assert silent.recv(1) == b""  # closed by the server once request_timeout passed
        silent.close()
    with serve(run_dir, request_timeout=60.0) as server:
        server.max_waiting = 4
        idle = [*open_idle(server, 2)]
        get(server, "/api/version")  # the two are in the waiting room
        idle += open_idle(server, 4)
        try:
            assert [connection.recv(1) for connection in idle[:2]] == [b"", b""]  # the longest-waiting were closed
            assert all(is_open(connection) for connection in idle[2:])
        finally:
            for connection in idle:
                connection.close()
