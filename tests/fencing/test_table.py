"""FencedTable on SQLite and PostgreSQL: a stale fencing token never lands, whoever writes when."""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from volcano_locks import VolcanoLocks
from volcano_locks.fencing import FencedTable, StaleFencingToken
from volcano_locks.server.harness import LocalServer


@pytest.fixture(params=["sqlite", "postgres"])
def table(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[FencedTable]:
    name = f"fenced_{uuid.uuid4().hex[:10]}"
    if request.param == "sqlite":
        yield FencedTable(str(tmp_path / "fenced.sqlite3"), table=name)
        return
    dsn: str = request.getfixturevalue("pg_dsn")
    yield FencedTable(dsn, table=name)
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {name}, {name}_history")


def test_newer_or_equal_tokens_land_older_ones_do_not(table: FencedTable) -> None:
    assert table.write("r", "k", 5, "first", writer="a")
    assert table.write("r", "k", 5, "same lease again", writer="a")  # renewals keep the token
    assert table.write("r", "k", 9, "newer holder", writer="b")
    assert not table.write("r", "k", 5, "late write of the old holder", writer="a")
    current = table.read("r")
    assert current is not None
    assert (current.fencing_token, current.value, current.writer) == (9, "newer holder", "b")
    assert [(w.fencing_token, w.accepted) for w in table.history("r")] == [
        (5, True),
        (5, True),
        (9, True),
        (5, False),
    ]


def test_stale_write_raises_naming_both_tokens(table: FencedTable) -> None:
    table.write_or_raise("r", "k", 7, "v")
    with pytest.raises(StaleFencingToken, match=r"fencing token 3 is older than the stored fencing token 7"):
        table.write_or_raise("r", "k", 3, "late")
    assert table.read("r") is not None and table.read("r").value == "v"  # type: ignore[union-attr]


def test_tokens_of_another_lock_key_are_not_comparable(table: FencedTable) -> None:
    assert table.write("r", "key-a", 1, "a")
    assert not table.write("r", "key-b", 100, "b")
    assert table.read("r").lock_key == "key-a"  # type: ignore[union-attr]


def test_concurrent_writers_leave_the_highest_token(table: FencedTable) -> None:
    tokens = list(range(1, 41))
    barrier = threading.Barrier(4)

    def writer(mine: list[int]) -> None:
        barrier.wait()
        for token in mine:
            table.write("r", "k", token, f"v{token}", writer=str(token))

    threads = [threading.Thread(target=writer, args=(tokens[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    history = table.history("r")
    assert len(history) == 40
    accepted = [w.fencing_token for w in history if w.accepted]
    assert accepted == sorted(accepted), "an accepted write went backwards"
    assert table.read("r").fencing_token == 40  # type: ignore[union-attr]


def test_bad_arguments_are_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=re.escape("Robert'); DROP")):
        FencedTable(str(tmp_path / "x.sqlite3"), table="Robert'); DROP")
    with pytest.raises(TypeError, match="'7'"):
        FencedTable(str(tmp_path / "x.sqlite3")).write("r", "k", "7", "v")  # type: ignore[arg-type]


def test_a_holder_that_lost_its_lease_cannot_overwrite(
    volcano_server: LocalServer, unique_key: str, tmp_path: Path
) -> None:
    table = FencedTable(str(tmp_path / "fenced.sqlite3"))
    with VolcanoLocks(api_url=volcano_server.url, service_key=volcano_server.service_key) as client:
        old = client.acquire(unique_key, 30)
        client.force_release(unique_key)  # the old holder does not know yet
        new = client.acquire(unique_key, 30)
        try:
            assert new.fencing_token > old.fencing_token
            table.write_or_raise("report", unique_key, new.fencing_token, "new holder's report")
            with pytest.raises(StaleFencingToken):
                table.write_or_raise("report", unique_key, old.fencing_token, "old holder's late report")
        finally:
            client.release(unique_key, new)
    assert table.read("report").value == "new holder's report"  # type: ignore[union-attr]
