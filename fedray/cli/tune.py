"""``fedray tune SWEEP.yaml [--set key=value ...] [--address ADDR]`` and ``fedray tune --resume SWEEP_DIR``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fedray.config import ConfigError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "tune",
        help="run a hyperparameter sweep with Ray Tune (one trial = one simulation)",
        description="Run the sweep described by a sweep file (see docs/tune.md and tune_configs/), "
        "or continue an interrupted one with --resume.",
    )
    parser.add_argument("sweep", nargs="?", help="sweep file (YAML)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override a key of the base run config for every trial, e.g. --set train.rounds=5 (repeatable)")
    parser.add_argument("--resume", metavar="SWEEP_DIR", help="continue an interrupted sweep (finished trials are kept)")
    parser.add_argument("--address", help="Ray cluster address (e.g. auto); default: start a local Ray")
    parser.add_argument("--top", type=int, default=5, help="trials shown in the final table (default 5)")
    parser.set_defaults(handler=tune_command)


def tune_command(args: argparse.Namespace) -> int:
    from fedray.tune import load_sweep, resume_sweep, run_sweep

    if args.resume:
        if args.sweep or args.overrides:
            raise ConfigError("--resume takes the sweep directory only; its saved sweep.yaml is used as is")
        run = lambda: resume_sweep(args.resume, address=args.address)  # noqa: E731
    else:
        if not args.sweep:
            raise ConfigError("give a sweep file (e.g. tune_configs/fedavg.yaml) or --resume SWEEP_DIR")
        spec = load_sweep(args.sweep, args.overrides)  # fails with exit code 2 before Ray starts
        run = lambda: run_sweep(spec, address=args.address)  # noqa: E731
    try:
        outcome = run()
    except KeyboardInterrupt:
        print("fedray: interrupted; continue with `fedray tune --resume <sweep-dir>`", file=sys.stderr)
        return 130
    print_outcome(outcome.sweep_dir, args.top)
    if outcome.num_errors:
        print(f"fedray: {outcome.num_errors} trial(s) failed: see the error column of trials.parquet", file=sys.stderr)
    if outcome.num_unfinished:
        print(f"fedray: interrupted with {outcome.num_unfinished} trial(s) unfinished; continue with "
              f"`fedray tune --resume {outcome.sweep_dir}`", file=sys.stderr)
    return 0 if outcome.status == "finished" else 1


def print_outcome(sweep_dir: Path, top: int) -> None:
    from fedray.tune.summary import best_trial_lines, top_trials_table, write_comparison

    print()
    print(f"sweep directory    {sweep_dir}")
    for line in best_trial_lines(sweep_dir):
        print(line)
    print()
    print(top_trials_table(sweep_dir, top))
    comparison = write_comparison(sweep_dir)
    if comparison is not None:
        print()
        print(comparison)
    print("files              sweep.yaml, meta.json, trials.parquet, rounds.parquet, trials/<trial_id>/, tune/")
