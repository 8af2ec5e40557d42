"""Per-client persistent state, on storage every node reaches.

Stateful algorithms (MOON's previous model, FedPer/FedCoSR/Local's personal part, Hetero-SSFL's
per-client models) keep a state per client between its rounds. Workers write it through, as soon as
a client finishes, to a *location* that every worker of the cluster can read:

- a local path (the run directory's ``client_state/`` by default; on a multi-node cluster it must be
  on a volume every node mounts at the same path: NFS, EFS, a ReadWriteMany PVC), or
- a URI that pyarrow's filesystems open (``s3://bucket/prefix``, ``gs://...``, ``hdfs://...``;
  S3 options such as ``?endpoint_override=host:port&scheme=http`` ride in the query string, and
  credentials come from the environment as pyarrow reads them).

Layout: ``<location>/<client id:07d>/r<round:06d>.pt``, one file per client per kept version. A file
is ``MAGIC + sha256(payload) + payload`` (the payload is ``torch.save`` of a dict of tensors); the
checksum is verified on every read, so a damaged file is reported (client, round, file) instead of
silently training from wrong state. Writes are atomic: object stores (S3, GCS) publish an object
whole when its upload completes; other filesystems get a temporary file renamed into place.

Versions: the server tells a worker which version to load (the round the client last stored state
in) and which versions the kept checkpoints refer to (up to ``checkpoint.keep`` of them). After
writing round ``r`` a worker deletes the client's other versions except those, so a retried client,
a resumed run, and a resume from any checkpoint still on disk all read exactly the state they would
have read without the failure. A worker caches the states it wrote (the ``cache_size`` most recent,
at most ``cache_bytes`` of tensors): a sticky client, trained on the same worker as last time, never
reads its state back.

Failures: a location that stops working during a run (an S3 endpoint gone away, a mount lost)
raises :class:`ClientStateIOError` in the worker, naming the location, what was being done and the
storage's own first line; the driver reports it as one line with the command that resumes the run
once the location is back (the state each kept checkpoint refers to is still there). A state that
is missing although the run wrote it is :class:`ClientStateMissing`, which says whether the whole
location was emptied (deleted) or one file is gone.

Claims: a location outside the run directory (``<output.client_state_dir>/<run name>``) could be
shared by two runs of the same name; the first run claims it (:func:`claim_location`) and any other
is refused before it writes, so it never deletes the first run's versions.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import secrets
import socket
import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Iterable
from urllib.parse import urlsplit, urlunsplit

import pyarrow.fs as pafs
import torch

from fedray.config.schema import OutputConfig
from fedray.layout import RUN_ID_FILE
from fedray.runtime.errors import first_line
from fedray.tracking.sync import is_uri

logger = logging.getLogger(__name__)

NO_STATE = -1  # version of a client that has never stored state
MAGIC = b"FEDRAYCS"  # 8 bytes; then the 32-byte SHA-256 of the payload, then the payload
_HEADER = len(MAGIC) + hashlib.sha256().digest_size
_OBJECT_STORES = ("s3", "gcs")  # a single upload is atomic: no temporary file + rename needed


class ClientStateError(RuntimeError):
    """A client's state file is unreadable, corrupt, or the location cannot be opened."""

    fedray_exit_code = 1  # the CLI prints the message alone


class ClientStateMissing(ClientStateError, FileNotFoundError):
    """A client's state of the requested round is not in the store."""


class ClientStateIOError(ClientStateError):
    """The client state location failed to read or write (its server or mount is gone, or it
    refuses): the run can be resumed from its last checkpoint once the location works again."""


def join_location(location: str, *parts: str) -> str:
    """``location`` (a path or a URI, whose query string is kept) extended by path ``parts``."""
    if is_uri(location):
        split = urlsplit(location)
        return urlunsplit(split._replace(path="/".join([split.path.rstrip("/"), *parts])))
    return str(Path(location, *parts))


def client_state_location(output: OutputConfig, run_dir: str | Path) -> str:
    """Where a run keeps its client state: ``<output.client_state_dir>/<run name>`` if set, else
    ``<output.dir>/<run name>/client_state`` when ``output.dir`` is a URI (straight to the URI, not
    through the staging directory), else ``<run dir>/client_state``."""
    name = Path(run_dir).name
    if output.client_state_dir is not None:
        return join_location(output.client_state_dir, name)
    if is_uri(output.dir):
        return join_location(output.dir, name, "client_state")
    return str(Path(run_dir).absolute() / "client_state")


