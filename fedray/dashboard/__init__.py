"""``fedray dashboard``: a local web page over a sweep directory, a run directory or a folder of runs
(trials table, learning curves, parallel coordinates, best config, per-run views), refreshed live.

:mod:`fedray.dashboard.data` reads the files; :mod:`fedray.dashboard.app` serves them with the page in
``static/``. See ``docs/dashboard.md``.
"""

from fedray.dashboard.app import DashboardServer
from fedray.dashboard.data import DashboardData, Overview

__all__ = ["DashboardData", "DashboardServer", "Overview"]
