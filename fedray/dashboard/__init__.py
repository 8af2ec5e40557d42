"""``fedray dashboard``: a local web page over a sweep directory, a run directory, a folder of runs or a folder of
sweeps (trials table, learning curves, parallel coordinates, best config, per-run views with each trial's log,
simulated devices and client summary, sweeps compared side by side), refreshed live.

:mod:`fedray.dashboard.data` reads the files; :mod:`fedray.dashboard.app` serves them with the page in
``static/``. See ``docs/dashboard.md``.
"""

from fedray.dashboard.app import DashboardServer
from fedray.dashboard.data import DashboardData, Overview

__all__ = ["DashboardData", "DashboardServer", "Overview"]
