"""FedAvgM: FedAvg with server momentum (Hsu, Qi and Brown, "Measuring the effects of non-identical
data distribution for federated visual classification", 2019, Algorithm 1).

Clients run FedAvg's local SGD. The server treats the round's change as a pseudo-gradient:

    Δ_t     = w_t − Σ_k n_k w_k / Σ_k n_k       (the clients' sample-weighted mean, from worker sums)
    v_{t+1} = β v_t + Δ_t                        β = algorithm.server_momentum
    w_{t+1} = w_t − η v_{t+1}                    η = algorithm.server_lr

With β = 0 and η = 1 it is exactly FedAvg. The momentum covers every floating-point entry of the
model (BatchNorm statistics included): with BatchNorm models use ``model.norm: group``.

Run it from the directory that holds ``mylab/``:

    fedray run --set algorithm.name=mylab.fedavgm:FedAvgM --set algorithm.server_momentum=0.9
"""

from __future__ import annotations

import torch
from pydantic import Field

from fedray import AlgorithmParams, RoundResults
from fedray.algorithms.fedavg import FedAvg


class FedAvgMParams(AlgorithmParams):
    """The ``algorithm.*`` keys of FedAvgM (unknown keys are errors, checked before Ray starts)."""

    server_lr: float = Field(1.0, gt=0, description="server learning rate η")
    server_momentum: float = Field(0.9, ge=0, lt=1, description="server momentum β")


class FedAvgM(FedAvg):
    """FedAvg's clients (inherited ``client_update``) with a momentum server (``aggregate``)."""

    name = "mylab_fedavgm"  # must differ from the built-in names
    Params = FedAvgMParams

    def init_server_state(self, model) -> dict[str, torch.Tensor]:
        state = super().init_server_state(model)  # {"weights": flat float32 vector}
        return {**state, "momentum": torch.zeros_like(state["weights"])}

    def aggregate(self, server_state, round: int, results: RoundResults):
        mean = results.sums["weights"] / results.sums["num_samples"]  # float64, summed in the workers
        delta = (server_state["weights"].double() - mean).float()
        momentum = self.params.server_momentum * server_state["momentum"] + delta
        weights = server_state["weights"] - self.params.server_lr * momentum
        return {"weights": weights, "momentum": momentum}, {"server_step_norm": float(momentum.norm())}
