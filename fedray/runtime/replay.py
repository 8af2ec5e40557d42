"""``fedray replay``: re-execute one client's update of one round of a finished (or stopped) run, in
this process, and check it against what the run recorded.

A client's update is deterministic (docs/architecture.md, principle 7) from the seed, the round and
the client id, the broadcast of its round (the server state at the start of the round) and its
stored client state as of its version then. :func:`replay_client` rebuilds those:

- **The start of the round.** The newest checkpoint of a round before ``round`` (round ``r`` <
  ``round``) gives the server state after round ``r`` and every client's state version; the rounds
  ``r + 1 .. round - 1`` are then re-run here, on the local backend (which gives the Ray backend's
  bits), and each is compared with the run's record of it (its round row where both have a value, its
  clients and their rows). Without such a checkpoint (``checkpoint.keep`` keeps the newest ones only)
  the replay starts from the initial model, as round 1 did, and re-runs every round before
  ``round``: any round of a run can be replayed, at the cost of the rounds before it since the newest
  checkpoint that precedes it. A checkpoint that fails to load is reported and the next older one
  (or the initial model) is used.
- **The client.** Its state is copied from the run's client state location (as of the checkpoint)
  into a scratch directory: the replay writes nothing into the run directory or its client state.
- **The update.** The client runs on the worker (and in the worker's call) the run's schedule put it
  on, through :meth:`~fedray.runtime.worker.ClientWorker.run_clients`: the algorithm's
  ``client_update`` (``breakpoint()`` in it stops in this terminal), then the worker's upload path.
  A run that trained vectorised (``train.vectorize``) replays the client with the other clients of
  its worker in that round, in the same groups, since a group's batched kernels round differently
  from one client's.

What is compared: every column of the client's row in ``metrics.parquet`` (its loss and the
algorithm's metrics, ``num_samples``, ``client_name``) with the replayed values, exactly (bit for
bit; NaN equals NaN), and, when the run was recorded with ``output.record_update_hashes: true``, its
``update_hash`` (:func:`~fedray.runtime.worker.update_hash`: the SHA-256 of the update after the
worker's upload path, before pre-aggregation). Columns the server adds to a client's row after the
workers (:data:`SERVER_CLIENT_COLUMNS`) are shown but not replayed.

The config is the run's ``config.yaml`` (the one ``fedray run --resume`` would use); where it differs
from the config stored in the checkpoint the replay starts from (or, starting from the initial
model, the newest checkpoint), the differing keys are reported: a deliberately edited config
replays what that config computes.
"""

from __future__ import annotations

import math
import numbers
import pdb
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedray.config import load_config_sections, saved_config_path
from fedray.layout import list_checkpoints
from fedray.runtime.resume import ConfigChange, config_changes
from fedray.runtime.scheduler import assign_clients
from fedray.tracking.metrics_file import read_metrics_table

if TYPE_CHECKING:  # torch and the runtime: imported by replay_client, so that check_replayable is torch-free
    from fedray.config import RunConfig
    from fedray.runtime.pool import LocalPool

#: Client-row columns the server writes after the workers (local DP's per-client ε, the upload path's
#: accountant): a replay of the client's update does not compute them.
SERVER_CLIENT_COLUMNS = frozenset({"dp_epsilon"})
#: Columns of a client row that are not the client's results.
_ROW_KEYS = frozenset({"scope", "round", "client_id"})
#: Round-row columns that differ between two runs of the same rounds (wall time, workers replaced).
_UNREPEATABLE = frozenset({"seconds", "worker_restarts"})
HASH = "update_hash"
NO_STATE = -1  # fedray.runtime.state_store.NO_STATE: a client without stored state


class ReplayError(RuntimeError):
    """What was asked cannot be replayed (no such round or client in the run, an async run)."""

    fedray_exit_code = 2  # the CLI prints the message alone: the input given is unusable


@dataclass(frozen=True)
class Comparison:
    """One column of the client's row: recorded and replayed (None: absent on that side)."""

    name: str
    recorded: Any
    replayed: Any
    compared: bool = True  # False: not recorded (update_hash) or not replayed (server-side column)

    @property
    def same(self) -> bool:
        return not self.compared or same_value(self.recorded, self.replayed)


