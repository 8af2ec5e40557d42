"""The dashboard's HTTP server: the standard library's threading HTTP server, serving one page
(``static/``), Plotly.js from the installed ``plotly`` package (no network, no build step) and a few
small JSON endpoints over :class:`~fedray.dashboard.data.DashboardData`.

Endpoints (all GET):

- ``/api/version`` → ``{"version"}``: only stats files; the page polls it and fetches the rest when it changes;
- ``/api/overview`` → the trials table, swept keys, metric, best trial and its config (:class:`Overview`);
- ``/api/curves?metric=M&trial=ID&trial=ID...`` → downsampled metric-vs-round curves of those trials;
- ``/api/groups?by=KEY&by=KEY...&metric=M`` → the comparison table (mean ± std per group of trials that
  share the values of those swept keys) and each group's mean ± std band of M round by round;
- ``/api/heatmap?x=KEY&y=KEY[&metric=M]`` → the mean final M (default: the sweep's metric) of the trials that
  share each pair of values of two swept keys, with their count; an unknown key or metric answers 400;
- ``/api/importance?value=latest_metric|best_metric`` → fANOVA importance of each swept key (Optuna's evaluator);
- ``/api/run?trial=ID[&round=R]`` → one run's curves, its client metrics summarised per round, the
  per-client values at round R (at most ``MAX_CLIENT_POINTS`` clients), config;
- ``/api/file?trial=ID&name=partition.png`` → one of a run directory's figures, its ``config.yaml`` or its
  ``log.txt``, streamed from the file (``sendfile``: never read into memory);
- ``/api/log?trial=ID`` → the end of a sweep trial's ``log.txt``;
- ``/api/compare?sweep=NAME&sweep=NAME...[&metric=M]`` → in a folder of sweeps, those sweeps side by side.

Safety: only files inside the served folder are read, after resolving links (:mod:`fedray.dashboard.data`);
a request whose ``Host`` header is not this server's address and port is refused (DNS rebinding: a web page
of another site must not read the dashboard through a name that resolves to 127.0.0.1); responses carry no
absolute path; the listen backlog is :attr:`DashboardServer.request_queue_size`, a connection that does not
send its request within ``request_timeout`` seconds is closed, and at most ``max_threads`` requests are
handled at once (further connections wait in the backlog).

Load: a new connection waits in a selector, holding no thread, until its request starts to arrive;
only then does a handler thread take it. So idle connections (a browser's pre-opened sockets, or
many of them on purpose) never keep a request waiting; at most :attr:`DashboardServer.max_waiting`
of them are kept (the longest-waiting is closed first), each for ``request_timeout`` seconds. Memory
stays bounded by what one request needs: large metric files are summarised once per version and
shared by all readers (:mod:`fedray.dashboard.run_metrics`), and files are sent without reading them.
"""

from __future__ import annotations

import ipaddress
import json
import mimetypes
import os
import selectors
import socket
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from fedray.dashboard.data import BadRequest, DashboardData

STATIC_DIR = Path(__file__).parent / "static"
STATIC_FILES = {"index.html", "app.js", "style.css"}


def plotly_js_path() -> Path:
    """``plotly.min.js`` shipped inside the ``plotly`` Python package."""
    try:
        path = Path(str(resources.files("plotly") / "package_data" / "plotly.min.js"))
    except ModuleNotFoundError:
        raise RuntimeError("the dashboard needs the plotly package for its plots: pip install plotly") from None
    if not path.is_file():
        raise RuntimeError(f"plotly is installed but has no {path}; reinstall it: pip install --force-reinstall plotly")
    return path


LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


