"""A worker crash in the middle of a round, injected from test code only: algorithm plug-ins (named in
a config as ``fault_injection:CrashingFedProx``) that behave exactly like their parent algorithm, except
that the first worker process to start its second client of round ``algorithm.crash_round`` kills
itself with SIGKILL, after its first client's update (and client state) is done.

The marker file ``algorithm.crash_marker`` makes it happen once per run: the worker that creates it
dies, and the replacement that re-runs its clients finds it and carries on. fedray ships this module
to the Ray processes like any user module, so it imports nothing from the other test files.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from typing import Any

from pydantic import Field

from fedray.algorithms.fedcosr import FedCoSR
from fedray.algorithms.fedprox import FedProx
from fedray.algorithms.hetero_ssfl import HeteroSSFL

_clients_started: Counter[int] = Counter()  # per worker process: round -> clients begun in it


def crashing(parent: type) -> type:
    """``parent`` with ``algorithm.crash_round`` and ``algorithm.crash_marker`` added."""

    class Params(parent.Params):
        crash_round: int = Field(..., ge=1)
        crash_marker: str

    class Crashing(parent):
        name = f"crashing_{parent.name}"

        def client_update(self, ctx: Any, broadcast: Any) -> Any:
            if ctx.round == self.params.crash_round:
                _clients_started[ctx.round] += 1
                if _clients_started[ctx.round] == 2 and _claim(self.params.crash_marker):
                    os.kill(os.getpid(), signal.SIGKILL)
            return super().client_update(ctx, broadcast)

    Crashing.Params = Params
    Crashing.__name__ = Crashing.__qualname__ = f"Crashing{parent.__name__}"
    return Crashing


def _claim(marker: str) -> bool:
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


CrashingFedProx = crashing(FedProx)
CrashingFedCoSR = crashing(FedCoSR)
CrashingHeteroSSFL = crashing(HeteroSSFL)


def crash_overrides(algorithm: str, round: int, marker: os.PathLike | str) -> list[str]:
    """The overrides that turn a run of ``algorithm`` (one of the three above) into its crashing twin."""
    return [f"algorithm.name=fault_injection:Crashing{algorithm}", f"algorithm.crash_round={round}", f"algorithm.crash_marker={marker}"]
