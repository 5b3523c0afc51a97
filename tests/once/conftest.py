"""Fixtures of the run-once tests: a warehouse (the user's table and a ledger) on SQLite or PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .helpers import Warehouse, sqlite_url


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def warehouse(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Warehouse]:
    """The user's rollup table and a ledger beside it, on SQLite and on the test PostgreSQL."""
    postgres = request.param == "postgresql"
    url = request.getfixturevalue("pg_sqlalchemy_url") if postgres else sqlite_url(tmp_path)
    made = Warehouse(url)
    yield made
    made.drop()
