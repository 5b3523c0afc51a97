"""A real S3-compatible server for tests: moto's server mode as its own process on 127.0.0.1.

moto 5.2's server enforces ``If-Match`` and ``If-None-Match`` on ``PutObject`` (412 on a mismatch), which
is what the fenced S3 adapter relies on. Used by the ``s3_server`` fixture and the chaos run.

S3 makes a conditional write atomic: of two concurrent ``PutObject`` with ``If-None-Match: *`` on one key,
at most one succeeds. moto's server checks the condition, then writes, on threads of its own, so two
concurrent writes could both pass (CI saw two of six same-token publishes succeed). Our server runs moto
with ``PutObject`` serialised (:data:`SERVER`), as S3 behaves; ``tests/fencing/test_s3_server.py``
shows the difference.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["MotoServer"]

# moto accepts any credentials; these are fixed test values, not secrets.
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


SERVER = """
import os
import threading
import time

from moto import server
from moto.s3.models import S3Backend
from moto.s3.responses import S3Response

delay = float(os.environ.get("VOLCANO_TEST_MOTO_CHECK_DELAY") or 0)
if delay:  # a slow look-up, as on a loaded machine: the window between a check and its write widens
    _get_object = S3Backend.get_object

    def get_object(self, *args, **kwargs):
        found = _get_object(self, *args, **kwargs)
        time.sleep(delay)
        return found

    S3Backend.get_object = get_object

if os.environ.get("VOLCANO_TEST_MOTO_ATOMIC") != "0":
    _one_at_a_time = threading.Lock()
    _put_object = S3Response.put_object

    def put_object(self, *args, **kwargs):  # as S3: a conditional write's check and write are one step
        with _one_at_a_time:
            return _put_object(self, *args, **kwargs)

    S3Response.put_object = put_object
server.main()
"""
"""moto's server, each ``PutObject`` one at a time (a ``python -c`` program; moto's arguments follow)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class MotoServer:
    """``python -m moto.server`` on a free loopback port; ``client()`` gives a boto3 S3 client on it."""

    def __init__(
        self,
        *,
        python: str = sys.executable,
        log: Path | None = None,
        atomic: bool = True,
        check_delay: float = 0.0,
    ) -> None:
        self.python = python
        self.log = log
        self.atomic = atomic  # False: moto's PutObject as it comes (see the module's docstring)
        self.check_delay = check_delay  # seconds added to each object look-up (widens a race's window)
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The endpoint URL."""
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """Environment for a child process that talks to this server (see ``client_from_env``)."""
        return {**CREDENTIALS, "VOLCANO_TEST_S3_ENDPOINT": self.url}

    def start(self, timeout: float = 30.0) -> MotoServer:
        """Start the process and wait until it answers."""
        self.port = _free_port()
        sink: Any = open(self.log, "wb") if self.log else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(
            [self.python, "-c", SERVER, "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={
                **os.environ,
                **CREDENTIALS,
                "VOLCANO_TEST_MOTO_ATOMIC": "1" if self.atomic else "0",
                "VOLCANO_TEST_MOTO_CHECK_DELAY": str(self.check_delay),
            },
        )
        if self.log:
            sink.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto server exited with {self.proc.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"moto server did not answer on {self.url} within {timeout} s")

    def stop(self) -> None:
        """Stop the process (terminate, then kill)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def client(self) -> Any:
        """A boto3 S3 client on this server."""
        return client_for(self.url)

    def bucket(self, *, versioned: bool = False) -> str:
        """Create a fresh bucket and return its name."""
        name = f"t-{uuid.uuid4().hex[:20]}"
        s3 = self.client()
        s3.create_bucket(Bucket=name)
        if versioned:
            s3.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
        return name

    def __enter__(self) -> MotoServer:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def client_for(url: str) -> Any:
    """A boto3 S3 client on ``url`` with the test credentials (path-style addressing)."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=url,
        aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        region_name=CREDENTIALS["AWS_DEFAULT_REGION"],
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 3, "mode": "standard"}),
    )


def client_from_env() -> Any:
    """A boto3 S3 client on ``$VOLCANO_TEST_S3_ENDPOINT`` (set by ``MotoServer.env``)."""
    return client_for(os.environ["VOLCANO_TEST_S3_ENDPOINT"])
