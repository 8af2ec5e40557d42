"""``fedray replay RUN_DIR --round R --client C``: re-execute one client's update of one round, in
this process, and check it against the run's record (:mod:`fedray.runtime.replay`).

Exit codes: 0 reproduced, 1 differs (what differs is printed), 2 invalid input (no such round or
client in the run, not a run directory, an async run), as every ``fedray`` command."""

from __future__ import annotations

import argparse

from fedray.config import ConfigError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "replay",
        help="re-execute one client's update of one round of a run and check it against the record",
        description=(
            "Re-execute client C's update of round R of the run in RUN_DIR in this process (breakpoint() in the "
            "algorithm's client_update works), from the run's config.yaml, checkpoints and seeds, and compare its "
            "loss and metrics (and, with output.record_update_hashes, the hash of its upload) with the run's "
            "metrics.parquet. Rounds between the newest checkpoint before R and R are re-run on the local backend. "
            "Exit 0: reproduced; 1: differs; 2: bad input."
        ),
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run directory (holds config.yaml, metrics.parquet, checkpoints/)")
    parser.add_argument("--round", type=int, required=True, metavar="R", help="the round whose update to replay (1-based)")
    parser.add_argument("--client", type=int, required=True, metavar="C", help="the client id (one of round R's clients)")
    parser.add_argument(
        "--pdb",
        "--debug",
        dest="debug",
        action="store_true",
        help="stop in pdb at the first line of the algorithm's client_update for this client",
    )
    parser.set_defaults(handler=replay_command)


def replay_command(args: argparse.Namespace) -> int:
    if args.round < 1:
        raise ConfigError(None, f"--round must be 1 or more, not {args.round}", within=None)
    if args.client < 0:
        raise ConfigError(None, f"--client must be a client id (0 or more), not {args.client}", within=None)
    from fedray.runtime.replay import check_replayable, replay_client  # torch is imported by replay_client only

    check_replayable(args.run_dir, args.round, args.client)  # a bad input: one line, before torch is imported
    result = replay_client(args.run_dir, args.round, args.client, debug=args.debug)
    print("\n".join(result.lines()))
    return 0 if result.reproduced else 1
