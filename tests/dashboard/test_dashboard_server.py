"""The dashboard's HTTP server under hostile or heavy use: a real server on 127.0.0.1 (port 0), real HTTP
requests. ``Host`` checking (DNS rebinding), links out of the served folder, no absolute paths in
responses, many concurrent clients, half-sent requests timing out and a bounded number of handler threads."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from pathlib import Path

import pytest
from test_dashboard_data import serve, write_comparison_sweep, write_run_dir

from fedray.dashboard import DashboardServer


def get(server: DashboardServer, target: str, host: str | None = "default") -> tuple[int, bytes]:
    """GET ``target`` with the given ``Host`` header ("default": 127.0.0.1:PORT; None: no Host header)."""
    port = server.server_address[1]
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.putrequest("GET", target, skip_host=True)
        if host is not None:
            connection.putheader("Host", f"127.0.0.1:{port}" if host == "default" else host.replace("PORT", str(port)))
        connection.endheaders()
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


@pytest.fixture
def served(tmp_path) -> Path:
    """A folder of two runs, one of whose ``summary.json`` links to a secret outside, plus a link to a run
    directory outside."""
    secret = tmp_path / "secret.txt"
    secret.write_text("root:x:0:0:TOPSECRET\n")
    write_run_dir(tmp_path / "elsewhere", ["algorithm.name=fedprox"], [0.99])
    runs = tmp_path / "runs"
    write_run_dir(runs / "a", ["data.alpha=0.1"], [0.4, 0.5])
    write_run_dir(runs / "b", ["data.alpha=1.0"], [0.6, 0.7])
    (runs / "b" / "summary.json").unlink()
    (runs / "b" / "summary.json").symlink_to(secret)
    (runs / "c").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    return runs


def test_only_this_servers_own_host_names_are_answered(served):
    with serve(served) as server:
        for host in ("127.0.0.1:PORT", "localhost:PORT", "LOCALHOST:PORT", "[::1]:PORT"):
            assert get(server, "/api/version", host)[0] == 200, host
        for host in ("attacker.example", "attacker.example:PORT", "127.0.0.1:1", "localhost", "127.0.0.1.attacker.example:PORT", ""):
            status, body = get(server, "/api/overview", host)
            assert status == 403 and b"trials" not in body, host
        assert get(server, "/", None)[0] == 403  # no Host header at all
    with serve(served, allowed_hosts=["lab-box"]) as server:
        assert get(server, "/api/version", "lab-box:PORT")[0] == 200 and get(server, "/api/version", "other:PORT")[0] == 403


def test_links_out_of_the_folder_are_never_served(served, tmp_path):
    with serve(served) as server:
        status, body = get(server, "/api/file?trial=b&name=summary.json")
        assert status == 404 and b"TOPSECRET" not in body
        assert get(server, "/api/file?trial=a&name=summary.json")[0] == 200  # a real one is
        overview = json.loads(get(server, "/api/overview")[1])
        assert [t["trial_id"] for t in overview["trials"]] == ["a", "b"]  # not the linked directory c
        assert json.loads(get(server, "/api/run?trial=c")[1])["found"] is False
        assert json.loads(get(server, "/api/curves?metric=test_accuracy&trial=c&trial=a")[1])["curves"].keys() == {"a"}
        assert get(server, "/api/file?trial=c&name=config.yaml")[0] == 404
        for target in (
            "/api/file?trial=a&name=../../secret.txt",
            "/static/../../secret.txt",
            "/api/file?trial=../secret.txt&name=config.yaml",
        ):
            status, body = get(server, target)
            assert status == 404 and b"TOPSECRET" not in body, target


def test_responses_carry_no_absolute_path(served, tmp_path):
    sweep = tmp_path / "sweep"
    write_comparison_sweep(sweep)
    for folder in (served, sweep):
        with serve(folder) as server:
            overview = json.loads(get(server, "/api/overview")[1])
            ids = [t["trial_id"] for t in overview["trials"]]
            targets = [
                "/api/overview",
                "/api/version",
                "/api/groups?by=algorithm.name&by=data.alpha",
                "/api/run?trial=nope",
                "/api/curves?" + "&".join(f"trial={i}" for i in ids),
                "/api/file?trial=nope&name=config.yaml",
                "/api/nothing",
            ]
            for target in targets:
                assert str(tmp_path).encode() not in get(server, target)[1], target


def test_two_hundred_concurrent_clients_are_all_answered(served):
    clients = 200
    results: list[int | str] = []
    start = threading.Barrier(clients)

    def client() -> None:
        start.wait()
        try:
            results.append(get(server, "/api/version")[0])
        except OSError as error:  # refused or reset: the backlog dropped the connection
            results.append(repr(error))

    with serve(served) as server:
        threads = [threading.Thread(target=client) for _ in range(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert results == [200] * clients


def half_sent_connections(server: DashboardServer, count: int) -> list[socket.socket]:
    """Connections that send the start of a request and then nothing."""
    sockets = []
    for _ in range(count):
        connection = socket.create_connection(server.server_address[:2], timeout=60)
        connection.sendall(b"GET /api/overview HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # no blank line: the request never ends
        sockets.append(connection)
    return sockets


def test_half_sent_requests_are_closed_after_the_read_timeout(served):
    with serve(served, request_timeout=0.5) as server:
        sockets = half_sent_connections(server, 3)
        try:
            assert [s.recv(1024) for s in sockets] == [b""] * 3  # the server hung up on each (no response, no hang)
        finally:
            for connection in sockets:
                connection.close()
        assert get(server, "/api/version")[0] == 200


def test_handler_threads_are_bounded_and_idle_connections_do_not_block_the_page(served):
    def handler_threads() -> int:
        return sum(
            1
            for t in threading.enumerate()
            if getattr(t, "_target", None) is not None and getattr(t._target, "__name__", "") == "process_request_thread"
        )

    with serve(served, request_timeout=1.0, max_threads=4) as server:
        sockets = half_sent_connections(server, 8)  # twice as many as there are handler threads
        try:
            seen = []
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and (not seen or seen[-1] < 4):
                seen.append(handler_threads())
                time.sleep(0.01)
            for _ in range(50):  # and for a while longer: never more than 4
                seen.append(handler_threads())
                time.sleep(0.01)
            assert max(seen) == 4, seen[-20:]
            # the idle connections time out in turn, and a real request is answered after them
            assert get(server, "/api/version")[0] == 200
        finally:
            for connection in sockets:
                connection.close()


@pytest.fixture
def busy_port():
    """A port another socket listens on."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