@dataclass
class ReplayResult:
    """What :func:`replay_client` found; :meth:`lines` is what ``fedray replay`` prints."""

    run_dir: Path
    round: int
    client_id: int
    config_path: Path
    config_compared_with: str | None  # the checkpoint whose config config.yaml was compared with
    config_changes: list[ConfigChange]
    start_round: int  # the checkpoint's round (0: the initial model)
    start_notes: list[str]  # checkpoints that could not be used, and why
    rerun_rounds: list[int]
    rerun_differences: list[str]  # "round r: what differs"
    state_version: int  # the round whose stored state the client started from (-1: none)
    training: str  # how the client was trained: alone (the loop) or vectorised with its worker's other clients
    device: str
    comparisons: list[Comparison] = field(default_factory=list)

    @property
    def hash_recorded(self) -> bool:
        return any(c.name == HASH and c.compared for c in self.comparisons)

    @property
    def differences(self) -> list[str]:
        """What differs from the record: the client's columns, then the re-run rounds."""
        found = [
            f"{c.name} (recorded {show(c.recorded, full=True)}, replayed {show(c.replayed, full=True)})"
            for c in self.comparisons
            if not c.same
        ]
        return found + [f"the re-run of {difference}" for difference in self.rerun_differences]

    @property
    def reproduced(self) -> bool:
        return not self.differences

    def lines(self) -> list[str]:
        config = f"{self.config_path}"
        if self.config_compared_with is None:
            config += " (the run has no checkpoint to compare it with)"
        elif self.config_changes:
            shown = ", ".join(change.describe() for change in self.config_changes[:4])
            more = f" and {len(self.config_changes) - 4} more" if len(self.config_changes) > 4 else ""
            config += f" (differs from the config in {self.config_compared_with}: {shown}{more})"
        else:
            config += f" (the same as in {self.config_compared_with})"
        if self.start_round == 0:
            start = "the initial model (no usable checkpoint of an earlier round)"
        else:
            start = f"the checkpoint of round {self.start_round}"
        if self.rerun_rounds:
            first, last = self.rerun_rounds[0], self.rerun_rounds[-1]
            span = f"round {first}" if first == last else f"rounds {first}-{last}"
            one = first == last
            agree = (
                ("it matches" if one else "they match")
                if not self.rerun_differences
                else ("it differs from" if one else "they differ from")
            )
            verdict = f"{agree} the record"
            start += f", then re-ran {span} on the local backend ({verdict})"
        state = "none" if self.state_version == NO_STATE else f"of round {self.state_version}"
        lines = [
            f"replay of client {self.client_id} in round {self.round} of {self.run_dir}",
            f"config     {config}",
            *[f"note       {note}" for note in self.start_notes],
            f"start      {start}",
            f"client     stored state: {state}; trained on {self.device}, {self.training}",
            "",
        ]
        width = max([len("column")] + [len(c.name) for c in self.comparisons])
        lines.append(f"{'column':<{width}}  {'recorded':<24}  {'replayed':<24}")
        for c in self.comparisons:
            if not c.compared:
                mark = "  (not recorded)" if c.recorded is None else "  (the server's: not replayed)"
            else:
                mark = "" if c.same else "  <- differs"
            lines.append(f"{c.name:<{width}}  {show(c.recorded):<24}  {show(c.replayed):<24}{mark}")
        if not self.hash_recorded:
            lines.append("(no update_hash recorded: the run had output.record_update_hashes off, so the metrics alone are compared)")
        lines.append("")
        if self.reproduced:
            what = "metrics and update hash" if self.hash_recorded else "metrics"
            lines.append(f"reproduced: the replayed {what} are the recorded ones, bit for bit")
        else:
            lines.append("differs: " + "; ".join(self.differences))
        return [line.rstrip() for line in lines]


def same_value(a: Any, b: Any) -> bool:
    """Equal as the recorded value reads back (an int column read as a float is equal), exactly;
    NaN equals NaN; None equals None only."""
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, numbers.Real) and isinstance(b, numbers.Real):
        a, b = float(a), float(b)
        return a == b or (math.isnan(a) and math.isnan(b))
    return a == b


