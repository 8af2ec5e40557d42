"""The tests that stop a child with SIGINT (as Ctrl-C) pass when pytest runs as a background job
(``pytest ... &`` in a script), where the shell starts pytest with SIGINT ignored and a child would
inherit that (tests/child_signals.py). Checked on the one that needs no Ray: it is run here in a
pytest started with SIGINT ignored."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STOPPED_BY_SIGINT = "tests/dashboard/test_dashboard_views.py::test_run_stopped_by_its_user_shows_as_stopped_not_crashed"


@pytest.mark.slow
def test_the_sigint_test_passes_in_a_pytest_that_ignores_sigint():
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # what `&` does: inherited by the pytest started here
    try:
        pytest_job = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", STOPPED_BY_SIGINT],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    finally:
        signal.signal(signal.SIGINT, previous)
    output, _ = pytest_job.communicate(timeout=500)
    assert pytest_job.returncode == 0, output[-3000:]
    assert "1 passed" in output
