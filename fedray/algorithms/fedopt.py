"""FedAvgM, FedAdagrad, FedAdam, FedYogi: FedAvg clients with a server optimizer, under their own names.

Each is :class:`~fedray.algorithms.fedavg.FedAvg` with ``algorithm.server_optimizer`` fixed by the
name (``fedavgm`` → ``avgm``, ``fedadam`` → ``adam``, ``fedyogi`` → ``yogi``, ``fedadagrad`` →
``adagrad``); the update rules, symbols and keys (``server_lr`` η, ``server_momentum`` β/β₁,
``server_beta2`` β₂, ``server_tau`` τ, ...) are in :mod:`fedray.algorithms.server_optimizers`. The
same optimizers apply to FedProx, FedRCL, FedLC, FedNTD, FedDecorr and FedProc through their own
``algorithm.server_optimizer`` key (FedRCL's paper, Table 5: FedAvgM + FedLC, FedADAM + FedDecorr).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from fedray.algorithms.fedavg import FedAvg, FedAvgParams


class FedAvgMParams(FedAvgParams):
    server_optimizer: Literal["avgm"] = Field("avgm", description="fixed by the algorithm name")


class FedAdagradParams(FedAvgParams):
    server_optimizer: Literal["adagrad"] = Field("adagrad", description="fixed by the algorithm name")


class FedAdamParams(FedAvgParams):
    server_optimizer: Literal["adam"] = Field("adam", description="fixed by the algorithm name")


class FedYogiParams(FedAvgParams):
    server_optimizer: Literal["yogi"] = Field("yogi", description="fixed by the algorithm name")


class FedAvgM(FedAvg):
    name = "fedavgm"
    Params = FedAvgMParams


class FedAdagrad(FedAvg):
    name = "fedadagrad"
    Params = FedAdagradParams


class FedAdam(FedAvg):
    name = "fedadam"
    Params = FedAdamParams


class FedYogi(FedAvg):
    name = "fedyogi"
    Params = FedYogiParams
