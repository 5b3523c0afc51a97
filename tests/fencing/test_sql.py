"""FencedSQL and AsyncFencedSQL on real SQLite and PostgreSQL, every driver: the guard row decides.

Each behaviour runs on every driver a user can pass (``conftest.ALL_DRIVERS``: sqlite3, aiosqlite, psycopg,
psycopg2, asyncpg, psycopg's async side) unless it is about a sync-only or driver-only matter.
"""

from __future__ import annotations

import asyncio
import random
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import orm
from sqlalchemy.ext.asyncio import create_async_engine

from volcano_locks.fencing import AsyncFencedSQL, Fence, FenceBusy, FencedSQL, StaleFencingToken

from .conftest import SYNC_DRIVERS
from .helpers import PARTS, SqlTarget

KEY = "orders-lock"


def test_an_accepted_write_commits_the_statements_and_the_guard(target: SqlTarget) -> None:
    target.write("orders", Fence(KEY, 7), "a")
    assert target.orders_of("orders") == [(7, "a", p) for p in range(PARTS)]
    assert target.total_of("orders") == (1, "a")
    assert target.guard.read("orders") == Fence(KEY, 7)
    target.write("orders", Fence(KEY, 7), "a-again")  # the same holder writes again: an equal token
    target.write("orders", {"lock_key": KEY, "fencing_token": 9}, "b")  # Airflow's volcano_lease form
    assert target.total_of("orders") == (3, "b")
    assert target.guard.read("orders") == Fence(KEY, 9)


def test_an_older_token_rolls_back_and_names_resource_token_and_stored(target: SqlTarget) -> None:
    target.write("orders", Fence(KEY, 9), "new")
    with pytest.raises(StaleFencingToken) as refused:
        target.write("orders", Fence(KEY, 8), "stale")
    exc = refused.value
    assert (exc.resource, exc.fencing_token, exc.stored_token, exc.code, exc.another_lock) == (
        "orders",
        8,
        9,
        "stale_fencing_token",
        False,
    )
    assert "'orders'" in str(exc) and "fencing token 8" in str(exc) and "stored fencing token 9" in str(exc)
    assert "no longer holds the lock" in str(exc)
    assert {w for _, w, _ in target.orders_of("orders")} == {"new"}  # nothing of the stale job
    assert target.total_of("orders") == (1, "new")


def test_another_lock_key_is_refused_and_told_which_lock_fences_it(target: SqlTarget) -> None:
    target.write("orders", Fence(KEY, 3), "a")
    with pytest.raises(StaleFencingToken) as refused:
        target.write("orders", Fence("other-lock", 100), "b")
    exc = refused.value
    assert exc.stored == Fence(KEY, 3) and exc.another_lock and exc.lock_key == "other-lock"
    text = str(exc)
    assert f"fenced by lock {KEY!r}" in text and "tokens of lock 'other-lock' do not compare" in text
    assert f"write 'orders' under lock {KEY!r}" in text
    assert "no longer holds" not in text and "older" not in text  # its writer may well hold its own lock
    assert target.total_of("orders") == (1, "a")


@pytest.mark.parametrize("driver", SYNC_DRIVERS)
def test_statements_before_a_refused_claim_roll_back_with_it(
    make_target: Callable[..., SqlTarget], driver: str
) -> None:
    target = make_target(driver)
    target.write("orders", Fence(KEY, 5), "new")
    with pytest.raises(StaleFencingToken), target.engine.begin() as conn:
        conn.execute(
            target.orders.insert().values(resource="orders", fencing_token=4, writer="early", part=0)
        )
        target.fenced.claim(conn, "orders", Fence(KEY, 4))
    assert "early" not in {w for _, w, _ in target.orders_of("orders")}


