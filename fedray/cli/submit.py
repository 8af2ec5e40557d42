"""``fedray submit`` and ``fedray jobs``: run fedray on a Ray cluster through Ray's Job Submission API.

    fedray submit --address http://HEAD:8265 [--working-dir DIR] [--follow] -- run cfg.yaml [--set k=v]
    fedray submit --address http://HEAD:8265 --follow -- tune sweep.yaml
    fedray jobs list | logs ID [--follow] | stop ID       (same --address)

The address defaults to ``$RAY_API_SERVER_ADDRESS`` or ``$RAY_ADDRESS``. Exit codes: 0 success (with
``--follow``: the job succeeded), 1 the job failed or the cluster could not be reached, 2 invalid input.
See :mod:`fedray.cluster.jobs` and cluster/README.md.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ray.job_submission import JobSubmissionClient

ADDRESS_HELP = (
    "the Ray dashboard URL, e.g. http://127.0.0.1:8265 (default: $RAY_API_SERVER_ADDRESS or $RAY_ADDRESS, else the service of `fedray up`)"
)


def register(subparsers: argparse._SubParsersAction) -> None:
    submit = subparsers.add_parser(
        "submit",
        help="run a fedray command as a job on a Ray cluster",
        description="Submit `fedray ARGS...` (everything after --) as a Ray job; the working directory is uploaded with it.",
        usage="fedray submit [--address URL] [--working-dir DIR] [--exclude PATTERN] [--follow] -- COMMAND [ARGS...]",
    )
    submit.add_argument("--address", help=ADDRESS_HELP)
    submit.add_argument("--working-dir", default=".", type=Path, help="directory uploaded as the job's working directory (default: .)")
    submit.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="PATTERN",
        help="leave files matching this .gitignore-style pattern out of the upload (repeatable)",
    )
    submit.add_argument("--follow", action="store_true", help="stream the job's logs and exit with its status")
    submit.add_argument("fedray_args", nargs=argparse.REMAINDER, help="the fedray command to run, after --")
    submit.set_defaults(handler=submit_command)

    jobs = subparsers.add_parser("jobs", help="list, follow or stop fedray jobs on a Ray cluster")
    actions = jobs.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="all jobs of the cluster, newest first")
    logs = actions.add_parser("logs", help="print a job's logs")
    logs.add_argument("job_id", metavar="ID")
    logs.add_argument("--follow", action="store_true", help="keep printing until the job ends and exit with its status")
    stop = actions.add_parser("stop", help="stop a running job")
    stop.add_argument("job_id", metavar="ID")
    for parser in (listing, logs, stop):
        parser.add_argument("--address", help=ADDRESS_HELP)
    jobs.set_defaults(handler=jobs_command)


def check_fedray_command(fedray_args: list[str]) -> None:
    """The command must parse and a run's config must validate, so that a typo fails here in
    milliseconds instead of as a failed job."""
    from fedray.cli.main import build_parser
    from fedray.plugins import load_config
    from fedray.tracking.sync import is_uri

    parsed = build_parser().parse_args(fedray_args)
    if parsed.command == "tune" and parsed.sweep:
        from fedray.tune import load_sweep

        load_sweep(parsed.sweep, parsed.overrides)
    if parsed.command == "run" and not parsed.resume:
        output_dir = load_config(parsed.config, parsed.overrides).output.dir
        if not is_uri(output_dir) and not Path(output_dir).is_absolute():
            print(
                f"fedray: warning: output.dir={output_dir} is relative, so the job writes its results into its "
                "temporary copy of the working directory on the head node; pass a path on shared storage or a "
                "URI, e.g. --set output.dir=s3://BUCKET/runs",
                file=sys.stderr,
            )


def submit_command(args: argparse.Namespace) -> int:
    from fedray.cluster import jobs
    from fedray.config import ConfigError
    from fedray.runtime.service import service_job_server_url

    fedray_args = args.fedray_args[1:] if args.fedray_args[:1] == ["--"] else args.fedray_args
    entrypoint = jobs.job_entrypoint(fedray_args, args.working_dir)
    sys.path.append(str(args.working_dir.resolve()))  # plug-ins a config names import from it, as in the job
    check_fedray_command(fedray_args)
    if not args.working_dir.is_dir():
        raise ConfigError(f"--working-dir {args.working_dir}", "not a directory", within=None)
    plan = jobs.plan_upload(args.working_dir, args.exclude)
    for path, reason in plan.skipped_links:
        print(f"fedray: warning: not uploading the link {path}: {reason}", file=sys.stderr)
    print(
        f"uploading {args.working_dir}: {plan.files} files, {plan.bytes / 1e6:.1f} MB "
        f"(left out: {', '.join(jobs.DEFAULT_EXCLUDES)}, .gitignore/.rayignore entries, --exclude)",
        flush=True,
    )
    address = jobs.resolve_address(args.address or service_job_server_url())
    try:
        client = jobs.connect(address)
        job_id = jobs.submit(client, address, entrypoint, args.working_dir, plan)
    except RuntimeError as error:  # jobs.JobError, or the job server refusing the request
        print(f"fedray: {error}", file=sys.stderr)
        return 1
    except jobs.RequestException as error:  # the connection broke off (the head went away, a proxy timed out)
        print(f"fedray: {jobs.broken_request(address, error)}; check that it is up (fedray jobs list), then submit again", file=sys.stderr)
        return 1
    print(f"submitted job {job_id}: {entrypoint}", flush=True)
    if not args.follow:
        print(f"follow it with: {jobs_command_line('logs', job_id, '--follow', address=address)}")
        return 0
    return _follow(client, job_id, address)


def jobs_command(args: argparse.Namespace) -> int:
    from fedray.cluster import jobs
    from fedray.runtime.service import service_job_server_url

    address = args.address or service_job_server_url()
    try:
        client = jobs.connect(address)
        if args.action == "list":
            print(jobs.format_jobs(client.list_jobs()))
        elif args.action == "logs":
            if args.follow:
                return _follow(client, args.job_id, jobs.resolve_address(address))
            print(client.get_job_logs(args.job_id), end="")
        elif args.action == "stop":
            stopped = client.stop_job(args.job_id)
            print(f"job {args.job_id}: {'stopping' if stopped else 'already finished'}")
    except RuntimeError as error:  # jobs.JobError, or the job server refusing (e.g. an unknown job id)
        print(f"fedray: {error}", file=sys.stderr)
        return 1
    except jobs.RequestException as error:
        print(f"fedray: {jobs.broken_request(jobs.resolve_address(address), error)}", file=sys.stderr)
        return 1
    return 0


def jobs_command_line(action: str, job_id: str, *options: str, address: str) -> str:
    """``fedray jobs ACTION JOB_ID [OPTIONS] --address ADDRESS``, for a hint to copy and run."""
    return shlex.join(["fedray", "jobs", action, job_id, *options, "--address", address])


def _follow(client: "JobSubmissionClient", job_id: str, address: str) -> int:
    from fedray.cluster import jobs

    try:
        status = jobs.follow_logs(client, job_id)
    except KeyboardInterrupt:
        print(
            f"\nfedray: stopped following; job {job_id} keeps running (`{jobs_command_line('stop', job_id, address=address)}` stops it)",
            file=sys.stderr,
        )
        return 130
    except RuntimeError as error:  # the log stream broke off (head node lost, network)
        print(f"fedray: {error}; `{jobs_command_line('logs', job_id, address=address)}` shows the job's logs so far", file=sys.stderr)
        return 1
    print(f"job {job_id}: {status.value}", file=sys.stderr)
    return jobs.exit_code(status)