def location_outside_run_dir(output: OutputConfig) -> bool:
    """Whether a run's client state lives outside its run directory (``output.client_state_dir``, or a
    URI ``output.dir``), where another run of the same name may use the same location
    (see :func:`claim_location`)."""
    return output.client_state_dir is not None or is_uri(output.dir)


def open_location(location: str) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem and the path inside it that ``location`` names. S3 files open lazily
    (``allow_delayed_open``), so that a small state file is one PUT instead of a three-request
    multipart upload."""
    if not is_uri(location):
        return pafs.LocalFileSystem(), str(Path(location).absolute())
    split = urlsplit(location)
    if split.scheme == "s3" and "allow_delayed_open" not in split.query:
        location = urlunsplit(split._replace(query="&".join(filter(None, [split.query, "allow_delayed_open=true"]))))
    try:
        return pafs.FileSystem.from_uri(location)
    except Exception as error:  # unknown scheme, bad query option, missing credentials
        raise ClientStateError(
            f"cannot open the client state location {location!r} (a local path, file://, s3://, gs://, hdfs://, abfs://): {error}"
        ) from None


def encode_state(state: dict[str, torch.Tensor]) -> bytes:
    """The bytes of a state file: magic, SHA-256 of the payload, payload (``torch.save``)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    payload = buffer.getvalue()
    return MAGIC + hashlib.sha256(payload).digest() + payload


def decode_state(data: bytes, what: str) -> dict[str, torch.Tensor]:
    """The state in a state file's bytes, after checking its checksum; ``what`` names the file
    (client, round, path) in the error."""
    if len(data) < _HEADER or not data.startswith(MAGIC):
        raise ClientStateError(f"{what} is corrupt: not a fedray client-state file (truncated or overwritten)")
    payload = data[_HEADER:]
    if hashlib.sha256(payload).digest() != data[len(MAGIC) : _HEADER]:
        raise ClientStateError(f"{what} is corrupt: its SHA-256 checksum does not match its contents")
    try:
        return torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as error:  # a foreign object in a file with a valid checksum: never executed
        raise ClientStateError(f"{what} is corrupt: {type(error).__name__}: {error}") from None


def _nbytes(state: dict[str, torch.Tensor]) -> int:
    return sum(tensor.numel() * tensor.element_size() for tensor in state.values())