def test_a_failed_body_rolls_the_guard_back_too(target: SqlTarget) -> None:
    class Boom(Exception):
        pass

    async def afail() -> None:
        async with target.fenced.begin("orders", Fence(KEY, 50)) as conn:
            await conn.execute(target._rows("orders", 50, "x")[0])
            raise Boom

    with pytest.raises(Boom):
        if target.is_async:
            asyncio.run(afail())
        else:
            with target.fenced.begin("orders", Fence(KEY, 50)) as conn:
                conn.execute(target._rows("orders", 50, "x")[0])
                raise Boom
    assert target.guard.read("orders") is None and target.orders_of("orders") == []
    target.write("orders", Fence(KEY, 2), "later")  # the guard did not advance to 50
    assert target.total_of("orders") == (1, "later")


def test_concurrent_writers_never_lose_an_accepted_write(target: SqlTarget) -> None:
    """Six threads, tokens in random order, each a read-modify-write: every accepted write counts once."""
    tokens = list(range(1, 31))
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

    threads = [threading.Thread(target=run, args=(tokens[i::6],)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a fenced writer hung"
    assert len(accepted) + len(refused) == len(tokens) and accepted
    total = target.total_of("orders")
    assert total is not None and total[0] == len(accepted)  # no lost update
    rows = target.orders_of("orders")
    assert len(rows) == PARTS * len(accepted)  # every accepted job whole, no refused job's part
    committed = [t for t, _, p in rows if p == 0]
    assert committed == sorted(committed) and set(committed) == set(accepted)  # the token never went back
    assert all(stored is not None and stored > token for token, stored in refused)
    assert target.guard.read("orders") == Fence(KEY, max(accepted))


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
    total = target.total_of("orders")
    assert total is not None and total[0] == 2


def _batches(target: SqlTarget) -> list[tuple[int, str]]:
    """(token, writer) of each batch of order rows of "orders", in insertion order."""
    return [(t, w) for t, w, p in target.orders_of("orders") if p % PARTS == 0]


# -- commit-as-you-go: a claim covers every transaction until it ends ---------------------------------


def _count_statements(engine: sa.Engine) -> list[str]:
    seen: list[str] = []
    sa.event.listen(engine, "before_cursor_execute", lambda *a, **_: seen.append(str(a[2]).split()[0]))
    return seen


@pytest.mark.parametrize("driver", SYNC_DRIVERS)
def test_a_claim_is_taken_again_first_in_each_later_transaction(
    make_target: Callable[..., SqlTarget], driver: str
) -> None:
    target = make_target(driver)
    seen = _count_statements(target.engine)
    with target.engine.connect() as conn:
        with target.fenced.claim(conn, "orders", Fence(KEY, 5)) as claim:
            for batch in range(3):
                for statement in target._rows("orders", 5, "a", batch):
                    conn.execute(statement)
                conn.commit()
            assert claim.active
        assert not claim.active
        conn.execute(sa.select(1))  # after the claim ended: no guard
        conn.commit()
    assert seen.count("INSERT") == 3 * PARTS + 3  # each batch's rows, and one guard per transaction
    assert target.guard.read("orders") == Fence(KEY, 5)
    assert len(target.orders_of("orders")) == 3 * PARTS


def test_commit_as_you_go_after_a_newer_holder_wrote_is_refused_before_the_batch_runs(
    target: SqlTarget,
) -> None:
    """claim(), one batch, commit; a newer holder writes; the next batch on the same connection: refused."""

    async def astale() -> None:
        async with target.async_engine.connect() as conn:
            with await target.fenced.claim(conn, "orders", Fence(KEY, 5)):
                await conn.execute(target._rows("orders", 5, "stale", 0)[0])
                await conn.commit()
                await asyncio.to_thread(target.write, "orders", Fence(KEY, 6), "newer")
                with pytest.raises(StaleFencingToken) as refused:
                    await conn.execute(target._rows("orders", 5, "stale", 1)[0])
                assert refused.value.stored_token == 6
                await conn.rollback()

    if target.is_async:
        asyncio.run(astale())
    else:
        with target.engine.connect() as conn, target.fenced.claim(conn, "orders", Fence(KEY, 5)):
            conn.execute(target._rows("orders", 5, "stale", 0)[0])
            conn.commit()
            target.write("orders", Fence(KEY, 6), "newer")
            with pytest.raises(StaleFencingToken) as refused:
                conn.execute(target._rows("orders", 5, "stale", 1)[0])
            assert refused.value.stored_token == 6
            conn.rollback()
    assert _batches(target) == [(5, "stale"), (6, "newer")]


@pytest.mark.parametrize("driver", SYNC_DRIVERS)
def test_several_claims_on_one_connection_are_taken_again_in_the_order_they_were_made(
    make_target: Callable[..., SqlTarget], driver: str
) -> None:
    target = make_target(driver)
    target.fenced.create_guard_table()
    claimed: list[str] = []

    def note(conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if statement.startswith("INSERT INTO") and target.guard.table.name in statement.split()[2]:
            claimed.append(str(parameters[0] if isinstance(parameters, tuple) else parameters["resource"]))

    sa.event.listen(target.engine, "before_cursor_execute", note)
    with (
        target.engine.connect() as conn,
        target.fenced.claim(conn, "a", Fence(KEY, 1)),
        target.fenced.claim(conn, "b", Fence(KEY, 1)),
    ):
        conn.commit()
        conn.execute(sa.select(1))
        conn.commit()
    assert claimed == ["a", "b", "a", "b"]


@pytest.mark.parametrize("driver", SYNC_DRIVERS)
def test_an_orm_session_bound_to_a_claimed_connection_is_fenced_after_each_commit(
    make_target: Callable[..., SqlTarget], driver: str
) -> None:
    target = make_target(driver)
    with target.engine.connect() as conn, target.fenced.claim(conn, "orders", Fence(KEY, 5)):
        session = orm.Session(bind=conn, join_transaction_mode="control_fully")  # its commit is the claim's
        session.execute(target._rows("orders", 5, "stale", 0)[0])
        session.commit()
        target.write("orders", Fence(KEY, 6), "newer")
        with pytest.raises(StaleFencingToken):
            session.execute(target._rows("orders", 5, "stale", 1)[0])
        session.rollback()
        session.close()
    assert _batches(target) == [(5, "stale"), (6, "newer")]


@pytest.mark.parametrize("driver", SYNC_DRIVERS)
def test_a_commit_inside_begin_is_followed_by_a_new_claim(
    make_target: Callable[..., SqlTarget], driver: str
) -> None:
    target = make_target(driver)
    target.fenced.create_guard_table()
    seen = _count_statements(target.engine)
    with target.fenced.begin("orders", Fence(KEY, 5)) as conn:
        conn.execute(target._rows("orders", 5, "a", 0)[0])
        conn.commit()
        conn.execute(target._rows("orders", 5, "a", 1)[0])
    assert seen.count("INSERT") == 4  # guard, row, guard, row
    assert [p for _, _, p in target.orders_of("orders")] == [0, PARTS]


# -- what cannot be fenced is refused -----------------------------------------------------------------


@pytest.mark.parametrize("where", ["engine", "connection", "driver"])
def test_an_autocommit_session_is_refused_before_any_statement_of_yours(
    target: SqlTarget, make_target: Callable[..., SqlTarget], where: str
) -> None:
    """SQLAlchemy's AUTOCOMMIT on the engine or the connection, or the driver's own autocommit."""
    driver = _driver_of(target)
    if where == "engine":
        writer = make_target(driver, autocommit=True)
        with pytest.raises(ValueError, match="autocommit mode") as refused:
            writer.write("orders", Fence(KEY, 1), "a")
    elif target.is_async:
        if where == "driver":
            pytest.skip("the asyncio adapters set autocommit through SQLAlchemy only")

        async def claim_on_autocommit() -> None:
            async with target.async_engine.connect() as conn:
                autocommit = await conn.execution_options(isolation_level="AUTOCOMMIT")
                await target.fenced.claim(autocommit, "orders", Fence(KEY, 1))

        with pytest.raises(ValueError, match="autocommit mode") as refused:
            asyncio.run(claim_on_autocommit())
    else:
        with pytest.raises(ValueError, match="autocommit mode") as refused, target.engine.connect() as conn:
            if where == "connection":
                conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            else:
                _driver_autocommit(conn)
            target.fenced.claim(conn, "orders", Fence(KEY, 1))
    assert "none of them ran" in str(refused.value) and "without autocommit" in str(refused.value)
    assert target.orders_of("orders") == []


def _driver_of(target: SqlTarget) -> str:
    url = sa.make_url(target.url)
    if url.get_backend_name() == "sqlite":
        return "aiosqlite" if target.is_async else "sqlite"
    if target.is_async:
        return "asyncpg" if url.get_driver_name() == "asyncpg" else "psycopg-async"
    return url.get_driver_name()


def _driver_autocommit(conn: sa.Connection) -> None:
    """Switch the DBAPI connection itself to autocommit, behind SQLAlchemy's back (as a hook might)."""
    dbapi: Any = conn.connection.dbapi_connection
    if isinstance(dbapi, sqlite3.Connection):
        dbapi.isolation_level = None  # sqlite3's autocommit mode
    else:
        dbapi.autocommit = True  # psycopg2 and psycopg


def test_engines_and_drivers_that_cannot_be_fenced_are_refused_when_given(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.sqlite3'}"
    with pytest.raises(TypeError, match="AsyncFencedSQL"):
        FencedSQL(create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'x.sqlite3'}"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="use FencedSQL"):
        AsyncFencedSQL(sa.create_engine(url))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="got str"):
        FencedSQL("sqlite:///x.db")  # type: ignore[arg-type]
    # pg8000 (not installed here: SQLAlchemy builds its dialect from the module it is given) cannot say
    # whether its session is in a transaction.
    pg8000 = sa.create_engine("postgresql+pg8000://u@h/d", module=sqlite3)
    with pytest.raises(ValueError, match=r"postgresql\+pg8000.*postgresql\+psycopg, postgresql\+psycopg2"):
        FencedSQL(pg8000)


def test_bad_configuration_is_refused_where_it_is_written(tmp_path: Path) -> None:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'x.sqlite3'}")
    with pytest.raises(ValueError, match="'bad name'"):
        FencedSQL(engine, guard_table="bad name")
    for bad in (0, -1, float("nan"), True, "30", 10**6):
        with pytest.raises(ValueError, match=f"stall_timeout.*got {bad!r}"):
            FencedSQL(engine, stall_timeout=bad)  # type: ignore[arg-type]
    assert FencedSQL(engine, stall_timeout=None).stall_timeout is None
    fenced = FencedSQL(engine)
    assert fenced.stall_timeout == 30.0
    with pytest.raises(TypeError, match="got int"), engine.connect() as conn:
        fenced.claim(conn, "orders", 5)
    with pytest.raises(ValueError, match="resource"):
        fenced.read("")
    engine.dispose()


def test_a_sync_fenced_engine_does_not_import_sqlalchemys_asyncio_package_or_its_orm(tmp_path: Path) -> None:
    """They cost a task's start up to seconds on a loaded machine; only AsyncFencedSQL needs them."""
    code = (
        "import sys, sqlalchemy as sa\n"
        "from volcano_locks.fencing import Fence, FencedSQL\n"
        f"with FencedSQL(sa.create_engine('sqlite:///{tmp_path / 'x.sqlite3'}')).begin('r', Fence('k', 1)):\n"
        "    pass\n"
        "print(sorted(m for m in ('sqlalchemy.ext.asyncio', 'sqlalchemy.orm') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_repr_names_no_credentials() -> None:
    engine = sa.create_engine("postgresql+psycopg://etl:hunter2-secret@db.example:5432/wh")
    assert "hunter2" not in repr(FencedSQL(engine)) and "postgresql" in repr(FencedSQL(engine))


# -- the guard table: created when missing, no extra statement when it exists ------------------------------


@pytest.mark.parametrize("driver", SYNC_DRIVERS)
def test_the_guard_table_is_created_on_first_use_and_costs_nothing_when_it_exists(
    make_target: Callable[..., SqlTarget], driver: str
) -> None:
    target = make_target(driver)
    assert target.guard.read("orders") is None  # no table yet: nothing written
    target.write("orders", Fence(KEY, 1), "first")  # creates it
    assert sa.inspect(target.engine).has_table(target.guard.table.name)
    fresh = FencedSQL(target.engine, guard_table=target.guard.table.name)  # a new run's first use
    seen = _count_statements(target.engine)
    with fresh.begin("orders", Fence(KEY, 2)) as conn:
        conn.execute(sa.select(1))
    if driver == "sqlite":  # SQLite's catalog is read in-process, once per FencedSQL: no round trip
        assert [s for s in seen if s != "PRAGMA"] == ["INSERT", "SELECT"]
    else:
        assert seen == ["INSERT", "SELECT"]  # the guard and the statement: nothing looked for the table
    assert target.guard.read("orders") == Fence(KEY, 2)
    seen.clear()
    with target.engine.connect() as conn:  # a first claim() in a process asks the catalog once
        FencedSQL(target.engine, guard_table=target.guard.table.name).claim(
            conn, "orders", Fence(KEY, 3)
        ).end()
        conn.commit()
    assert seen[-1] == "INSERT" and all(s in ("SELECT", "PRAGMA") for s in seen[:-1])
    assert len(seen) == 2 or driver == "sqlite"


@pytest.mark.parametrize("driver", SYNC_DRIVERS)
def test_a_guard_table_created_by_a_claim_that_rolls_back_is_there_for_the_next_writer(
    make_target: Callable[..., SqlTarget], driver: str
) -> None:
    """A first claim() creates a missing table: on PostgreSQL committed at once (other sessions see it while
    the claim's transaction is still open); on SQLite in the claim's transaction, looked for again later."""
    target = make_target(driver)
    with target.engine.connect() as conn:
        target.fenced.claim(conn, "a", Fence(KEY, 1)).end()
        if driver != "sqlite":  # SQLite's write lock is this open transaction's: nobody else writes meanwhile
            target.write("b", Fence(KEY, 1), "while-open")
        conn.rollback()
    target.write("c", Fence(KEY, 1), "after")
    assert target.guard.read("a") is None and target.guard.read("c") == Fence(KEY, 1)


# -- a stalled writer: the next one's wait is bounded ------------------------------------------------


@pytest.mark.postgres
def test_postgresql_bounds_the_wait_behind_a_busy_writer_with_lock_timeout(
    make_target: Callable[..., SqlTarget],
) -> None:
    holder = make_target("psycopg", stall_timeout=None)  # its session is never ended for idling
    waiter = make_target("psycopg2", stall_timeout=0.5)
    with holder.fenced.begin("orders", Fence(KEY, 1)):
        start = time.monotonic()
        with pytest.raises(FenceBusy) as busy:
            waiter.write("orders", Fence(KEY, 2), "waiter")
        waited = time.monotonic() - start
    assert busy.value.code == "fence_busy" and busy.value.waited == "lock_timeout 0.5 s"
    assert "nothing was written" in str(busy.value) and "stall_timeout" in str(busy.value)
    assert waited < 20  # bounded (0.5 s asked; generous for a loaded machine)
    assert [w for _, w, _ in holder.orders_of("orders")] == []


@pytest.mark.postgres
def test_the_lock_timeout_applies_to_every_statement_of_a_fenced_transaction(
    make_target: Callable[..., SqlTarget],
) -> None:
    """Your own statements too: one that waits on a row another (unfenced) transaction holds ends at it."""
    target = make_target("psycopg", stall_timeout=0.5)
    target.write("orders", Fence(KEY, 1), "a")
    t = target.totals
    with target.engine.begin() as other:
        other.execute(t.update().where(t.c.resource == "orders").values(writes=t.c.writes))  # holds the row
        start = time.monotonic()
        with pytest.raises(sa.exc.OperationalError, match="lock timeout"):
            target.write("orders", Fence(KEY, 2), "b")
        assert time.monotonic() - start < 20  # 0.5 s asked; generous for a loaded machine
    assert target.total_of("orders") == (1, "a")


@pytest.mark.parametrize("driver", SYNC_DRIVERS)
def test_the_raw_dbapi_connection_is_outside_a_claim(
    make_target: Callable[..., SqlTarget], driver: str
) -> None:
    """What SQLAlchemy does not see is not claimed: a raw cursor after a commit runs without the guard."""
    target = make_target(driver)
    with target.engine.connect() as conn, target.fenced.claim(conn, "orders", Fence(KEY, 5)):
        conn.commit()
        target.write("orders", Fence(KEY, 6), "newer")
        raw: Any = conn.connection.dbapi_connection
        cursor = raw.cursor()
        placeholder = "?" if driver == "sqlite" else "%s"
        cursor.execute(
            f"INSERT INTO {target.orders.name} (resource, fencing_token, writer, part)"
            f" VALUES ({placeholder}, {placeholder}, {placeholder}, {placeholder})",
            ("orders", 5, "raw", 9),
        )
        raw.commit()
    assert (5, "raw", 9) in target.orders_of("orders")  # landed over the newer holder's: keep it out


@pytest.mark.postgres
def test_postgresql_ends_a_session_idle_inside_its_fenced_transaction(
    make_target: Callable[..., SqlTarget],
) -> None:
    """The stalled holder idles past stall_timeout: the server ends it and the next holder goes on."""
    stalled = make_target("psycopg2", stall_timeout=1.0)
    newer = make_target("psycopg", stall_timeout=30.0)
    with pytest.raises(sa.exc.OperationalError), stalled.fenced.begin("orders", Fence(KEY, 1)) as conn:
        conn.execute(stalled._rows("orders", 1, "stalled")[0])
        start = time.monotonic()
        newer.write("orders", Fence(KEY, 2), "newer")  # waits for the stalled one's row lock
        waited = time.monotonic() - start
        conn.execute(sa.select(1))  # the stalled one's session is gone
    assert waited < 20  # ended after ~1 s idle; generous for a loaded machine
    assert [w for _, w, _ in newer.orders_of("orders")] == ["newer"] * PARTS


@pytest.mark.parametrize("driver", ["sqlite", "aiosqlite"])
def test_sqlite_raises_fence_busy_after_its_busy_timeout(
    make_target: Callable[..., SqlTarget], driver: str
) -> None:
    holder = make_target("sqlite")
    waiter = make_target(driver, sqlite_timeout=0.3)
    with holder.fenced.begin("orders", Fence(KEY, 1)) as conn:
        conn.execute(holder._rows("orders", 1, "holder")[0])
        with pytest.raises(FenceBusy) as busy:
            waiter.write("orders", Fence(KEY, 2), "waiter")
    assert "SQLite's busy timeout" in str(busy.value) and "connect_args={'timeout': seconds}" in str(
        busy.value
    )
    assert isinstance(busy.value, TimeoutError)
    waiter.write("orders", Fence(KEY, 2), "waiter")  # the holder committed: the retry goes through
    assert [w for _, w, p in holder.orders_of("orders") if p == 0] == ["holder", "waiter"]
