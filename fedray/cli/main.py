"""The ``fedray`` command. Each sub-command is a module of this package with a
``register(subparsers)`` function; this file only discovers and dispatches them.

Exit codes: 0 success, 1 runtime failure, 2 invalid input (config, paths, arguments), 130
interrupted (Ctrl-C or SIGTERM). Expected failures are printed as one line, without a traceback: a
:class:`ConfigError`, and any exception whose class sets ``fedray_exit_code`` (a corrupt checkpoint,
a full disk, a run that failed for a stated reason); below the line of a
:class:`~fedray.runtime.errors.UserCodeError`, the traceback of the user's code.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import pkgutil
import signal
import sys
from typing import NoReturn

import fedray
from fedray.config import ConfigError
from fedray.runtime.errors import innermost_cause


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedray", description="Federated-learning simulation on Ray.")
    parser.add_argument("--version", action="version", version=f"fedray {fedray.__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    package = importlib.import_module("fedray.cli")
    for module_info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"fedray.cli.{module_info.name}")
        if hasattr(module, "register"):
            module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # `kill` stops the command like Ctrl-C
    try:
        return int(args.handler(args) or 0)
    except ConfigError as error:
        print(f"fedray: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as error:  # a run's RunInterrupted says how to resume it
        print(f"fedray: {getattr(error, 'message', 'interrupted')}", file=sys.stderr)
        return 130
    except Exception as error:
        code = getattr(error, "fedray_exit_code", None)
        if code is None:
            raise
        error = innermost_cause(error)  # raised in an actor: Ray wraps it
        print(f"fedray: {error}", file=sys.stderr)
        if getattr(error, "user_frames", ""):  # a UserCodeError: where in the user's code
            print(error.user_frames.rstrip("\n"), file=sys.stderr)
        return int(code)


def entry_point() -> NoReturn:
    """The ``fedray`` console script and ``python -m fedray.cli.main``: :func:`main`, then a quick exit.

    When a command returns, its files are written and closed. What is left is Ray's shutdown, which
    Ray's own exit hook starts with a 0.5 s pause, and the interpreter's teardown of torch and Ray,
    about 1 s on 2 cores (benchmarks/startup.py). Ray is shut down here, without the pause (and
    without its monitor's 1 s, see :func:`~fedray.runtime.ray_start.shutdown_ray`), and the teardown
    is skipped: the process ends with ``os._exit``. An unexpected exception still exits
    normally, with its traceback."""
    code = main()
    if "ray" in sys.modules:
        from fedray.runtime.ray_start import shutdown_ray

        shutdown_ray()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    entry_point()