class ClientStateStore:
    """One worker's view of a run's client states at ``location`` (a path or a URI), with its cache."""

    def __init__(self, location: str | Path, cache_size: int = 256, cache_bytes: int = 1 << 30) -> None:
        self.location = str(location)
        self.filesystem, self.root = open_location(self.location)
        self.display_root = f"{urlsplit(self.location).scheme}://{self.root}" if is_uri(self.location) else self.root
        self.atomic_put = self.filesystem.type_name in _OBJECT_STORES
        self.cache_size, self.cache_bytes = cache_size, cache_bytes  # at most this many states, this many bytes
        self._cache: OrderedDict[tuple[int, int], dict[str, torch.Tensor]] = OrderedDict()
        self._cached_bytes = 0

    def _client_dir(self, client_id: int) -> str:
        return f"{self.root}/{client_id:07d}"

    def _path(self, client_id: int, version: int) -> str:
        return f"{self._client_dir(client_id)}/r{version:06d}.pt"

    def _describe(self, client_id: int, version: int) -> str:
        return f"client {client_id}: state of round {version} ({self.display_root}/{client_id:07d}/r{version:06d}.pt)"

    def load(self, client_id: int, version: int, device: torch.device) -> dict[str, torch.Tensor] | None:
        """The client's state as written in round ``version`` (``None`` for :data:`NO_STATE`)."""
        if version == NO_STATE:
            return None
        cached = self._cache.get((client_id, version))
        if cached is None:
            try:
                with self.filesystem.open_input_stream(self._path(client_id, version)) as stream:
                    data = stream.readall()
            except FileNotFoundError:
                raise ClientStateMissing(self._missing(client_id, version)) from None
            except OSError as error:
                raise self._io_error(f"reading client {client_id}'s state of round {version}", error) from None
            cached = decode_state(data, self._describe(client_id, version))
        return {name: tensor.to(device) for name, tensor in cached.items()}

    def _missing(self, client_id: int, version: int) -> str:
        """Why a state the run wrote is not there: the location emptied (deleted, or another storage
        than the one written to), or this one file gone."""
        try:
            emptied = not _holds_client_state(self)
        except OSError:
            emptied = False
        if emptied:
            return (
                f"{self._describe(client_id, version)} is missing, and {self.display_root} holds no client state at all: it was "
                "deleted, or this worker sees other storage than the one the run wrote to (on several nodes output.client_state_dir "
                "must be storage every node reaches); the run cannot go on without its clients' state: restore it, or start a new run"
            )
        return (
            f"{self._describe(client_id, version)} is missing although other client state is there (deleted?); restore it, or "
            "start a new run"
        )

    def _io_error(self, doing: str, error: OSError) -> ClientStateIOError:
        return ClientStateIOError(f"the client state location {self.display_root} failed while {doing} ({first_line(error)})")

    def save(self, client_id: int, version: int, state: dict[str, torch.Tensor], keep: Iterable[int]) -> None:
        """Write round ``version``'s state atomically, then drop this client's versions other than
        ``version`` and ``keep`` (the version loaded this round and those the kept checkpoints use)."""
        cpu_state = {name: tensor.detach().to("cpu", copy=True) for name, tensor in state.items()}
        try:
            self.write_atomic(self._path(client_id, version), encode_state(cpu_state))
        except OSError as error:
            raise self._io_error(f"writing client {client_id}'s state of round {version}", error) from None
        self._uncache((client_id, version))
        self._cache[(client_id, version)] = cpu_state
        self._cached_bytes += _nbytes(cpu_state)
        while len(self._cache) > 1 and (len(self._cache) > self.cache_size or self._cached_bytes > self.cache_bytes):
            self._uncache(next(iter(self._cache)))
        wanted = {self._path(client_id, v) for v in (version, *keep) if v != NO_STATE}
        try:
            for info in self.filesystem.get_file_info(pafs.FileSelector(self._client_dir(client_id))):
                if info.path not in wanted and info.base_name.startswith("r") and info.base_name.endswith(".pt"):
                    self.filesystem.delete_file(info.path)
                    self._uncache((client_id, int(info.base_name[1:-3])))
        except OSError as error:
            raise self._io_error(f"removing client {client_id}'s states older than round {version}", error) from None

    def _uncache(self, key: tuple[int, int]) -> None:
        state = self._cache.pop(key, None)
        if state is not None:
            self._cached_bytes -= _nbytes(state)

    def write_atomic(self, path: str, data: bytes) -> None:
        """Write ``data`` at ``path`` so that readers see the whole file or no file."""
        if self.atomic_put:
            with self.filesystem.open_output_stream(path) as stream:
                stream.write(data)
            return
        self.filesystem.create_dir(path.rsplit("/", 1)[0], recursive=True)
        temporary = f"{path}.{os.getpid()}.tmp"
        with self.filesystem.open_output_stream(temporary) as stream:
            stream.write(data)
        self.filesystem.move(temporary, path)  # a rename: readers see the old file or the new one


CLAIM_FILE = ".fedray-run.json"  # at a location outside the run directory: the run whose state it holds


class LocationClaimed(ClientStateError):
    """The client state location holds another run's state."""

    fedray_exit_code = 2


@dataclass
class LocationClaim:
    """A run's claim on a client state location outside its run directory (:func:`claim_location`).

    Client state is kept per run name, so a second run of the same ``output.name`` in another
    ``output.dir`` would share the location and delete the first run's state as it writes its own.
    The location therefore names the run whose state it holds (``CLAIM_FILE``: run id, run directory,
    host, time), and that run's directory records the same id (``RUN_ID_FILE``)."""

    location: str
    run_dir: Path
    run_id: str
    new: bool  # the claim is written by this run (else the location names it already: a resumed run)

    def record(self) -> None:
        """Write the run id into the run directory and a new claim at the location (before the first
        round, so before any client state is written)."""
        (self.run_dir / RUN_ID_FILE).write_text(self.run_id + "\n")
        if self.new:
            store = ClientStateStore(self.location)
            claim = {
                "run_id": self.run_id,
                "run_dir": str(self.run_dir.absolute()),
                "host": socket.gethostname(),
                "claimed": datetime.now().isoformat(timespec="seconds"),
            }
            store.write_atomic(f"{store.root}/{CLAIM_FILE}", json.dumps(claim).encode())

    def release(self) -> None:
        """Remove the claim this run wrote: it stopped before its first round, and keeps nothing. A
        location that fails now (the reason the run stopped, perhaps) keeps the claim, with a warning."""
        if self.new:
            store = ClientStateStore(self.location)
            try:
                store.filesystem.delete_file(f"{store.root}/{CLAIM_FILE}")
            except FileNotFoundError:
                pass
            except OSError as error:
                logger.warning(
                    "warning: could not remove this run's claim %s/%s (%s); delete it before another run of this name uses the location",
                    store.display_root,
                    CLAIM_FILE,
                    first_line(error),
                )


