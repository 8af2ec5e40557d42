"""Local: every client trains its own model on its own data and never communicates (the "Local"
row of FedCoSR's Table II).

Every client starts from the same initial model θ_0 and keeps its whole model in its client state;
the split has no shared part, so nothing is uploaded and the server state never changes. It is
evaluated like any personalised method: each client's own model on its held-out split. The global
``test_accuracy`` is that of the untrained θ_0 and means nothing here. No ``algorithm.*`` keys.
"""

from __future__ import annotations

from fedray.algorithms.base import AlgorithmParams
from fedray.algorithms.personalized import PersonalizedAlgorithm


class LocalOnly(PersonalizedAlgorithm):
    name = "local"
    Params = AlgorithmParams
    uploads = frozenset()
    communicates = False

    def personal_prefixes(self) -> tuple[str, ...]:
        return ("",)  # every key: the whole model is personal
