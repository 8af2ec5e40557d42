"""``fedray dashboard PATH [--host H] [--port P]``: serve a live web page over a sweep directory, a
run directory or a folder of runs (see :mod:`fedray.dashboard`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fedray.config import ConfigError

DEFAULT_PORT = 8050


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "dashboard",
        help="watch a sweep (or runs) in the browser: trials table, curves, parallel coordinates, best config",
        description=(
            "Serve a local web page over PATH: a sweep directory from `fedray tune` (sweeps/<sweep-id>), "
            "a run directory from `fedray run`, a folder of run directories, or a folder of sweep directories (sweeps/, "
            "to compare sweeps side by side). The page refreshes by itself "
            "while the files grow. It reads only the files, so a copied folder works too."
        ),
    )
    parser.add_argument("path", help="sweep directory, run directory, folder of run directories, or folder of sweep directories")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine only)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default: {DEFAULT_PORT}; 0 = any free port)")
    parser.add_argument(
        "--refresh", type=float, default=2.0, metavar="SECONDS", help="how often the page checks for new results (default: 2)"
    )
    parser.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a name the page may be opened by besides 127.0.0.1/localhost/[::1] (e.g. this machine's name "
        "with --host 0.0.0.0); other Host headers are refused. Repeatable",
    )
    parser.add_argument("--open", action="store_true", help="open the page in the default browser")
    parser.set_defaults(handler=dashboard_command)


def dashboard_command(args: argparse.Namespace) -> int:
    from fedray.dashboard.app import DashboardServer

    path = Path(args.path).expanduser()
    if not path.exists():
        raise ConfigError(
            "dashboard",
            f"{path} does not exist; give a sweep directory (sweeps/<sweep-id>), a run directory or a folder of runs",
            within=None,
        )
    if not path.is_dir():
        raise ConfigError(
            "dashboard", f"{path} is a file, not a directory; give a sweep directory, a run directory or a folder of runs", within=None
        )
    if not 0 <= args.port <= 65535:
        raise ConfigError("dashboard", f"--port must be between 0 and 65535, got {args.port}", within=None)
    if args.refresh < 0.5:
        raise ConfigError("dashboard", f"--refresh must be at least 0.5 seconds, got {args.refresh}", within=None)
    try:
        server = DashboardServer(path, host=args.host, port=args.port, refresh_seconds=args.refresh, allowed_hosts=args.allow_host)
    except OSError as error:
        raise ConfigError(
            "dashboard",
            f"cannot listen on {args.host}:{args.port} ({error.strerror or error}); pick another --port, or --port 0 for any free one",
            within=None,
        ) from None
    except RuntimeError as error:  # plotly or the page's static files missing
        print(f"fedray: {error}", file=sys.stderr)
        return 1
    kind = server.data.overview().kind
    print(f"fedray dashboard: {path.resolve()} ({kind}) at {server.url}  (Ctrl+C to stop)", flush=True)
    if args.open:
        import webbrowser

        webbrowser.open(server.url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
