"""Server-test fixtures: the real HTTP server over loopback, per storage, on a manual clock."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from volcano_locks.server.clock import ManualClock
from volcano_locks.server.harness import InProcessServer

from .helpers import Raw, drop_schema, with_schema

START = 1_800_000_000.0  # a whole clock minute, so quota windows are easy to reason about


@pytest.fixture(params=["sqlite", "postgres"])
def storage_db(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A fresh database for one test: a SQLite file, or a new PostgreSQL schema dropped afterwards."""
    if request.param == "sqlite":
        yield str(tmp_path_factory.mktemp("db") / "locks.sqlite3")
        return
    dsn: str = request.getfixturevalue("pg_dsn")
    schema = f"vl_test_{uuid.uuid4().hex[:12]}"
    yield with_schema(dsn, schema)
    drop_schema(dsn, schema)


@pytest.fixture
def clock() -> ManualClock:
    """The server's wall clock, moved only by the test."""
    return ManualClock(START)


@pytest.fixture
def server(storage_db: str, clock: ManualClock) -> Iterator[InProcessServer]:
    """The real HTTP server on a thread with the manual clock, no quota to speak of."""
    with InProcessServer(db=storage_db, clock=clock, quota=1_000_000, admin=True) as srv:
        yield srv


@pytest.fixture
def raw(server: InProcessServer) -> Iterator[Raw]:
    """A raw contract client with the server's full-access service key."""
    with Raw(server.url, server.service_key) as client:
        yield client
