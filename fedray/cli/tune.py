"""``fedray tune SWEEP.yaml [--set key=value] [--space key=kind:[values]] [--num-samples N]
[--max-concurrent N] [--address ADDR] [--verbose]`` and ``fedray tune --resume SWEEP_DIR``."""

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
        "or continue an interrupted one with --resume. Exit codes: 0 every trial finished, 1 a trial "
        "errored, 2 invalid input (before Ray starts), 130 interrupted (Ctrl-C or SIGTERM).",
    )
    parser.add_argument("sweep", nargs="?", help="sweep file (YAML)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a key of the base run config for every trial, e.g. --set train.rounds=5 (repeatable)",
    )
    parser.add_argument(
        "--space",
        action="append",
        default=[],
        metavar="KEY=KIND:[VALUES]",
        help="replace or add a key of the search space, e.g. --space data.alpha=grid:[0.5] or --space train.lr=loguniform:[0.001,0.1] (KIND: grid, choice, uniform, loguniform, randint; repeatable)",
    )
    parser.add_argument(
        "--num-samples", type=int, metavar="N", help="samples of the non-grid keys per grid point (replaces the file's num_samples)"
    )
    parser.add_argument(
        "--max-concurrent", type=int, metavar="N", help="trials running at the same time (replaces the file's max_concurrent_trials)"
    )
    parser.add_argument(
        "--resume", metavar="SWEEP_DIR", help="continue an interrupted sweep (finished trials are kept); the folder is trusted input"
    )
    parser.add_argument(
        "--trust-tune-state",
        action="store_true",
        help="with --resume: resume although fedray did not record the folder's Tune state (it will be unpickled)",
    )
    parser.add_argument(
        "--address", help="Ray cluster address (e.g. auto); default: the service of `fedray up` if one runs, else a local Ray"
    )
    parser.add_argument(
        "--verbose", action="store_true", help="show Ray Tune's trial table and the trials' output instead of fedray's progress line"
    )
    parser.add_argument("--top", type=int, default=5, help="trials shown in the final table (default 5)")
    parser.set_defaults(handler=tune_command)


def tune_command(args: argparse.Namespace) -> int:
    from fedray.runtime.service import service_ray_address
    from fedray.tune import load_sweep, resume_sweep, run_sweep
    from fedray.tune.spec import shadowed_overrides

    if args.top < 1:
        raise ConfigError("--top", f"expected a positive number of trials to show (got {args.top})", within=None)
    if args.resume:
        if args.sweep or args.overrides or args.space or args.num_samples is not None or args.max_concurrent is not None:
            raise ConfigError(None, "--resume takes the sweep directory only; its saved sweep.yaml is used as is", within=None)
        address = args.address or service_ray_address(None, on_ray=True)  # the service of `fedray up`, if one runs
        run = lambda: resume_sweep(args.resume, address=address, verbose=args.verbose, trust_tune_state=args.trust_tune_state)  # noqa: E731
    else:
        if not args.sweep:
            raise ConfigError(None, "give a sweep file (e.g. tune_configs/fedavg.yaml) or --resume SWEEP_DIR", within=None)
        if args.trust_tune_state:
            raise ConfigError(None, "--trust-tune-state goes with --resume SWEEP_DIR", within=None)
        # fails with exit code 2 before Ray starts
        spec = load_sweep(args.sweep, args.overrides, args.space, args.num_samples, args.max_concurrent)
        for override in shadowed_overrides(spec, args.overrides):
            key = override.partition("=")[0].strip()
            print(
                f"fedray: warning: --set {override} is shadowed by the sweep's space ({key}: {spec.space[key].to_yaml()}); "
                f"use --space {key}=grid:[VALUE] to fix it",
                file=sys.stderr,
            )
        address = args.address or service_ray_address(None, on_ray=True)  # the service of `fedray up`, if one runs
        run = lambda: run_sweep(spec, address=address, verbose=args.verbose)  # noqa: E731
    try:
        outcome = run()
    except KeyboardInterrupt:
        print("fedray: interrupted; continue with `fedray tune --resume <sweep-dir>`", file=sys.stderr)
        return 130
    print_outcome(outcome.sweep_dir, args.top)
    if outcome.num_errors:
        print(
            f"fedray: {outcome.num_errors} trial(s) errored: see the table above and the error column of "
            f"{outcome.sweep_dir / 'trials.parquet'}",
            file=sys.stderr,
        )
    if outcome.num_unfinished:  # Tune returns normally when interrupted: the unfinished trials tell
        print(
            f"fedray: interrupted with {outcome.num_unfinished} trial(s) unfinished; continue with "
            f"`fedray tune --resume {outcome.sweep_dir}`",
            file=sys.stderr,
        )
        return 130
    return 0 if outcome.status == "finished" and not outcome.num_errors else 1


def print_outcome(sweep_dir: Path, top: int) -> None:
    from fedray.tune.summary import best_trial_lines, errored_trials_table, tensorboard_hint, top_trials_table, write_comparison

    print()
    print(f"sweep directory    {sweep_dir}")
    for line in best_trial_lines(sweep_dir):
        print(line)
    print()
    print(top_trials_table(sweep_dir, top))
    errored = errored_trials_table(sweep_dir)
    if errored is not None:
        print()
        print("errored trials")
        print(errored)
    comparison = write_comparison(sweep_dir)
    if comparison is not None:
        print()
        print(comparison)
    print("files              sweep.yaml, meta.json, trials.parquet, rounds.parquet, trials/<trial_id>/, tune/")
    hint = tensorboard_hint(sweep_dir)
    if hint is not None:
        print(hint)
