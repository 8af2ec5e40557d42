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
import ipaddress
import os
import shlex
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, TextIO
from urllib.parse import urlsplit

from ray.job_submission import JobDetails, JobStatus, JobSubmissionClient
from requests import RequestException

from fedray.cluster import SUBMIT_ADDRESS_VARIABLE
from fedray.config import ConfigError

ADDRESS_VARIABLES = ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")  # Ray's own, in its order of precedence
# Left out of every upload: never useful to a job, often large or secret. data/, sweeps/ and runs/ only at
# the top (fedray's own package has a data/ folder); pass data on shared storage or as a URI instead.
DEFAULT_EXCLUDES = [".git", "runs", "/data/", "/sweeps/", ".env", ".env.*", "__pycache__", "*.egg-info"]
CONFIG_SUFFIXES = (".yaml", ".yml")
JOB_ENV_VARS = {"PYTHONUNBUFFERED": "1"}  # the job's output reaches the logs as it is printed
FEDRAY_METADATA = {"submitted_by": "fedray"}
# The job server's answer (HTTP 500) when the head node's dashboard agent, which runs the jobs, is not up.
NO_AGENT = "No available agent to submit job"
DEFAULT_AGENT_PORT = 52365  # Ray's default --dashboard-agent-listen-port


def broken_request(address: str, error: RequestException) -> str:
    """One line for a request to the job server that broke off (``requests``' errors print nested tuples)."""
    return f"the job server at {address} broke off the request ({type(error).__name__}: {str(innermost_reason(error)).splitlines()[0]})"


def innermost_reason(error: BaseException) -> BaseException:
    while error.args and isinstance(error.args[-1], BaseException):
        error = error.args[-1]
    return error


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
        raise ConfigError(None, f"RAY_AUTH_TOKEN_PATH={path} does not exist", within=None)
    return None


def auth_headers() -> dict[str, str]:
    token = read_auth_token()
    if token is None and os.environ.get("RAY_AUTH_MODE", "").lower() == "token":
        raise ConfigError(
            None,
            "RAY_AUTH_MODE=token but no token found: set RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH, or copy "
            "the cluster's token to ~/.ray/auth_token (`ray get-auth-token` on the head node prints it)",
            within=None,
        )
    return {} if token is None else {"Authorization": f"Bearer {token}"}


def warn_if_token_in_clear(url: str, headers: dict[str, str]) -> None:
    """Warn (stderr) when the cluster token would go unencrypted to another machine: plain
    ``http://`` to a host that is not this machine's loopback."""
    host = urlsplit(url).hostname or ""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name
        loopback = False
    if headers and url.startswith("http://") and not loopback:
        print(
            f"fedray: warning: the cluster token is sent unencrypted over plain http:// to {host}; reach the job server "
            "through https://, or an SSH tunnel or kubectl port-forward to http://127.0.0.1:8265 (cluster/README.md)",
            file=sys.stderr,
        )


def resolve_address(address: str | None) -> str:
    """The job server URL: ``address``, else ``$RAY_API_SERVER_ADDRESS`` / ``$RAY_ADDRESS``."""
    address = address or next((os.environ[v] for v in ADDRESS_VARIABLES if os.environ.get(v)), None)
    if not address:
        raise ConfigError(
            None,
            "no cluster address: pass --address http://HEAD:8265 (the Ray dashboard's URL; e.g. through "
            "an SSH tunnel or kubectl port-forward, see cluster/README.md) or set RAY_API_SERVER_ADDRESS",
            within=None,
        )
    if not address.startswith(("http://", "https://")):
        raise ConfigError(f"--address {address!r}", "expected the Ray dashboard's URL, e.g. http://127.0.0.1:8265", within=None)
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
    warn_if_token_in_clear(url, headers)
    try:
        with _address_variables_unset():
            return JobSubmissionClient(url, headers=headers)
    except (ConnectionError, RuntimeError) as error:
        raise JobError(f"cannot reach the Ray job server at {url}: {error}") from None


def job_entrypoint(fedray_args: list[str], working_dir: Path) -> str:
    """The job's shell command, ``fedray <args>``, with config files made relative to ``working_dir``."""
    if not fedray_args:
        raise ConfigError(None, "nothing to submit: put the fedray command after --, e.g. `fedray submit -- run cfg.yaml`", within=None)
    if fedray_args[0] in ("submit", "jobs"):
        raise ConfigError(None, f"`fedray {fedray_args[0]}` runs on your machine, not as a job", within=None)
    root = working_dir.resolve()
    args = []
    for arg in fedray_args:
        path = Path(arg)
        if path.suffix in CONFIG_SUFFIXES and path.is_file():
            if not path.resolve().is_relative_to(root):
                raise ConfigError(None, f"{arg} is outside the working directory {working_dir}; the job could not read it", within=None)
            arg = path.resolve().relative_to(root).as_posix()
        args.append(arg)
    return shlex.join(["fedray", *args])


@dataclass
class UploadPlan:
    """What ``fedray submit`` uploads: Ray's exclude patterns (the defaults, ``--exclude`` and one per
    skipped link), the files and bytes that remain, and the links left out with the reason."""

    excludes: list[str]
    files: int = 0
    bytes: int = 0
    skipped_links: list[tuple[str, str]] = field(default_factory=list)  # (relative path, reason)


def _escape_pattern(relative: str) -> str:
    """An anchored .gitignore pattern matching exactly ``relative``."""
    return "/" + "".join("\\" + c if c in "[]*?!#\\ " else c for c in relative)


