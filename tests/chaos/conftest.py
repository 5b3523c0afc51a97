"""Fixtures for the chaos suite."""

from __future__ import annotations

import uuid

import pytest


@pytest.fixture(scope="session")
def chaos_pg_dsn(pg_dsn: str) -> str:
    """The root ``pg_dsn`` (skips, or fails under VOLCANO_TEST_REQUIRE_POSTGRES=1, when unreachable)."""
    return pg_dsn


@pytest.fixture
def chaos_table() -> str:
    """A table name no other test or helper uses."""
    return f"chaos_t_{uuid.uuid4().hex[:12]}"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print the chaos checker's lines, so a ``make test`` log shows them."""
    from .test_chaos_run import LINES

    if LINES:
        terminalreporter.section("chaos checker")
        for line in LINES:
            terminalreporter.write_line(line)
