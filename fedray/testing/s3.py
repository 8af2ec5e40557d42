"""A local S3-compatible endpoint on this machine (moto's server, a real HTTP S3 API on 127.0.0.1), so
that tests and benchmarks exercise object-store storage without network or an account. It needs
moto's server (``pip install -e ".[test]"``, which installs ``moto[server]``).

The server is a child process in its own session on a free loopback port; :meth:`LocalS3.stop`
signals only that process. Credentials are dummies, given through the environment as pyarrow (and
every Ray node started after :meth:`LocalS3.export_credentials`) reads them.

:class:`InterruptibleEndpoint` is a second address of the server that a test can take away and
bring back (an outage of the S3 service, its objects kept: moto keeps them in its memory only, so
stopping moto itself would lose them).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
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


def s3_uri(bucket: str, endpoint: str, prefix: str) -> str:
    """A pyarrow URI of ``prefix`` in ``bucket`` at the plain-HTTP S3 ``endpoint`` (``host:port``)."""
    return f"s3://{bucket}/{prefix.strip('/')}?endpoint_override={endpoint}&scheme=http"


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
        return s3_uri(self.bucket, self.endpoint, prefix)

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


class InterruptibleEndpoint:
    """Another loopback port of a running :class:`LocalS3`, forwarded to it (threads of this process),
    that can go away and come back: ``endpoint.uri("prefix")`` as for the server, then

    - :meth:`go_down`: the port stops listening and every connection open through it is cut, as when
      an S3 service dies (requests fail: connection refused or reset);
    - :meth:`come_back`: it listens on the same port again; the objects are as the server kept them.

    Usable as a context manager (up inside, down after)."""

    def __init__(self, s3: LocalS3) -> None:
        self.s3 = s3
        self.port = free_port()
        self._listener: socket.socket | None = None
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def uri(self, prefix: str = "") -> str:
        return s3_uri(self.s3.bucket, self.endpoint, prefix)

    @property
    def up(self) -> bool:
        return self._listener is not None

    def come_back(self) -> "InterruptibleEndpoint":
        if self._listener is None:
            self._listener = socket.create_server(("127.0.0.1", self.port))  # SO_REUSEADDR: the same port again at once
            threading.Thread(target=self._accept, args=(self._listener,), name="s3-endpoint", daemon=True).start()
        return self

    def go_down(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() of its thread
            listener.close()
        with self._lock:
            connections, self._connections = self._connections, set()
        for connection in connections:
            _cut(connection)

    def _accept(self, listener: socket.socket) -> None:
        host, port = self.s3.endpoint.rsplit(":", 1)
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # go_down closed the listener
                return
            try:
                server = socket.create_connection((host, int(port)), timeout=10)
            except OSError:
                _cut(client)
                continue
            server.settimeout(None)
            with self._lock:
                self._connections.update((client, server))
            for source, target in ((client, server), (server, client)):
                threading.Thread(target=self._forward, args=(source, target), daemon=True).start()

    def _forward(self, source: socket.socket, target: socket.socket) -> None:
        try:
            while data := source.recv(1 << 16):
                target.sendall(data)
        except OSError:
            pass
        for connection in (source, target):
            _cut(connection)
            with self._lock:
                self._connections.discard(connection)

    def __enter__(self) -> "InterruptibleEndpoint":
        return self.come_back()

    def __exit__(self, *exc_info: Any) -> None:
        self.go_down()


def _cut(connection: socket.socket) -> None:
    try:
        connection.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    connection.close()