def _ignore_matcher(directory: Path, patterns: list[str]) -> Callable[[Path], bool]:
    """Whether a path matches ``patterns`` read as a .gitignore in ``directory`` (Ray's own matcher, so
    the plan leaves out exactly what Ray's upload leaves out)."""
    from ray._private.thirdparty.pathspec import PathSpec

    spec = PathSpec.from_lines("gitwildmatch", patterns)

    def matches(path: Path) -> bool:
        relative = path.relative_to(directory).as_posix()
        return spec.match_file(relative + "/" if path.is_dir() and not path.is_symlink() else relative)

    return matches


def _ignore_file_matchers(directory: Path) -> list[Callable[[Path], bool]]:
    """The matchers of ``directory``'s own ``.gitignore`` and ``.rayignore`` (those it has)."""
    return [
        _ignore_matcher(directory, (directory / ignore_file).read_text(errors="replace").splitlines())
        for ignore_file in (".gitignore", ".rayignore")
        if (directory / ignore_file).is_file()
    ]


def plan_upload(working_dir: Path, excludes: list[str] = ()) -> UploadPlan:
    """Walk ``working_dir`` as Ray's upload will (its excludes, plus ``.gitignore``/``.rayignore`` in
    every folder) without following links, and leave out every symbolic link that points outside the
    working directory, is broken, points at what those rules leave out (Ray would pack the target's
    contents under the link's name: ``config/creds -> ../.env`` would ship ``.env``), or points at a
    folder (Ray would follow it: a link to a parent folder is packed dozens of levels deep); the
    target of a folder link inside the working directory is uploaded in its own place."""
    root = working_dir.resolve()
    plan = UploadPlan(excludes=DEFAULT_EXCLUDES + list(excludes))
    stack: list[tuple[Path, list[Callable[[Path], bool]]]] = [(working_dir, [_ignore_matcher(working_dir, plan.excludes)])]
    while stack:
        directory, matchers = stack.pop()
        matchers = matchers + _ignore_file_matchers(directory)
        try:
            entries = sorted(directory.iterdir())
        except OSError:
            continue
        for entry in entries:
            if any(match(entry) for match in matchers):
                continue
            relative = entry.relative_to(working_dir).as_posix()
            if entry.is_symlink():
                reason = _link_problem(entry, root, plan.excludes)
                if reason is not None:
                    plan.skipped_links.append((relative, reason))
                    plan.excludes.append(_escape_pattern(relative))
                    continue
            if entry.is_dir() and not entry.is_symlink():
                stack.append((entry, matchers))
            elif entry.is_file():
                plan.files += 1
                plan.bytes += entry.stat().st_size
    return plan


def _link_problem(link: Path, root: Path, excludes: list[str]) -> str | None:
    """Why the symbolic link ``link`` must not be uploaded, or None if its target may be; ``root``:
    the resolved working directory, ``excludes``: the upload's patterns."""
    try:
        target = link.resolve(strict=True)
    except (OSError, RuntimeError):  # broken, or a loop of links
        return f"broken or looping link to {os.readlink(link)}"
    if not target.is_relative_to(root):
        return f"points outside the working directory, to {target}"
    if _left_out(target, root, excludes):
        return f"points at {target.relative_to(root).as_posix()}, which the upload rules leave out"
    if target.is_dir():
        return "links to a folder (its target, inside the working directory, is uploaded in its own place)"
    return None


def _left_out(path: Path, root: Path, excludes: list[str]) -> bool:
    """Whether the walk of :func:`plan_upload` leaves out ``path`` (resolved, inside ``root``): it or a
    folder above it matches ``excludes`` or an ignore file of a folder above it."""
    matchers = [_ignore_matcher(root, excludes)]
    directory = root
    for part in path.relative_to(root).parts:
        matchers += _ignore_file_matchers(directory)
        directory = directory / part
        if any(match(directory) for match in matchers):
            return True
    return False


def submit(client: JobSubmissionClient, address: str, entrypoint: str, working_dir: Path, plan: UploadPlan) -> str:
    """Submit ``entrypoint`` (see :func:`job_entrypoint`) to the job server at ``address`` (``client``'s)
    with ``working_dir`` uploaded as the job's working directory as ``plan`` (:func:`plan_upload`) says;
    returns the job id. The job knows ``address``, for the commands its messages suggest
    (:func:`fedray.runtime.resume.resume_command`)."""
    runtime_env = {
        "working_dir": str(working_dir),
        "excludes": list(plan.excludes),
        "env_vars": {**JOB_ENV_VARS, SUBMIT_ADDRESS_VARIABLE: address},
    }
    try:
        return client.submit_job(entrypoint=entrypoint, runtime_env=runtime_env, metadata=dict(FEDRAY_METADATA))
    except RuntimeError as error:
        if NO_AGENT in str(error):
            raise JobError(
                f"the job server at {address} has no job agent to run the job on (Ray: {NO_AGENT!r}); most likely "
                f"another Ray on the head's machine holds the dashboard agent's port ({DEFAULT_AGENT_PORT} unless "
                "--dashboard-agent-listen-port says otherwise), so the head's agent never started: read "
                "dashboard_agent.log in the head's Ray logs (<temp dir>/session_latest/logs/, /tmp/ray by default) and "
                "start the head with free ports (cluster/README.md)"
            ) from None
        raise


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
