"""FencedSQL on real SQLite and PostgreSQL: the guard row decides, in the user's own transaction."""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from volcano_locks.fencing import Fence, FencedSQL, StaleFencingToken

from .helpers import PARTS, SqlTarget, sql_engine

KEY = "orders-lock"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SqlTarget]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'warehouse.sqlite3'}"
    else:
        url = request.getfixturevalue("pg_sqlalchemy_url")
    engine = sql_engine(url)
    t = SqlTarget(engine, f"fsql_{uuid.uuid4().hex[:10]}")
    t.create()
    try:
        yield t
    finally:
        t.drop()
        engine.dispose()


def test_an_accepted_write_commits_the_statements_and_the_guard(target: SqlTarget) -> None:
    target.write("orders", Fence(KEY, 7), "a")
    assert target.orders_of("orders") == [(7, "a", p) for p in range(PARTS)]
    assert target.total_of("orders") == (1, "a")
    assert target.fenced.read("orders") == Fence(KEY, 7)
    target.write("orders", Fence(KEY, 7), "a-again")  # the same holder writes again: an equal token
    target.write("orders", {"lock_key": KEY, "fencing_token": 9}, "b")  # Airflow's volcano_lease form
    assert target.total_of("orders") == (3, "b")
    assert target.fenced.read("orders") == Fence(KEY, 9)


def test_an_older_token_rolls_back_and_names_resource_token_and_stored(target: SqlTarget) -> None:
    target.write("orders", Fence(KEY, 9), "new")
    with pytest.raises(StaleFencingToken) as refused:
        target.write("orders", Fence(KEY, 8), "stale")
    exc = refused.value
    assert (exc.resource, exc.fencing_token, exc.stored_token, exc.code) == (
        "orders",
        8,
        9,
        "stale_fencing_token",
    )
    assert "'orders'" in str(exc) and "fencing token 8" in str(exc) and "stored fencing token 9" in str(exc)
    assert {w for _, w, _ in target.orders_of("orders")} == {"new"}  # nothing of the stale job
    assert target.total_of("orders") == (1, "new")


def test_statements_before_a_refused_claim_roll_back_with_it(target: SqlTarget) -> None:
    target.write("orders", Fence(KEY, 5), "new")
    with pytest.raises(StaleFencingToken), target.engine.begin() as conn:
        conn.execute(
            target.orders.insert().values(resource="orders", fencing_token=4, writer="early", part=0)
        )
        target.fenced.claim(conn, "orders", Fence(KEY, 4))
    assert "early" not in {w for _, w, _ in target.orders_of("orders")}


def test_another_lock_key_is_refused_and_said_so(target: SqlTarget) -> None:
    target.write("orders", Fence(KEY, 3), "a")
    with pytest.raises(StaleFencingToken, match="another lock") as refused:
        target.write("orders", Fence("other-lock", 100), "b")
    assert refused.value.stored == Fence(KEY, 3)
    assert target.total_of("orders") == (1, "a")


def test_a_failed_body_rolls_the_guard_back_too(target: SqlTarget) -> None:
    with pytest.raises(ZeroDivisionError), target.fenced.begin("orders", Fence(KEY, 50)) as conn:
        conn.execute(target.orders.insert().values(resource="orders", fencing_token=50, writer="x", part=0))
        1 / 0  # noqa: B018
    assert target.fenced.read("orders") is None and target.orders_of("orders") == []
    target.write("orders", Fence(KEY, 2), "later")  # the guard did not advance to 50
    assert target.total_of("orders") == (1, "later")


def test_concurrent_writers_never_lose_an_accepted_write(target: SqlTarget) -> None:
    """Eight threads, tokens in random order, each a read-modify-write: every accepted write counts once."""
    tokens = list(range(1, 41))
    random.Random(3).shuffle(tokens)
    accepted: list[int] = []
    refused: list[tuple[int, int | None]] = []
    lock = threading.Lock()

    def run(mine: list[int]) -> None:
        for token in mine:
            try:
                target.write("orders", Fence(KEY, token), f"w{token}", pause=0.002)
                with lock:
                    accepted.append(token)
            except StaleFencingToken as exc:
                with lock:
                    refused.append((token, exc.stored_token))

    threads = [threading.Thread(target=run, args=(tokens[i::8],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a fenced writer hung"
    assert len(accepted) + len(refused) == len(tokens) and accepted
    assert target.total_of("orders") is not None
    assert target.total_of("orders")[0] == len(accepted)  # type: ignore[index]  # no lost update
    rows = target.orders_of("orders")
    assert len(rows) == PARTS * len(accepted)  # every accepted job whole, no refused job's part
    committed = [t for t, _, p in rows if p == 0]
    assert committed == sorted(committed) and set(committed) == set(accepted)  # the token never went back
    assert all(stored is not None and stored > token for token, stored in refused)
    assert target.fenced.read("orders") == Fence(KEY, max(accepted))


def test_two_writers_of_one_resource_wait_for_each_other_without_deadlock(target: SqlTarget) -> None:
    errors: list[BaseException] = []

    def run(writer: str) -> None:
        try:
            target.write("orders", Fence(KEY, 4), writer, pause=0.4)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(w,)) for w in ("a", "b")]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and not any(t.is_alive() for t in threads)
    assert time.monotonic() - start < 60  # a bound that only catches a hang
    assert target.total_of("orders") is not None and target.total_of("orders")[0] == 2  # type: ignore[index]


def test_bad_configuration_is_refused_where_it_is_written(tmp_path: Path) -> None:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'x.sqlite3'}")
    with pytest.raises(TypeError, match="str"):
        FencedSQL("sqlite:///x.db")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'bad name'"):
        FencedSQL(engine, guard_table="bad name")
    fenced = FencedSQL(engine)
    with pytest.raises(TypeError, match="got int"), engine.connect() as conn:
        fenced.claim(conn, "orders", 5)
    with pytest.raises(ValueError, match="resource"):
        fenced.read("")
    engine.dispose()


def test_repr_names_no_credentials() -> None:
    engine = sa.create_engine("postgresql+psycopg://etl:hunter2-secret@db.example:5432/wh")
    assert "hunter2" not in repr(FencedSQL(engine)) and "postgresql" in repr(FencedSQL(engine))


@pytest.mark.parametrize("where", ["engine", "connection"])
def test_an_autocommit_connection_is_refused_because_the_guard_would_commit_alone(
    target: SqlTarget, where: str
) -> None:
    url = target.engine.url
    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT") if where == "engine" else target.engine
    fenced = FencedSQL(engine, guard_table=target.fenced.table.name)
    try:
        with pytest.raises(ValueError, match="autocommit"):
            if where == "engine":
                with fenced.begin("orders", Fence(KEY, 1)):
                    pass
            else:
                with engine.connect() as conn:
                    fenced.claim(
                        conn.execution_options(isolation_level="AUTOCOMMIT"), "orders", Fence(KEY, 1)
                    )
    finally:
        if where == "engine":
            engine.dispose()
