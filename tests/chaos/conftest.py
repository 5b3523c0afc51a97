"""Fixtures for the chaos suite."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

PG_DSN = os.environ.get("VOLCANO_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")


def _postgres_reachable(dsn: str) -> str | None:
    try:
        import psycopg

        with psycopg.connect(dsn, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:  # any failure means "not usable here"; the reason is reported
        return f"{type(exc).__name__}: {exc}"
    return None


@pytest.fixture(scope="session")
def chaos_pg_dsn() -> str:
    """A PostgreSQL DSN, or skip (fail under VOLCANO_TEST_REQUIRE_POSTGRES=1) when unreachable."""
    problem = _postgres_reachable(PG_DSN)
    if problem is not None:
        message = f"PostgreSQL at {PG_DSN.split('@')[-1]} unreachable ({problem})"
        if os.environ.get("VOLCANO_TEST_REQUIRE_POSTGRES") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return PG_DSN


@pytest.fixture
def chaos_table() -> str:
    """A table name no other test or helper uses."""
    return f"chaos_t_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def chaos_pg_store_url(chaos_pg_dsn: str) -> Iterator[str]:
    """The PostgreSQL DSN for a fenced-store test (tables dropped by the test)."""
    yield chaos_pg_dsn


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print the chaos checker's lines, so a ``make test`` log shows them."""
    from .test_chaos_run import LINES

    if LINES:
        terminalreporter.section("chaos checker")
        for line in LINES:
            terminalreporter.write_line(line)
