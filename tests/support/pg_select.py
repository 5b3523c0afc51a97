"""Which PostgreSQL the tests use, and why: one pure choice over three facts, plus the real probes.

In order: ``$VOLCANO_TEST_POSTGRES_DSN`` (or the older ``$VOLCANO_TEST_PG_DSN``) when set; else the
local server at 127.0.0.1:5432 (trust, database ``test``) when it answers; else a throwaway
``testcontainers`` PostgreSQL when a Docker engine is reachable; else none, with a reason that says
what was tried. ``VOLCANO_TEST_REQUIRE_POSTGRES=1`` (CI) turns "none" into a failure.

`choose` only combines what the probes report, so it is tested with injected probes; `local_probe`
and `docker_probe` are the real ones, and `postgres_container` starts the container.
"""

from __future__ import annotations

import enum
import secrets
import shutil
import socket
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NoReturn
from urllib.parse import urlsplit

import pytest

DSN_ENV = "VOLCANO_TEST_POSTGRES_DSN"
LEGACY_DSN_ENV = "VOLCANO_TEST_PG_DSN"
REQUIRE_ENV = "VOLCANO_TEST_REQUIRE_POSTGRES"
LOCAL_DSN = "postgresql://postgres@127.0.0.1:5432/test"
# The major version CI runs (Debian 12's postgresql-15).
CONTAINER_IMAGE = "postgres:15"
DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"
CONNECT_TIMEOUT_S = 3


class Source(enum.Enum):
    """Where the tests' PostgreSQL comes from."""

    ENV = "env"
    LOCAL = "local"
    CONTAINER = "container"
    NONE = "none"


@dataclass(frozen=True)
class Probe:
    """What one probe found: whether the thing is there, and a sentence saying what was seen."""

    ok: bool
    detail: str


@dataclass(frozen=True)
class Choice:
    """The PostgreSQL to use (``dsn`` is None for a container not started yet, and for none)."""

    source: Source
    dsn: str | None
    reason: str
    required: bool


def redact(dsn: str) -> str:
    """The DSN without its user and password: ``host:port/db`` (what may go into a message)."""
    parts = urlsplit(dsn)
    if parts.hostname is None:
        return "<a DSN without a host>"
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.hostname}{port}{parts.path}"


def choose(env: Mapping[str, str], local: Callable[[], Probe], docker: Callable[[], Probe]) -> Choice:
    """Pick the tests' PostgreSQL from the environment and two probes, calling a probe only when needed.

    Args:
        env: The process environment (``os.environ``), read for the DSN and require switches.
        local: Reports whether PostgreSQL at 127.0.0.1:5432 accepts ``LOCAL_DSN``.
        docker: Reports whether a Docker engine is reachable for a testcontainers PostgreSQL.

    Returns:
        The choice; for `Source.NONE` the reason names everything that was tried.
    """
    required = env.get(REQUIRE_ENV) == "1"
    for name in (DSN_ENV, LEGACY_DSN_ENV):
        if dsn := env.get(name, "").strip():
            return Choice(Source.ENV, dsn, f"${name} is set ({redact(dsn)})", required)
    found = local()
    if found.ok:
        return Choice(Source.LOCAL, LOCAL_DSN, f"PostgreSQL answers at {redact(LOCAL_DSN)}", required)
    engine = docker()
    if engine.ok:
        reason = f"{found.detail}; starting a testcontainers {CONTAINER_IMAGE}: {engine.detail}"
        return Choice(Source.CONTAINER, None, reason, required)
    reason = (
        f"no PostgreSQL for the tests: ${DSN_ENV} is not set; {found.detail}; {engine.detail}. "
        f"Start PostgreSQL at 127.0.0.1:5432 (trust, database 'test'), set ${DSN_ENV}, or start Docker"
    )
    return Choice(Source.NONE, None, reason, required)


def unavailable(reason: str, required: bool) -> NoReturn:
    """Skip the test for want of PostgreSQL, or fail it when PostgreSQL is required (CI)."""
    if required:
        pytest.fail(f"{reason} ({REQUIRE_ENV}=1)")
    pytest.skip(reason)


def connect_problem(dsn: str, timeout: int = CONNECT_TIMEOUT_S) -> str | None:
    """None when ``SELECT 1`` works on ``dsn``; else what went wrong (the DSN redacted)."""
    import psycopg

    try:
        with psycopg.connect(dsn, connect_timeout=timeout) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:
        # psycopg names host, port and user but never the password; one line keeps the reason readable.
        lines = str(exc).strip().splitlines()
        return f"{type(exc).__name__}: {lines[0] if lines else ''}"
    return None


def local_probe(dsn: str = LOCAL_DSN) -> Probe:
    """The real probe: does the local PostgreSQL accept ``dsn`` (default 127.0.0.1:5432/test)?"""
    problem = connect_problem(dsn)
    if problem is None:
        return Probe(True, f"PostgreSQL answers at {redact(dsn)}")
    return Probe(False, f"nothing usable answers at {redact(dsn)} ({problem})")


def docker_probe() -> Probe:
    """The real probe: is a Docker engine reachable where testcontainers would look for one?

    Testcontainers' own lookup (``tc.host`` in ~/.testcontainers.properties, ``$DOCKER_HOST``, the
    current docker context) names the engine; the Docker SDK pings it. The sentence also says whether
    a ``docker`` client is installed, since "client present, no engine" is the common confusing case.
    """
    import docker
    from testcontainers.core.docker_client import get_docker_host

    host = get_docker_host() or DEFAULT_DOCKER_HOST
    cli = shutil.which("docker")
    try:
        _reach(host)
        # The shell ssh client, as testcontainers uses for ssh:// hosts (paramiko trips on captured stdin).
        client = docker.DockerClient(
            base_url=host, timeout=CONNECT_TIMEOUT_S, use_ssh_client=host.startswith("ssh://")
        )
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:
        seen = f"{type(exc).__name__}: {exc}"
        if cli:
            return Probe(
                False,
                f"the docker client {cli} is installed, but no Docker engine answers at {host} ({seen})",
            )
        return Probe(False, f"no Docker engine answers at {host} and no docker client is installed ({seen})")
    return Probe(True, f"a Docker engine answers at {host}")


def _reach(host: str) -> None:
    """Connect to a unix:// or tcp:// Docker host and hang up; raises OSError when nothing listens.

    The Docker SDK leaks its socket when a unix-socket connect fails (an unclosed-socket warning, an
    error under ``filterwarnings = error``), so the common "no daemon" case is settled here first.
    """
    parts = urlsplit(host)
    if parts.scheme in ("unix", "http+unix"):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(CONNECT_TIMEOUT_S)
            sock.connect(parts.path)
    elif parts.scheme in ("tcp", "http", "https") and parts.hostname:
        port = parts.port or (2376 if parts.scheme == "https" else 2375)
        socket.create_connection((parts.hostname, port), timeout=CONNECT_TIMEOUT_S).close()


@contextmanager
def postgres_container(image: str = CONTAINER_IMAGE) -> Iterator[str]:
    """Run a throwaway PostgreSQL (database ``test``) in Docker; yields its DSN, removes it afterwards."""
    from testcontainers.community.postgres import PostgresContainer

    password = secrets.token_hex(16)
    with PostgresContainer(image, username="postgres", password=password, dbname="test", driver=None) as pg:
        yield pg.get_connection_url(driver=None)
