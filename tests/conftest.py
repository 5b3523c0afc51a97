"""Root fixtures shared by every test package: a session server, unique lock keys, a PostgreSQL DSN."""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator

import pytest

from volcano_locks.server.harness import LocalServer

PG_DSN_DEFAULT = "postgresql://postgres@127.0.0.1:5432/test"


@pytest.fixture(scope="session")
def volcano_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    """A `volcano-locks serve` subprocess for the whole session: tmp SQLite db, admin on, quota 1,000,000.

    Shared by every test: use `unique_key` for lock names. Faults set with `set_faults` are cleared
    after each test that used it.
    """
    db = tmp_path_factory.mktemp("volcano-server") / "locks.sqlite3"
    with LocalServer(db=str(db), admin=True, quota=1_000_000) as srv:
        yield srv


@pytest.fixture(autouse=True)
def _volcano_server_faults_reset(request: pytest.FixtureRequest) -> Iterator[None]:
    """Clear runtime faults on the shared server after any test that used it, even a failed one."""
    yield
    if "volcano_server" in request.fixturenames:
        srv: LocalServer = request.getfixturevalue("volcano_server")
        if srv.running and srv.faults():
            srv.set_faults(None)


@pytest.fixture
def unique_key(request: pytest.FixtureRequest) -> str:
    """A fresh lock key for this test (valid per the contract's key pattern, <= 128 chars)."""
    name = re.sub(r"[^A-Za-z0-9._:-]", "-", request.node.name)[:80].strip("-._:") or "test"
    return f"t-{name}-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def pg_dsn() -> str:
    """DSN of the test PostgreSQL ($VOLCANO_TEST_PG_DSN or 127.0.0.1:5432/test).

    Skips when unreachable, unless VOLCANO_TEST_REQUIRE_POSTGRES=1 (then the test fails). Use your own
    schema/table names; the server takes `?schema=NAME` on the DSN.
    """
    dsn = os.environ.get("VOLCANO_TEST_PG_DSN", PG_DSN_DEFAULT)
    try:
        import psycopg

        with psycopg.connect(dsn, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:
        message = f"PostgreSQL not reachable at {dsn.split('@')[-1]}: {type(exc).__name__}: {exc}"
        if os.environ.get("VOLCANO_TEST_REQUIRE_POSTGRES") == "1":
            pytest.fail(message + " (VOLCANO_TEST_REQUIRE_POSTGRES=1)")
        pytest.skip(message)
    return dsn
