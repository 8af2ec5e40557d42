"""A local S3-compatible endpoint on this machine (moto's server, a real HTTP S3 API on 127.0.0.1), so
that tests and benchmarks exercise object-store storage without network or an account. It needs
moto's server (``pip install -e ".[test]"``, which installs ``moto[server]``).

The server is a child process in its own session on a free loopback port; :meth:`LocalS3.stop`
signals only that process. Credentials are dummies, given through the environment as pyarrow (and
every Ray node started after :meth:`LocalS3.export_credentials`) reads them.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs

from fedray.testing.cluster import free_port

DUMMY_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "fedray-local",
    "AWS_SECRET_ACCESS_KEY": "fedray-local",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",  # never ask an instance-metadata endpoint (no network)
}


class LocalS3:
    """``with LocalS3(log_dir) as s3: s3.uri("prefix")`` → ``s3://fedray/prefix?endpoint_override=...``."""

    def __init__(self, log_dir: str | Path, bucket: str = "fedray") -> None:
        self.log = Path(log_dir) / "moto.log"
        self.bucket = bucket
        self.port = free_port()
        self.process: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def uri(self, prefix: str = "") -> str:
        """A pyarrow URI of ``prefix`` in the bucket, with the endpoint in its query string."""
        return f"s3://{self.bucket}/{prefix.strip('/')}?endpoint_override={self.endpoint}&scheme=http"

    def filesystem(self) -> pafs.S3FileSystem:
        return pafs.S3FileSystem(
            access_key=DUMMY_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            secret_key=DUMMY_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            region=DUMMY_CREDENTIALS["AWS_DEFAULT_REGION"],
            endpoint_override=self.endpoint,
            scheme="http",
            allow_bucket_creation=True,
        )

    @staticmethod
    def export_credentials() -> dict[str, str | None]:
        """Put the dummy credentials in ``os.environ``; returns the previous values for :meth:`restore`."""
        previous = {key: os.environ.get(key) for key in DUMMY_CREDENTIALS}
        os.environ.update(DUMMY_CREDENTIALS)
        return previous

    @staticmethod
    def restore(previous: dict[str, str | None]) -> None:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    def start(self, timeout: float = 60) -> "LocalS3":
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "w") as output:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"moto's S3 server did not start; its log:\n{self.log.read_text()[-3000:]}") from None
                time.sleep(0.2)
        self.filesystem().create_dir(self.bucket)
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)

    def __enter__(self) -> "LocalS3":
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()