def show(value: Any, full: bool = False) -> str:
    """A value in the table: floats in full (repr: the shortest string that reads back the same bits), hashes cut to 16 characters."""
    if value is None:
        return "—"
    if isinstance(value, str) and len(value) == 64 and not full:
        return value[:16] + "…"
    return repr(value) if isinstance(value, float) else str(value)


def _records(run_dir: Path) -> tuple[dict[int, dict[str, Any]], dict[int, dict[int, dict[str, Any]]]]:
    """The run's round rows by round and client rows by round and client id."""
    table = read_metrics_table(run_dir)
    rounds: dict[int, dict[str, Any]] = {}
    clients: dict[int, dict[int, dict[str, Any]]] = {}
    for row in [] if table is None else table.to_pylist():
        if row["scope"] == "round":
            rounds[int(row["round"])] = row
        elif row["scope"] == "client":
            clients.setdefault(int(row["round"]), {})[int(row["client_id"])] = row
    return rounds, clients


def _rounds_text(rounds: list[int]) -> str:
    if not rounds:
        return "none"
    return f"{rounds[0]}-{rounds[-1]}" if rounds == list(range(rounds[0], rounds[-1] + 1)) else ", ".join(map(str, rounds))


@dataclass
class Records:
    """A run's metrics: round rows by round, client rows by round and client id."""

    rounds: dict[int, dict[str, Any]]
    clients: dict[int, dict[int, dict[str, Any]]]


