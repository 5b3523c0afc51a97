"""Fixtures of the fencing tests: a user's tables on any tested driver (``make_target``, ``target``)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .helpers import ASYNC_DRIVERS, PG_DRIVERS, SqlTarget, driver_url

ALL_DRIVERS = ["sqlite", "aiosqlite", *(pytest.param(d, marks=pytest.mark.postgres) for d in PG_DRIVERS)]
SYNC_DRIVERS = [
    "sqlite",
    pytest.param("psycopg", marks=pytest.mark.postgres),
    pytest.param("psycopg2", marks=pytest.mark.postgres),
]


@pytest.fixture
def make_target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., SqlTarget]]:
    """``make_target(driver, **options)``: a fresh user's tables on ``driver`` (dropped afterwards).

    Every target of one test shares its database (one SQLite file, or the test PostgreSQL) and its table
    names, so two targets of a test are two writers of the same tables.
    """
    name = f"fsql_{uuid.uuid4().hex[:10]}"
    made: list[SqlTarget] = []

    def make(driver: str, **options: Any) -> SqlTarget:
        pg = request.getfixturevalue("pg_dsn") if driver in PG_DRIVERS else None
        url = driver_url(driver, sqlite_file=tmp_path / "warehouse.sqlite3", pg_dsn=pg)
        target = SqlTarget(url, name, is_async=driver in ASYNC_DRIVERS, **options)
        if not made:
            target.create()
        made.append(target)
        return target

    yield make
    for target in made[1:]:
        target.close()
    if made:
        made[0].drop()


@pytest.fixture(params=ALL_DRIVERS)
def target(request: pytest.FixtureRequest, make_target: Callable[..., SqlTarget]) -> SqlTarget:
    """The user's tables on each tested driver in turn."""
    return make_target(request.param)