def claim_location(location: str, run_dir: str | Path, resuming: bool) -> LocationClaim:
    """The run's claim on the client state ``location`` (outside its run directory), to
    :meth:`~LocationClaim.record` once the run directory exists. Raises :class:`LocationClaimed`
    (before anything is written) when the location holds another run's state: its claim names
    another run, or, for a new run, it holds client state without a claim (a run from before
    claims). A resumed run from before claims (no run id in its directory) adopts its location."""
    run_dir = Path(run_dir)
    id_file = run_dir / RUN_ID_FILE
    run_id = id_file.read_text().strip() if resuming and id_file.is_file() else None
    store = ClientStateStore(location)
    remedy = (
        "a second run there would delete it as it writes its own; choose another output.name or "
        f"output.client_state_dir, or delete {store.display_root} if that state is no longer needed"
    )
    try:
        with store.filesystem.open_input_stream(f"{store.root}/{CLAIM_FILE}") as stream:
            claim = json.loads(stream.readall())
    except FileNotFoundError:
        claim = None
    except ValueError:  # not JSON: claimed all the same
        claim = {}
    if claim is not None:
        if run_id is not None and claim.get("run_id") == run_id:
            return LocationClaim(location, run_dir, run_id, new=False)
        owner = f"{claim.get('run_dir', '?')} on {claim.get('host', '?')}, since {claim.get('claimed', '?')}"
        raise LocationClaimed(f"{store.display_root} holds the client state of another run ({owner}); {remedy}")
    if not resuming and _holds_client_state(store):
        raise LocationClaimed(f"{store.display_root} holds the client state of an earlier run; {remedy}")
    return LocationClaim(location, run_dir, run_id or secrets.token_hex(8), new=True)


def _holds_client_state(store: ClientStateStore) -> bool:
    """Whether the store's location has a client's directory."""
    entries = store.filesystem.get_file_info(pafs.FileSelector(store.root, allow_not_found=True))
    return any(entry.base_name.isdigit() for entry in entries)


def _read_marker(location: str, name: str) -> bytes | None:
    """The marker file ``name`` at ``location`` as this node sees it (None if it cannot be read)."""
    store = ClientStateStore(location)
    try:
        with store.filesystem.open_input_stream(f"{store.root}/{name}") as stream:
            return stream.readall()
    except OSError:
        return None


def alive_ray_nodes() -> list[dict]:
    """The cluster's nodes that Ray currently counts as alive (``ray.nodes()`` records)."""
    import ray

    return [node for node in ray.nodes() if node["Alive"]]


def nodes_missing_location(location: str, timeout: float = 120) -> list[str]:
    """The alive Ray nodes that cannot read a file the caller writes at ``location`` (empty on a
    single-node cluster, where every path is shared). The test is real: a random marker is written
    here, one zero-CPU task pinned to each node reads it back, and the marker is deleted. A node that
    dies during the test is left out: it runs no worker, and the pool places its share elsewhere."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = alive_ray_nodes()
    if len(nodes) <= 1:
        return []
    store = ClientStateStore(location)
    token = secrets.token_hex(16)
    name = f".fedray-reachable-{token}"
    store.write_atomic(f"{store.root}/{name}", token.encode())
    deadline = time.monotonic() + timeout
    missing = []
    try:
        read = ray.remote(_read_marker)
        reads = [
            read.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)).remote(location, name)
            for node in nodes
        ]
        for node, marker in zip(nodes, reads):
            try:
                data = ray.get(marker, timeout=max(deadline - time.monotonic(), 0))
            except ray.exceptions.RayError:
                if node["NodeID"] in {alive["NodeID"] for alive in alive_ray_nodes()}:
                    raise
                continue
            if data != token.encode():
                missing.append(f"{node['NodeManagerAddress']} (node {node['NodeID'][:12]})")
    finally:
        store.filesystem.delete_file(f"{store.root}/{name}")
    return missing
