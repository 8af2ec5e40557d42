"""Ray Job Submission for fedray: run ``fedray <args>`` on a cluster, follow it, list and stop jobs.

A submitted job is the entrypoint ``fedray <args>`` (``run cfg.yaml``, ``tune sweep.yaml``, ...) with
the working directory uploaded as the job's runtime environment (Ray honours ``.gitignore`` and
``.rayignore`` there); it runs on the head node, where ``fedray run`` finds ``$RAY_ADDRESS`` and joins
the cluster. Config files named in ``<args>`` must lie inside the working directory and are passed as
paths relative to it, so they resolve the same on the cluster.

Authentication: a Ray >= 2.52 cluster started with ``RAY_AUTH_MODE=token`` rejects requests without
its token (HTTP 401). The token is read the way Ray reads it (``$RAY_AUTH_TOKEN``, the file
``$RAY_AUTH_TOKEN_PATH``, ``~/.ray/auth_token``) and sent as ``Authorization: Bearer``, unless
``RAY_AUTH_MODE=disabled``.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, TextIO

from ray.job_submission import JobDetails, JobStatus, JobSubmissionClient

from fedray.config import ConfigError

ADDRESS_VARIABLES = ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")  # Ray's own, in its order of precedence
DEFAULT_EXCLUDES = [".git", "runs", "__pycache__", "*.egg-info"]  # never useful to a job, often large
CONFIG_SUFFIXES = (".yaml", ".yml")
JOB_ENV_VARS = {"PYTHONUNBUFFERED": "1"}  # the job's output reaches the logs as it is printed
FEDRAY_METADATA = {"submitted_by": "fedray"}


class JobError(RuntimeError):
    """The job server could not be reached or refused a request."""


def read_auth_token() -> str | None:
    """Ray's token, from the same sources in the same order as Ray (None if there is none)."""
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        return None
    if os.environ.get("RAY_AUTH_TOKEN", "").strip():
        return os.environ["RAY_AUTH_TOKEN"].strip()
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    if path.is_file():
        return path.read_text().strip() or None
    if os.environ.get("RAY_AUTH_TOKEN_PATH"):
        raise ConfigError(f"RAY_AUTH_TOKEN_PATH={path} does not exist")
    return None


def auth_headers() -> dict[str, str]:
    token = read_auth_token()
    if token is None and os.environ.get("RAY_AUTH_MODE", "").lower() == "token":
        raise ConfigError(
            "RAY_AUTH_MODE=token but no token found: set RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH, or copy "
            "the cluster's token to ~/.ray/auth_token (`ray get-auth-token` on the head node prints it)"
        )
    return {} if token is None else {"Authorization": f"Bearer {token}"}


def resolve_address(address: str | None) -> str:
    """The job server URL: ``address``, else ``$RAY_API_SERVER_ADDRESS`` / ``$RAY_ADDRESS``."""
    address = address or next((os.environ[v] for v in ADDRESS_VARIABLES if os.environ.get(v)), None)
    if not address:
        raise ConfigError(
            "no cluster address: pass --address http://HEAD:8265 (the Ray dashboard's URL; e.g. through "
            "an SSH tunnel or kubectl port-forward, see cluster/README.md) or set RAY_API_SERVER_ADDRESS"
        )
    if not address.startswith(("http://", "https://")):
        raise ConfigError(f"--address {address!r}: expected the Ray dashboard's URL, e.g. http://127.0.0.1:8265")
    return address.rstrip("/")


@contextmanager
def _address_variables_unset() -> Iterator[None]:
    """Ray's client lets $RAY_ADDRESS override an explicit address; here the explicit one wins."""
    saved = {name: os.environ.pop(name) for name in ADDRESS_VARIABLES if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def connect(address: str | None) -> JobSubmissionClient:
    """A job client for the cluster at ``address`` (see :func:`resolve_address`)."""
    url = resolve_address(address)
    headers = auth_headers()
    try:
        with _address_variables_unset():
            return JobSubmissionClient(url, headers=headers)
    except (ConnectionError, RuntimeError) as error:
        raise JobError(f"cannot reach the Ray job server at {url}: {error}") from None


def job_entrypoint(fedray_args: list[str], working_dir: Path) -> str:
    """The job's shell command, ``fedray <args>``, with config files made relative to ``working_dir``."""
    if not fedray_args:
        raise ConfigError("nothing to submit: put the fedray command after --, e.g. `fedray submit -- run cfg.yaml`")
    if fedray_args[0] in ("submit", "jobs"):
        raise ConfigError(f"`fedray {fedray_args[0]}` runs on your machine, not as a job")
    root = working_dir.resolve()
    args = []
    for arg in fedray_args:
        path = Path(arg)
        if path.suffix in CONFIG_SUFFIXES and path.is_file():
            if not path.resolve().is_relative_to(root):
                raise ConfigError(f"{arg} is outside the working directory {working_dir}; the job could not read it")
            arg = path.resolve().relative_to(root).as_posix()
        args.append(arg)
    return shlex.join(["fedray", *args])


def submit(client: JobSubmissionClient, entrypoint: str, working_dir: Path, excludes: list[str] = ()) -> str:
    """Submit ``entrypoint`` (see :func:`job_entrypoint`) with ``working_dir`` uploaded as the job's
    working directory; returns the job id."""
    if not working_dir.is_dir():
        raise ConfigError(f"--working-dir {working_dir}: not a directory")
    runtime_env = {
        "working_dir": str(working_dir),
        "excludes": DEFAULT_EXCLUDES + list(excludes),
        "env_vars": dict(JOB_ENV_VARS),
    }
    return client.submit_job(entrypoint=entrypoint, runtime_env=runtime_env, metadata=dict(FEDRAY_METADATA))


def follow_logs(client: JobSubmissionClient, job_id: str, out: TextIO | None = None) -> JobStatus:
    """Print the job's logs (to ``out``, default stdout) as they come until it ends; returns its
    final status."""

    async def tail() -> None:
        stream = out or sys.stdout
        async for chunk in client.tail_job_logs(job_id):
            stream.write(chunk)
            stream.flush()

    asyncio.run(tail())
    return client.get_job_status(job_id)


def exit_code(status: JobStatus) -> int:
    """The CLI's exit code for a finished job: 0 if it succeeded, 1 otherwise."""
    return 0 if status == JobStatus.SUCCEEDED else 1


def format_jobs(jobs: list[JobDetails]) -> str:
    """A table of jobs, newest first."""
    rows = [("SUBMISSION ID", "STATUS", "ENTRYPOINT")]
    for job in sorted(jobs, key=lambda job: job.start_time or 0, reverse=True):
        rows.append((job.submission_id or job.job_id or "-", str(job.status.value), job.entrypoint or ""))
    width = max(len(row[0]) for row in rows)
    return "\n".join(f"{sid:<{width}}  {status:<9}  {entrypoint}" for sid, status, entrypoint in rows)