def test_a_busy_port_or_an_unknown_host_is_one_line_and_exit_2(tmp_path, busy_port, capsys):
    """Not a chained AttributeError ('closing') from the failed bind's server_close."""
    from fedray.cli.main import main

    for host, port, reason in [("127.0.0.1", busy_port, "Address already in use"), ("no-such-host.invalid", 8000, "")]:
        assert main(["dashboard", str(tmp_path), "--host", host, "--port", str(port)]) == 2
        (line,) = capsys.readouterr().err.splitlines()
        assert line.startswith(f"fedray: dashboard: cannot listen on {host}:{port} ({reason}") and "pick another --port" in line


def test_a_dashboard_that_cannot_listen_says_so_whichever_command_started_it(tmp_path, busy_port):
    """`fedray up --dashboard-port P` starts the server inside the service: its error is a one-line exit 2 too."""
    from fedray.dashboard.app import ListenError

    with pytest.raises(ListenError) as raised:
        DashboardServer(tmp_path, port=busy_port)
    assert raised.value.fedray_exit_code == 2
    assert str(raised.value) == (
        f"the dashboard cannot listen on 127.0.0.1:{busy_port} (Address already in use); pick another port, or 0 for any free one"
    )
    assert raised.value.__cause__ is None and raised.value.__suppress_context__
