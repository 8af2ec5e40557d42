"""The ``fedray`` command for the tests of inputs it must refuse, without paying torch's, Ray's and the
algorithms' imports in every case.

A server process (this file run as a script, with the environment of ``run_fedray`` in
``tests/config/test_bad_inputs.py``) imports them once; each command is a fork of it that enters the
directory it is given, puts that directory first on ``sys.path`` (as ``python -m fedray.cli.main``
does) and calls :func:`fedray.cli.main.main`. Its exit code is the process's, its output is what it
wrote to file descriptors 1 and 2, and an unexpected exception leaves its traceback there, so
``assert_rejected`` reads the result as it reads a ``python -m fedray.cli.main`` subprocess's. The
command must also stop before Ray starts: a fork that returns with Ray initialised says so in an extra
line of error. Whether a schema error stops the command before torch is imported is what only a fresh
process can show (``test_a_bad_config_value_fails_before_torch_is_imported``).
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# what a command imports before its data checks end (torch, Ray, scikit-learn's digits, Arrow, torchvision's
# image readers); the algorithms' modules too
PRELOADED = (
    "fedray.cli.main",
    "fedray.plugins",
    "fedray.runtime.experiment",
    "fedray.runtime.server",
    "sklearn.datasets",
    "pyarrow.parquet",
    "torchvision.datasets",
    "torchvision.io",
)
RAY_STARTED = "preloaded_cli: Ray was initialised when the command returned"

_server: subprocess.Popen | None = None
_lock = threading.Lock()


def run_fedray_preloaded(args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """``fedray ARGS`` run in ``cwd`` by a fork of the preloaded server, one command at a time. The
    server, started by the first call, keeps that call's environment for every command."""
    global _server
    with _lock, tempfile.TemporaryDirectory() as output:
        if _server is None or _server.poll() is not None:
            env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_ADDRESS": ""}
            _server = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
            atexit.register(_server.kill)
        _server.stdin.write(json.dumps({"args": args, "cwd": str(cwd), "output": output}) + "\n")
        _server.stdin.flush()
        pid = json.loads(_server.stdout.readline())["pid"]
        if not select.select([_server.stdout], [], [], timeout)[0]:
            os.kill(pid, signal.SIGKILL)
        returncode = json.loads(_server.stdout.readline())["returncode"]
        stdout, stderr = (Path(output, name).read_text(errors="replace") for name in ("stdout", "stderr"))
    return subprocess.CompletedProcess(["fedray", *args], returncode, stdout, stderr)


def _command(args: list[str], cwd: str, output: str) -> int:
    """In the fork: run the command as ``python -m fedray.cli.main ARGS`` would, and return its exit code."""
    os.chdir(cwd)
    sys.path[0] = cwd
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    for fd, name in ((1, "stdout"), (2, "stderr")):
        os.dup2(os.open(os.path.join(output, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    from fedray.cli.main import main

    try:
        code = main(args)
    except SystemExit as error:  # argparse's usage errors, --help, --version
        code = error.code if isinstance(error.code, int) else int(error.code is not None)
    except BaseException:
        traceback.print_exc()
        code = 1
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        print(RAY_STARTED, file=sys.stderr)
        from fedray.runtime.ray_start import shutdown_ray

        shutdown_ray()
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def _serve() -> None:
    """Import the command's modules once, then fork one process per request line on stdin."""
    import importlib
    import pkgutil

    import fedray.algorithms

    for module in PRELOADED + tuple(f"fedray.algorithms.{info.name}" for info in pkgutil.iter_modules(fedray.algorithms.__path__)):
        importlib.import_module(module)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:  # the command's process: it must never return to this loop
            code = 1
            try:
                code = _command(request["args"], request["cwd"], request["output"])
            finally:
                os._exit(code)
        print(json.dumps({"pid": pid}), flush=True)
        print(json.dumps({"returncode": os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])}), flush=True)


if __name__ == "__main__":
    _serve()
