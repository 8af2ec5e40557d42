"""Signals of the processes a test starts.

A process started with SIGINT ignored passes that on: its children ignore SIGINT too (an ignored
signal stays ignored across fork and exec, and Python installs its Ctrl-C handler only where SIGINT
is not ignored). A shell ignores SIGINT in a job it starts in the background (``pytest ... &`` in a
script, a CI step run with ``&``), so there a test that stops its child with SIGINT, as Ctrl-C would,
waits for a child that never stops. ``start_new_session`` does not change that; a signal that is
*caught* is reset to its default by exec, so the child gets Python's usual handler when this process
catches SIGINT while it starts the child."""

from __future__ import annotations

import signal
import subprocess
import threading
from typing import Any


def popen_interruptible(*args: Any, **kwargs: Any) -> subprocess.Popen:
    """:class:`subprocess.Popen`, with SIGINT in the child at its default whatever this process does
    with it (a background job ignores it), so ``send_signal(SIGINT)`` stops the child like Ctrl-C."""
    if threading.current_thread() is not threading.main_thread():  # signal.signal works in the main thread only
        return subprocess.Popen(*args, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL), **kwargs)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # caught here: default in the child after exec
    try:
        return subprocess.Popen(*args, **kwargs)
    finally:
        signal.signal(signal.SIGINT, previous)