def is_wildcard(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        return False


class ListenError(OSError):
    """The dashboard cannot listen on the address it was given (a busy port, a host name that does not
    resolve): bad input, which ``fedray`` prints as one line and exits 2 for, whichever command
    (``fedray dashboard``, ``fedray up``) started the dashboard. ``strerror`` is the system's reason."""

    fedray_exit_code = 2

    def __init__(self, host: str, port: int, error: OSError) -> None:
        super().__init__(error.errno, error.strerror or str(error))
        self.host, self.port = host, port

    def __str__(self) -> str:
        return f"the dashboard cannot listen on {self.host}:{self.port} ({self.strerror}); pick another port, or 0 for any free one"


class DashboardServer(ThreadingHTTPServer):
    """Serves the dashboard of one folder; ``port=0`` picks a free port (see :attr:`url`).

    ``allowed_hosts``: names besides 127.0.0.1, localhost, [::1] (and ``host`` itself when it is a
    specific address) that the ``Host`` header may carry, e.g. the machine's name when serving with
    ``--host 0.0.0.0``. ``request_timeout``: seconds a connection may take to send its request.
    ``max_threads``: requests handled at once. An address it cannot listen on raises :class:`ListenError`.
    """

    daemon_threads = True
    request_queue_size = 128  # the listen backlog (the standard library's 5 drops connections of a busy page)
    max_waiting = 256  # connections kept open before their request starts; beyond, the longest-waiting is closed

    def __init__(
        self,
        path: str | Path,
        host: str = "127.0.0.1",
        port: int = 0,
        refresh_seconds: float = 2.0,
        allowed_hosts: list[str] | tuple[str, ...] = (),
        request_timeout: float = 10.0,
        max_threads: int = 32,
    ) -> None:
        missing = sorted(name for name in STATIC_FILES if not (STATIC_DIR / name).is_file())
        if missing:
            raise RuntimeError(
                f"this fedray installation lacks the dashboard's page ({', '.join(missing)} in {STATIC_DIR}); reinstall it with its package data"
            )
        if max_threads < 1 or request_timeout <= 0:
            raise ValueError(f"max_threads must be >= 1 and request_timeout > 0, got {max_threads} and {request_timeout}")
        self.data = DashboardData(path)
        self.plotly_js = plotly_js_path()
        self.refresh_seconds = refresh_seconds
        self.request_timeout = request_timeout
        self.max_threads = max_threads
        self.handler_slots = threading.BoundedSemaphore(max_threads)
        if ":" in host:
            self.address_family = socket.AF_INET6
        # before binding: a failed bind calls server_close, which closes these
        self.waiting = selectors.DefaultSelector()  # connections whose request has not started: data = (since, address)
        self.waiting_lock = threading.Lock()
        self.closing = threading.Event()
        self.waiting_room = threading.Thread(target=self._admit_waiting, name="fedray-dashboard-waiting", daemon=True)
        try:
            super().__init__((host, port), DashboardHandler)
        except OSError as error:  # a busy port, an unknown host, an address this machine does not have
            raise ListenError(host, port, error) from None
        names = [*LOOPBACK_NAMES, *allowed_hosts] + ([] if is_wildcard(host) else [f"[{host}]" if ":" in host else host])
        port = self.server_address[1]
        self.allowed_hosts = {f"{name.lower()}:{port}" for name in names}
        self.waiting_room.start()

    def process_request(self, request: Any, client_address: Any) -> None:
        """Put a new connection in the waiting room (:meth:`_admit_waiting` hands it to a thread when its
        request starts to arrive); with :attr:`max_waiting` there already, close the longest-waiting one."""
        with self.waiting_lock:
            keys = list(self.waiting.get_map().values())
            if len(keys) >= self.max_waiting:
                oldest = min(keys, key=lambda key: key.data[0])
                self.waiting.unregister(oldest.fileobj)
                self.shutdown_request(oldest.fileobj)
            self.waiting.register(request, selectors.EVENT_READ, (time.monotonic(), client_address))

    def _admit_waiting(self) -> None:
        """The waiting room's loop: a connection with bytes to read goes to a handler thread once fewer
        than ``max_threads`` are busy; one silent for ``request_timeout`` seconds is closed."""
        while not self.closing.is_set():
            for key, _ in self.waiting.select(timeout=0.1):
                with self.waiting_lock:
                    self.waiting.unregister(key.fileobj)
                while not self.handler_slots.acquire(timeout=0.1):
                    if self.closing.is_set():
                        self.shutdown_request(key.fileobj)
                        return
                try:
                    super().process_request(key.fileobj, key.data[1])  # ThreadingMixIn: a thread for it
                except Exception:
                    self.handler_slots.release()
                    self.shutdown_request(key.fileobj)
            expired = time.monotonic() - self.request_timeout
            with self.waiting_lock:
                for key in [key for key in self.waiting.get_map().values() if key.data[0] < expired]:
                    self.waiting.unregister(key.fileobj)
                    self.shutdown_request(key.fileobj)

    def server_close(self) -> None:
        self.closing.set()
        if self.waiting_room.ident is not None:  # not started when the bind failed
            self.waiting_room.join()
        with self.waiting_lock:
            for key in list(self.waiting.get_map().values()):
                self.waiting.unregister(key.fileobj)
                self.shutdown_request(key.fileobj)
            self.waiting.close()
        super().server_close()

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.handler_slots.release()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        shown = f"[{host}]" if ":" in str(host) else host
        return f"http://{shown}:{port}/"

    def start_in_thread(self) -> threading.Thread:
        """Serve in a daemon thread (for tests and notebooks); stop with ``shutdown()``."""
        thread = threading.Thread(target=self.serve_forever, name="fedray-dashboard", daemon=True)
        thread.start()
        return thread


class DashboardHandler(BaseHTTPRequestHandler):
    server: DashboardServer

    def setup(self) -> None:
        self.timeout = self.server.request_timeout  # applied to the socket by StreamRequestHandler.setup
        super().setup()

    def do_GET(self) -> None:  # noqa: N802 (the http.server naming)
        host = (self.headers.get("Host") or "").strip().lower()
        if host not in self.server.allowed_hosts:
            self.send_error_json(HTTPStatus.FORBIDDEN, f"Host {host[:100]!r} is not this dashboard's address; open {self.server.url}")
            return
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        data = self.server.data
        try:
            if url.path in ("/", "/index.html"):
                self.send_file(STATIC_DIR / "index.html", cache=False)
            elif url.path.startswith("/static/"):
                name = url.path.removeprefix("/static/")
                if name == "plotly.min.js":
                    self.send_file(self.server.plotly_js, cache=True)
                elif name in STATIC_FILES:
                    self.send_file(STATIC_DIR / name, cache=False)
                else:
                    self.send_error_json(HTTPStatus.NOT_FOUND, f"no static file {name!r}")
            elif url.path == "/favicon.ico":
                self.send_response(HTTPStatus.NO_CONTENT)
                self.end_headers()
            elif url.path == "/api/version":
                self.send_json({"version": data.version()})
            elif url.path == "/api/overview":
                self.send_json({**data.overview().to_json(), "refresh_seconds": self.server.refresh_seconds})
            elif url.path == "/api/curves":
                self.send_json(data.curves(query.get("trial", []), first(query, "metric") or data.overview().metric))
            elif url.path == "/api/importance":
                self.send_json(data.importance(first(query, "value") or "latest_metric"))
            elif url.path == "/api/heatmap":
                self.send_json(data.heatmap(first(query, "x") or "", first(query, "y") or "", first(query, "metric")))
            elif url.path == "/api/groups":
                self.send_json(data.groups(query.get("by", []), first(query, "metric") or data.overview().metric))
            elif url.path == "/api/run":
                round_text = first(query, "round")
                client_round = int(round_text) if round_text and round_text.lstrip("-").isdigit() else None
                self.send_json(data.run_view(first(query, "trial") or "", client_round))
            elif url.path == "/api/log":
                self.send_json(data.run_log(first(query, "trial") or ""))
            elif url.path == "/api/compare":
                self.send_json(data.compare_sweeps(query.get("sweep", []), first(query, "metric")))
            elif url.path == "/api/file":
                trial, name = first(query, "trial") or "", first(query, "name") or ""
                path = data.run_file(trial, name)
                if path is None:
                    self.send_error_json(HTTPStatus.NOT_FOUND, f"trial {trial!r} has no file {name!r} here")
                else:
                    self.send_file(path, cache=False)
            else:
                self.send_error_json(HTTPStatus.NOT_FOUND, f"no page {url.path!r}")
        except BadRequest as error:
            self.send_error_json(HTTPStatus.BAD_REQUEST, str(error))
        except (BrokenPipeError, ConnectionResetError):
            pass  # the browser went away mid-response
        except Exception as error:  # a bug must show on the page (without its paths), and in full in the terminal
            self.log_error("%s while serving %s: %r", type(error).__name__, self.path, error)
            self.send_error_json(
                HTTPStatus.INTERNAL_SERVER_ERROR, f"{type(error).__name__} in the dashboard server (details in its terminal)"
            )

    def send_json(self, payload: Any, status: HTTPStatus = HTTPStatus.OK) -> None:
        body = json.dumps(payload, allow_nan=False, default=str).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Cache-Control", "no-store")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def send_error_json(self, status: HTTPStatus, message: str) -> None:
        self.send_json({"error": message}, status)

    def send_file(self, path: Path, cache: bool) -> None:
        """Send the file from the kernel's page cache (``sendfile``), without reading it into memory; a
        file cut short while it is sent ends the connection early (the client sees an incomplete body)."""
        content_type = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        if path.suffix in (".yaml", ".json", ".txt"):
            content_type = "text/plain; charset=utf-8"  # shown in the browser rather than downloaded
        with path.open("rb") as file:
            size = os.fstat(file.fileno()).st_size
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", content_type)
            self.send_header("Cache-Control", "max-age=86400" if cache else "no-cache")
            self.send_header("Content-Length", str(size))
            self.end_headers()
            self.connection.sendfile(file, 0, size)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per poll would drown the terminal; errors go through log_error

    def log_error(self, format: str, *args: Any) -> None:
        super().log_message(format, *args)


def first(query: dict[str, list[str]], key: str) -> str | None:
    values = query.get(key)
    return values[0] if values else None