def check_replayable(run_dir: str | Path, round: int, client_id: int) -> Records:
    """The run's records, after checking (torch-free, so that the CLI refuses a bad input at once)
    that ``run_dir`` is a synchronous run that recorded ``round`` and that ``client_id`` trained in it;
    else :class:`ReplayError` (or :class:`~fedray.config.ConfigError` for a directory without
    ``config.yaml``) in one line."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ReplayError(f"{run_dir} is not a run directory: {'it is a file' if run_dir.exists() else 'it does not exist'}")
    sections = load_config_sections(saved_config_path(run_dir))
    if sections.train.mode == "async":
        raise ReplayError(
            f"{run_dir} ran train.mode=async, whose clients of a round started from different broadcasts; "
            "fedray replay replays the clients of synchronous rounds"
        )
    records = Records(*_records(run_dir))
    if round not in records.rounds:
        raise ReplayError(f"{run_dir} has no record of round {round}: its metrics hold rounds {_rounds_text(sorted(records.rounds))}")
    cohort = sorted(records.clients.get(round, {}))
    if client_id not in cohort:
        clients = ", ".join(map(str, cohort)) if cohort else "none"
        raise ReplayError(f"client {client_id} did not train in round {round} of {run_dir}; the round's clients: {clients}")
    return records


def replay_client(run_dir: str | Path, round: int, client_id: int, *, debug: bool = False) -> ReplayResult:
    """Re-execute client ``client_id``'s update of ``round`` of the run in ``run_dir`` and compare it
    with the run's record (module docstring). ``debug``: stop in pdb at the first line of the
    algorithm's ``client_update`` for this client. Raises :class:`ReplayError` for a round the run
    has no record of, a client that did not train in it, or an async run (:func:`check_replayable`)."""
    from fedray.plugins import load_config
    from fedray.runtime.engine import RoundEngine
    from fedray.runtime.experiment import prepare_data, with_absolute_state_dir
    from fedray.runtime.pool import LocalPool
    from fedray.systems.compression import keeps_client_state

    run_dir = Path(run_dir)
    records = check_replayable(run_dir, round, client_id)
    round_rows, client_rows = records.rounds, records.clients
    cohort = sorted(client_rows[round])
    config_path = saved_config_path(run_dir)
    config = with_absolute_state_dir(load_config(config_path))

    checkpoint, start_round, notes = _start_checkpoint(run_dir, round)
    compared_with, compared_config = _config_to_compare(run_dir, checkpoint, start_round)
    changes = [] if compared_config is None else config_changes(compared_config, config.to_dict())

    with tempfile.TemporaryDirectory(prefix="fedray-replay-") as scratch:
        replay_config = _scratch_config(config, Path(scratch))
        scratch_run = str(Path(scratch) / run_dir.name)
        data = prepare_data(replay_config)
        pool = LocalPool(replay_config, data, scratch_run)
        engine = RoundEngine(replay_config, data, scratch_run, pool)
        if checkpoint is not None:
            engine.load_checkpoint_state(checkpoint)

        # the worker the run's schedule put the client on in `round`, and the clients it trained there
        sticky = keeps_client_state(replay_config, type(engine.algorithm))
        ids = np.asarray(cohort, dtype=np.int64)
        assignment = assign_clients(ids, engine.client_costs[ids], pool.size, sticky=sticky)
        worker = next(index for index, assigned in enumerate(assignment) if client_id in assigned)
        vectorized = replay_config.train.vectorize != "off" and bool(_on_worker(pool, worker, "vectorized"))
        if vectorized and debug:
            raise ReplayError(
                f"--pdb stops in client_update, which this run does not call: it trained its clients vectorised "
                f"(train.vectorize={config.train.vectorize}); breakpoints go in the algorithm's vectorized_* hooks"
            )
        replayed_clients = assignment[worker] if vectorized else [client_id]

        rerun = list(range(start_round + 1, round))
        needs_state = list(range(engine.num_clients)) if rerun else replayed_clients
        _copy_client_state(config, run_dir, replay_config, scratch_run, engine.state_versions, needs_state)
        differences = []
        for past in rerun:
            result = engine.run_round(past)
            differences += _compare_round(past, result, round_rows.get(past, {}), client_rows.get(past, {}))

        state_version = int(engine.state_versions[client_id])
        if debug:
            _stop_in_client_update(pool.workers[worker].algorithm, client_id)
        partial = _on_worker(pool, worker, "run_clients", round, engine.client_tasks(replayed_clients), engine.broadcast(round))
        replayed = {"num_samples": int(data.clients.sizes[client_id])}
        if data.client_names is not None:
            replayed["client_name"] = data.client_names[client_id]
        replayed.update(partial.client_metrics[client_id])
        device = str(pool.workers[worker].device)
        if vectorized and not _on_worker(pool, worker, "vectorized"):  # train.vectorize=auto fell back to the loop, as the run did
            vectorized, replayed_clients = False, [client_id]

    others = ", ".join(str(c) for c in replayed_clients if c != client_id) or "none"
    training = "alone (the loop)" if not vectorized else f"vectorised as in the run, with its worker's other clients of the round: {others}"
    return ReplayResult(
        run_dir=run_dir,
        round=round,
        client_id=client_id,
        config_path=config_path,
        config_compared_with=compared_with,
        config_changes=changes,
        start_round=start_round,
        start_notes=notes,
        rerun_rounds=rerun,
        rerun_differences=differences,
        state_version=state_version,
        training=training,
        device=device,
        comparisons=_compare_client(client_rows[round][client_id], replayed),
    )


def _start_checkpoint(run_dir: Path, round: int) -> tuple[dict[str, Any] | None, int, list[str]]:
    """The newest loadable checkpoint of a round before ``round``, its round (0 and None: the
    initial model), and a note for each newer one that failed to load."""
    from fedray.runtime.checkpoint import CheckpointError, load_checkpoint

    notes = []
    for checkpoint_round, path in reversed([(r, p) for r, p in list_checkpoints(run_dir) if r < round]):
        try:
            return load_checkpoint(path), checkpoint_round, notes
        except CheckpointError as error:
            notes.append(f"{error}".split(" Earlier checkpoints:")[0] + "; it is not used")
    return None, 0, notes


def _config_to_compare(run_dir: Path, checkpoint: dict[str, Any] | None, start_round: int) -> tuple[str | None, dict[str, Any] | None]:
    """The checkpoint whose config ``config.yaml`` is compared with: the one the replay starts from,
    else the run's newest loadable one; and that config (None, None: there is none)."""
    from fedray.runtime.checkpoint import CheckpointError, load_checkpoint

    if checkpoint is not None:
        return f"checkpoints/round_{start_round:06d}.pt", checkpoint.get("config")
    for _, path in reversed(list_checkpoints(run_dir)):
        try:
            return f"checkpoints/{path.name}", load_checkpoint(path).get("config")
        except CheckpointError:
            continue
    return None, None


