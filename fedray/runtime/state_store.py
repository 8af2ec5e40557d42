"""Per-client persistent state (docs/architecture.md, principle 5).

State is written through to ``<run_dir>/client_state/<client>/r<round>.pt`` as soon as a client
finishes, so any worker can take a client over and a run can resume. Versions are kept by round: the
server tells a worker which version to load (the client's last successful round) and which version
the latest checkpoint refers to, so a retried client or a resumed run reads exactly the state it
would have read without the failure. A worker also caches the states it wrote (sticky clients skip
the disk read).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path

import torch

NO_STATE = -1  # version of a client that has never stored state


class ClientStateStore:
    def __init__(self, directory: str | Path, cache_size: int = 256) -> None:
        self.directory = Path(directory)
        self.cache_size = cache_size
        self._cache: OrderedDict[tuple[int, int], dict[str, torch.Tensor]] = OrderedDict()

    def _path(self, client_id: int, version: int) -> Path:
        return self.directory / f"{client_id:07d}" / f"r{version:06d}.pt"

    def load(self, client_id: int, version: int, device: torch.device) -> dict[str, torch.Tensor] | None:
        """The client's state as written in round ``version`` (``None`` for :data:`NO_STATE`)."""
        if version == NO_STATE:
            return None
        cached = self._cache.get((client_id, version))
        if cached is None:
            path = self._path(client_id, version)
            if not path.is_file():
                raise FileNotFoundError(
                    f"client {client_id}: state of round {version} is missing ({path}); "
                    "the client state store must be on storage every worker and the driver can reach"
                )
            cached = torch.load(path, map_location="cpu", weights_only=True)
        return {name: tensor.to(device) for name, tensor in cached.items()}

    def save(self, client_id: int, version: int, state: dict[str, torch.Tensor], keep: tuple[int, ...]) -> None:
        """Write round ``version``'s state atomically, then drop this client's versions other than
        ``version`` and ``keep`` (the version loaded this round and the one the last checkpoint uses)."""
        cpu_state = {name: tensor.detach().to("cpu", copy=True) for name, tensor in state.items()}
        path = self._path(client_id, version)
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(".tmp")
        torch.save(cpu_state, temporary)
        os.replace(temporary, path)
        self._cache[(client_id, version)] = cpu_state
        self._cache.move_to_end((client_id, version))
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        wanted = {path.name} | {self._path(client_id, v).name for v in keep if v != NO_STATE}
        for old in path.parent.glob("r*.pt"):
            if old.name not in wanted:
                old.unlink(missing_ok=True)
                self._cache.pop((client_id, int(old.stem[1:])), None)
