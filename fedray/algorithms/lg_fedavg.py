"""LG-FedAvg (Liang et al., "Think Locally, Act Globally: Federated Learning with Local and Global
Representations", arXiv:2001.01523, 2020).

The mirror image of FedPer: the representation layers are *local* and the top layers are *global*.
Per round a client loads its own body (θ_0's before its first round) and the global head, trains
the whole model on cross-entropy for ``train.local_epochs`` and uploads ``n_k · head_k`` (summed in
the workers); the server takes the sample-weighted mean of the heads. The body never leaves the
client: it lives in the client state store (nearly a whole model per client).

Config keys: the local part → ``algorithm.personal_prefixes``, default ``["encoder.",
"projector."]`` (``projector.`` counts only for a model with a projection head, ``model.projection_dim``),
i.e. every layer but the last linear layer ``classifier.``, which is shared — PFLlib's split, and so FedCoSR's
Table II. The original paper shares the top fully connected layers and starts from a FedAvg-trained
model; neither is done here (PFLlib starts from θ_0). ``personal_prefixes: []`` is FedAvg; naming
every part personal is Local.

Evaluation: as FedPer (:mod:`fedray.algorithms.personalized`): the client's own body with the
global head on its held-out split (``personal_accuracy``). ``test_accuracy`` (θ_0's untrained body
with the global head) means nothing here.
"""

from __future__ import annotations

from pydantic import Field

from fedray.algorithms.personalized import PersonalizedAlgorithm, PersonalizedParams


class LGFedAvgParams(PersonalizedParams):
    personal_prefixes: list[str] = Field(
        default_factory=lambda: ["encoder.", "projector."],
        description="state-dict key prefixes of the local representation (never uploaded); "
        "projector. is ignored for a model without a projection head",
    )


class LGFedAvg(PersonalizedAlgorithm):
    name = "lg_fedavg"
    Params = LGFedAvgParams

    def personal_prefixes(self) -> tuple[str, ...]:
        """The configured prefixes, less ``projector.`` when the model has no projection head."""
        has_projector = self.config.model.projection_dim is not None
        return tuple(p for p in self.params.personal_prefixes if has_projector or not p.startswith("projector."))
