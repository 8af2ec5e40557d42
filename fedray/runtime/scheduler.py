"""Split a round's cohort across workers (docs/architecture.md, principles 5 and 6).

Each client has a home worker (``client_id mod W``) so that its cached state stays where it is; the
cohort is placed largest first, and a client leaves its home only when that would push the home's
load past the balanced share by more than ``slack``. The result depends only on the inputs.
"""

from __future__ import annotations

import numpy as np


def assign_clients(
    client_ids: np.ndarray, costs: np.ndarray, num_workers: int, slack: float = 0.1
) -> list[list[int]]:
    """Client ids per worker (each list ascending). ``costs[i]`` is the cost of ``client_ids[i]``
    (samples × epochs)."""
    client_ids = np.asarray(client_ids, dtype=np.int64)
    costs = np.asarray(costs, dtype=np.float64)
    share = costs.sum() / num_workers * (1.0 + slack)
    loads = np.zeros(num_workers)
    assigned: list[list[int]] = [[] for _ in range(num_workers)]
    for i in np.lexsort((client_ids, -costs)):  # largest cost first, ties by id
        worker = int(client_ids[i] % num_workers)
        if loads[worker] + costs[i] > share:
            worker = int(np.argmin(loads))
        loads[worker] += costs[i]
        assigned[worker].append(int(client_ids[i]))
    return [sorted(ids) for ids in assigned]
