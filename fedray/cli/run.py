"""``fedray run [CONFIG] [--set key=value ...]`` and ``fedray run --resume RUN_DIR``."""

from __future__ import annotations

import argparse
import os
import time

from fedray.config import ConfigError, load_config_sections, read_yaml, saved_config_path
from fedray.runtime.resume import check_unfinished

_IMPORTED = time.monotonic()


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run one federated simulation (default: FedAvg on the embedded digits data)",
        description="Run one simulation from a YAML config (or the defaults) with --set overrides.",
    )
    parser.add_argument("config", nargs="?", help="YAML run config (default: built-in defaults)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key, e.g. --set data.alpha=0.1 (repeatable)",
    )
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue an interrupted run from its last checkpoint")
    parser.add_argument(
        "--address",
        help="Ray cluster address (e.g. auto, ray://host:10001); default: the service of `fedray up` if one runs, else a local Ray",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the resolved config (YAML, algorithm defaults filled in) and exit: no run, no Ray",
    )
    parser.set_defaults(handler=run_command)


def run_command(args: argparse.Namespace) -> int:
    """Errors reach :func:`fedray.cli.main.main`, which prints expected ones as one line. The config's
    schema (a resumed run's saved one), the ``--address`` and whether a resumed run is already
    finished are checked first, before torch is imported (a bad value fails in about a second). The
    run then checks the algorithm's and callbacks' keys (which need their code), the data and the run
    directory, and only then starts or joins Ray: a bad input never waits for Ray's start or stop."""
    if args.resume:
        if args.config or args.overrides:
            raise ConfigError(None, "--resume takes the run directory only; its saved config.yaml is used as is", within=None)
        sections = load_config_sections(saved_config_path(args.resume))
        check_unfinished(args.resume, sections.train.rounds)
    else:
        sections = load_config_sections(args.config, args.overrides)
    if args.print_config:
        print_config(sections)
        return 0
    from fedray.runtime.ray_start import check_address, uses_ray
    from fedray.runtime.service import service_ray_address

    check_address(args.address)
    # the service of `fedray up`, when one runs and this run would start Ray (an --address or $RAY_ADDRESS wins)
    address = args.address or service_ray_address(sections.resources, on_ray=uses_ray(sections.resources, None))
    if args.resume:
        from fedray.runtime import resume_experiment  # imports torch and the algorithms

        before_run = seconds_since_process_start()
        summary = resume_experiment(args.resume, address=address, progress=not args.quiet)
    else:
        from fedray.plugins import validate_plugins  # imports torch and the algorithms

        config = validate_plugins(sections)
        from fedray.runtime import run_experiment

        before_run = seconds_since_process_start()
        summary = run_experiment(config, address=address, progress=not args.quiet)
    print_summary(summary, before_run, seconds_since_process_start())
    return 0


def print_config(sections) -> None:
    """Print the config a run would use, as ``config.yaml`` would hold it: the algorithm's and
    callbacks' keys validated and the algorithm's defaults filled in. Writes nothing, starts no Ray."""
    import yaml

    from fedray.plugins import validate_plugins  # imports torch and the algorithms

    print(yaml.safe_dump(validate_plugins(sections).to_dict(), sort_keys=False, allow_unicode=True), end="")


def seconds_since_process_start() -> float:
    """Seconds since this process started (imports included): from ``/proc`` on Linux, elsewhere
    since this module was imported."""
    try:
        with open("/proc/self/stat") as stat:
            started_ticks = int(stat.read().rpartition(")")[2].split()[19])  # field 22, starttime
        with open("/proc/uptime") as uptime:
            return float(uptime.read().split()[0]) - started_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.monotonic() - _IMPORTED