def _scratch_config(config: RunConfig, scratch: Path) -> RunConfig:
    """``config`` writing its client state under ``scratch`` (never into the run's), with update
    hashes recorded (nothing else in ``output`` plays a part in what the rounds compute)."""
    replay = config.model_copy(deep=True)
    replay.output.dir = str(scratch)
    replay.output.client_state_dir = None
    replay.output.record_update_hashes = True
    return replay


def _copy_client_state(
    config: RunConfig, run_dir: Path, replay_config: RunConfig, scratch_run: str, versions: np.ndarray, clients: list[int]
) -> None:
    """Copy the stored state of ``clients`` (the versions ``versions`` names) from the run's client
    state location into the replay's."""
    from fedray.runtime.state_store import ClientStateStore, client_state_location

    stored = [(cid, int(versions[cid])) for cid in clients if int(versions[cid]) != NO_STATE]
    if not stored:
        return
    source = ClientStateStore(client_state_location(config.output, run_dir))
    target = ClientStateStore(client_state_location(replay_config.output, scratch_run))
    for cid, version in stored:
        target.save(cid, version, source.load(cid, version, "cpu"), keep=())


def _on_worker(pool: LocalPool, worker: int, method: str, *args: Any) -> Any:
    """``ClientWorker.<method>(*args)`` on worker ``worker`` of ``pool``, as the engine calls it (with
    that worker's RNG, on copies)."""
    return pool.call_each(method, [args if index == worker else None for index in range(pool.size)])[worker]


def _stop_in_client_update(algorithm: Any, client_id: int) -> None:
    """Make ``algorithm.client_update`` stop in pdb at its first line when it runs for ``client_id``."""
    original = algorithm.client_update

    def client_update(ctx: Any, broadcast: Any) -> Any:
        if ctx.client_id != client_id:
            return original(ctx, broadcast)
        return pdb.Pdb().runcall(original, ctx, broadcast)

    algorithm.client_update = client_update


def _compare_client(recorded_row: dict[str, Any], replayed: dict[str, Any]) -> list[Comparison]:
    """The client's row, column by column: every column the run recorded for it (non-null) and every
    value the replay produced."""
    recorded = {key: value for key, value in recorded_row.items() if key not in _ROW_KEYS and value is not None}
    names = list(dict.fromkeys([*recorded, *replayed]))
    names.sort(key=lambda name: (name == HASH, name != "num_samples", name))  # num_samples first, the hash last
    comparisons = []
    for name in names:
        was, now = recorded.get(name), replayed.get(name)
        compared = not (name == HASH and was is None) and not (name in SERVER_CLIENT_COLUMNS and now is None)
        comparisons.append(Comparison(name, was, now, compared))
    return comparisons


def _compare_round(round: int, result: dict[str, Any], recorded: dict[str, Any], recorded_clients: dict[int, dict[str, Any]]) -> list[str]:
    """How a re-run round differs from the run's record of it: its clients, their rows (every column
    both have a value in) and its round row (likewise, but the wall time and worker restarts)."""
    found = []
    rows = {int(row["client_id"]): row for row in result["clients"]}
    if sorted(rows) != sorted(recorded_clients):
        return [f"round {round}: its clients {sorted(rows)}, recorded {sorted(recorded_clients)}"]
    for cid, row in rows.items():
        for key, value in row.items():
            was = recorded_clients[cid].get(key)
            if key not in _ROW_KEYS and was is not None and not same_value(was, value):
                found.append(f"client {cid}'s {key} (recorded {show(was)}, re-run {show(value)})")
    for key, value in result["round"].items():
        was = recorded.get(key)
        if key not in _UNREPEATABLE | _ROW_KEYS and was is not None and value is not None and not same_value(was, value):
            found.append(f"{key} (recorded {show(was)}, re-run {show(value)})")
    if not found:
        return []
    return [f"round {round}: {found[0]}" + (f" and {len(found) - 1} more value(s)" if len(found) > 1 else "")]
