"""The protected resource in each store (the shared table, FencedSQL, AsyncFencedSQL, FencedS3Prefix): the
fencing check and the record of every attempt that the checker reads, on SQLite and PostgreSQL (S3: moto)."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .adapter_stores import AsyncSqlStore, S3Store, SqlStore
from .checker import check
from .fenced_store import open_store


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "protected.db")
    return str(request.getfixturevalue("chaos_pg_dsn"))


@pytest.fixture(params=["table", "sql", "sql-async", "s3"])
def opener(request: pytest.FixtureRequest, store_url: str, chaos_table: str) -> Callable[[], Any]:
    """Opens the resource in one store kind (each call a new handle on the same resource)."""
    if request.param == "table":
        return lambda: open_store(store_url, chaos_table)
    if request.param == "sql":
        return lambda: SqlStore(store_url, chaos_table, "chaos")
    if request.param == "sql-async":
        return lambda: AsyncSqlStore(store_url, chaos_table, "chaos")
    if "sqlite" not in request.node.callspec.id:
        pytest.skip("the S3 store does not depend on the database: run once")
    server = request.getfixturevalue("s3_server")
    bucket = server.bucket(versioned=True)
    return lambda: S3Store(server.client(), bucket, chaos_table, "chaos")


@pytest.fixture
def store(opener: Callable[[], Any]) -> Iterator[Any]:
    s = opener()
    yield s
    s.drop()
    s.close()


def test_fencing_rejects_lower_tokens_and_records_every_attempt(store: Any) -> None:
    big = 4503599627370497  # tokens are 64-bit; this one does not fit a double exactly
    assert store.write(5, "a", writer="w0", cs=0)
    assert store.write(5, "b", writer="w0", cs=0)  # the same lease writes again
    assert not store.write(3, "stale", writer="w1", cs=0)
    assert store.write(big, "c", writer="w2", cs=1)
    assert not store.write(big - 1, "stale", writer="w3", cs=0, late=True)
    assert store.current() == (big, "c")
    rows = store.writes()
    assert [(r.fencing_token, r.accepted, r.late) for r in rows] == [
        (5, True, False),
        (5, True, False),
        (3, False, False),
        (big, True, False),
        (big - 1, False, True),
    ]
    assert [r.seq for r in rows] == [1, 2, 3, 4, 5]
    assert [(r.writer, r.cs) for r in rows] == [("w0", 0), ("w0", 0), ("w1", 0), ("w2", 1), ("w3", 0)]


def test_concurrent_writers_never_get_a_stale_write_accepted(opener: Callable[[], Any]) -> None:
    """Writers race with shuffled tokens on separate connections; table order must stay monotonic."""
    setup = opener()
    setup.current()  # creates the tables before the writers race to
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            s = opener()
            rng = random.Random(n)
            for _ in range(40):
                s.write(rng.randrange(1, 200), f"w{n}", writer=f"w{n}", cs=0)
            s.close()
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    try:
        assert not errors
        rows = [r.as_dict() for r in setup.writes()]
        assert len(rows) == 160
        report = check([], rows)
        assert report.stale_accepted == 0
        assert report.writes + report.rejected == 160
        assert report.rejected > 0  # shuffled tokens: fencing had work to do
        assert setup.current()[0] == max(r["token"] for r in rows if r["accepted"])
    finally:
        setup.drop()
        setup.close()


def test_table_name_is_validated(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="table"):
        open_store(str(tmp_path / "x.db"), "bad; drop table x")
