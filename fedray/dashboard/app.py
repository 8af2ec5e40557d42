"""The dashboard's HTTP server: the standard library's threading HTTP server, serving one page
(``static/``), Plotly.js from the installed ``plotly`` package (no network, no build step) and a few
small JSON endpoints over :class:`~fedray.dashboard.data.DashboardData`.

Endpoints (all GET):

- ``/api/version`` → ``{"version"}``: only stats files; the page polls it and fetches the rest when it changes;
- ``/api/overview`` → the trials table, swept keys, metric, best trial and its config (:class:`Overview`);
- ``/api/curves?metric=M&trial=ID&trial=ID...`` → downsampled metric-vs-round curves of those trials;
- ``/api/run?trial=ID[&round=R]`` → one run's curves, per-client distribution at round R, config;
- ``/api/file?trial=ID&name=partition.png`` → one of a run directory's figures or its ``config.yaml``.
"""

from __future__ import annotations

import json
import mimetypes
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from fedray.dashboard.data import DashboardData

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


class DashboardServer(ThreadingHTTPServer):
    """Serves the dashboard of one folder; ``port=0`` picks a free port (see :attr:`url`)."""

    daemon_threads = True

    def __init__(self, path: str | Path, host: str = "127.0.0.1", port: int = 0, refresh_seconds: float = 2.0) -> None:
        missing = sorted(name for name in STATIC_FILES if not (STATIC_DIR / name).is_file())
        if missing:
            raise RuntimeError(f"this fedray installation lacks the dashboard's page ({', '.join(missing)} in {STATIC_DIR}); reinstall it with its package data")
        self.data = DashboardData(path)
        self.plotly_js = plotly_js_path()
        self.refresh_seconds = refresh_seconds
        super().__init__((host, port), DashboardHandler)

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

    def do_GET(self) -> None:  # noqa: N802 (the http.server naming)
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
            elif url.path == "/api/run":
                round_text = first(query, "round")
                client_round = int(round_text) if round_text and round_text.lstrip("-").isdigit() else None
                self.send_json(data.run_view(first(query, "trial") or "", client_round))
            elif url.path == "/api/file":
                trial, name = first(query, "trial") or "", first(query, "name") or ""
                path = data.run_file(trial, name)
                if path is None:
                    self.send_error_json(HTTPStatus.NOT_FOUND, f"trial {trial!r} has no file {name!r} here")
                else:
                    self.send_file(path, cache=False)
            else:
                self.send_error_json(HTTPStatus.NOT_FOUND, f"no page {url.path!r}")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the browser went away mid-response
        except Exception as error:  # a bug must show on the page, not kill the request thread silently
            self.log_error("%s while serving %s: %r", type(error).__name__, self.path, error)
            self.send_error_json(HTTPStatus.INTERNAL_SERVER_ERROR, f"{type(error).__name__}: {error}")

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
        body = path.read_bytes()
        content_type = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        if path.suffix in (".yaml", ".json"):
            content_type = "text/plain; charset=utf-8"  # shown in the browser rather than downloaded
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", content_type)
        self.send_header("Cache-Control", "max-age=86400" if cache else "no-cache")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per poll would drown the terminal; errors go through log_error

    def log_error(self, format: str, *args: Any) -> None:
        super().log_message(format, *args)


def first(query: dict[str, list[str]], key: str) -> str | None:
    values = query.get(key)
    return values[0] if values else None
