"""FedPer (Arivazhagan et al., "Federated Learning with Personalization Layers", arXiv:1912.00818).

Each client's network is a shared base φ and personal layers π (``algorithm.personal_prefixes``,
default ``["classifier."]``: the last linear layer). Per round a client overwrites its φ with the
global φ^G, keeps its own π (from its client state; θ_0's head before its first round), trains the
whole model on cross-entropy and uploads only φ. The server averages φ weighted by sample count.
π never leaves the client. Evaluation: φ^G + the client's π on its held-out split.

All of this is :class:`~fedray.algorithms.personalized.PersonalizedAlgorithm`'s default behaviour;
FedCoSR with α = 0 and λ ≡ 0 reduces to it, bit for bit (tests/algorithms/test_personalized.py checks this).
"""

from __future__ import annotations

from fedray.algorithms.personalized import PersonalizedAlgorithm


class FedPer(PersonalizedAlgorithm):
    name = "fedper"