def print_summary(summary, before_run: float, command_seconds: float) -> None:
    """``before_run``: the process's age when the run started (its imports and config validation);
    ``command_seconds``: its age now, the command's wall time, which the run's own ``seconds``
    (from the call of :func:`~fedray.runtime.run_experiment`) leave out the imports and checks of."""

    from fedray.tune.summary import format_metric  # pandas: imported by the run already

    def percent(value):
        return "n/a" if value is None else f"{100 * value:.2f}%"

    print()
    print(f"run directory      {summary.run_dir}")
    print(f"rounds             {summary.rounds}")
    if summary.headline == "test_accuracy":
        print(f"final test acc.    {percent(summary.final_test_accuracy)}")
        print(f"best test acc.     {percent(summary.best_test_accuracy)} (round {summary.best_round})")
    else:  # the task's headline (data.task), best by its direction
        lowest = " (lowest)" if summary.headline_mode == "min" else ""
        print(f"{'final ' + summary.headline:<18} {format_metric(summary.headline, summary.final_headline)}")
        print(
            f"{'best ' + summary.headline:<18} {format_metric(summary.headline, summary.best_headline)} (round {summary.best_round}){lowest}"
        )
    if "personal_accuracy" in summary.final_metrics:
        print(
            f"personalised acc.  {percent(summary.final_metrics['personal_accuracy'])} ± {percent(summary.final_metrics.get('personal_accuracy_std'))}"
        )
    for line in systems_lines(summary) + privacy_lines(summary):
        print(line)
    where = "local backend, no Ray" if summary.backend == "local" else f"Ray start-up {summary.ray_startup_seconds:.1f} s"
    print(f"wall time          {command_seconds:.1f} s from the command's start (the run {summary.seconds:.1f} s, {where})")
    if summary.first_round_seconds is not None:
        print(f"first round after  {before_run + summary.first_round_seconds:.1f} s (from the command's start)")
    workers = " workers.json," if summary.backend == "ray" else ""
    print(
        f"files              config.yaml, metrics.parquet, summary.json, run_info.json,{workers} learning_curve.png, partition.png, tensorboard/, checkpoints/"
    )


def systems_lines(summary) -> list[str]:
    """The systems model's results: simulated time, clients over all rounds, bytes; none without it.
    A run that aggregated no client in any round says so: its model is the initial one."""
    totals = summary.systems_totals
    if not totals:
        return []
    lines = [f"simulated time     {format_seconds(summary.final_metrics['sim_time'])}"] if "sim_time" in summary.final_metrics else []
    lines.append(
        f"clients            {totals['aggregated']:,} aggregated of {totals['selected']:,} selected over {summary.rounds} rounds "
        f"({totals['dropped']:,} dropped, {totals['late']:,} late)"
    )
    if totals["aggregated"] == 0:
        lines.append("                   no client update was ever aggregated: the model is the initial one (see the warning above)")
    lines.append(f"bytes              {format_bytes(totals['bytes_down'])} down, {format_bytes(totals['bytes_up'])} up")
    return lines


def privacy_lines(summary) -> list[str]:
    """The (ε, δ) the run spent; none when privacy is off."""
    epsilon = summary.final_metrics.get("dp_epsilon")
    if summary.dp_delta is None or epsilon is None:
        return []
    lines = [f"privacy            ε = {epsilon:.4g}, δ = {summary.dp_delta:.3g}"]
    if "audit_epsilon_lower_bound" in summary.final_metrics:  # privacy.audit: the empirical bound beside the accountant's ε
        from fedray.privacy.audit import summary_line

        saved = read_yaml(saved_config_path(summary.run_dir))
        confidence = ((saved.get("privacy") or {}).get("audit") or {}).get("confidence", 0.95)
        lines.append(f"                   {summary_line(summary.final_metrics, confidence)}")
    return lines


def format_seconds(seconds: float) -> str:
    """``93784.0`` -> ``93,784 s (1 d 2 h 3 min)``: simulated runs span hours or days."""
    whole = int(seconds)
    days, hours, minutes = whole // 86_400, whole % 86_400 // 3600, whole % 3600 // 60
    parts = [f"{n} {unit}" for n, unit in ((days, "d"), (hours, "h"), (minutes, "min")) if n]
    return f"{seconds:,.0f} s" + (f" ({' '.join(parts)})" if parts else "")


def format_bytes(count: int) -> str:
    """``1_500_000`` -> ``1.5 MB`` (decimal units, as network traffic is counted)."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} B"
