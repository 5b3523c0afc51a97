"""Every PostgreSQL interaction is bounded: a hung database or a long lock wait is a 503, never a hang."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from urllib.parse import urlsplit

import httpx
import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from volcano_locks.server.errors import StoreUnavailable
from volcano_locks.server.harness import InProcessServer
from volcano_locks.server.pg_pool import DEFAULT_TIMEOUT, PgPool, parse_dsn

from .helpers import Raw, drop_schema, new_id, with_schema
from .tcpproxy import TcpProxy

# Generous: far above the 1 s bounds set below, only there to catch a request that hangs.
HANG_BOUND = 20.0


@pytest.fixture
def schema(pg_dsn: str) -> Iterator[str]:
    name = f"vl_bound_{uuid.uuid4().hex[:12]}"
    yield name
    drop_schema(pg_dsn, name)


@pytest.fixture
def proxy(pg_dsn: str) -> Iterator[TcpProxy]:
    parts = urlsplit(pg_dsn)
    p = TcpProxy((parts.hostname or "127.0.0.1", parts.port or 5432)).start()
    yield p
    p.resume()
    p.cut()


def proxied_dsn(pg_dsn: str, proxy: TcpProxy, schema: str) -> str:
    parts = urlsplit(pg_dsn)
    return with_schema(parts._replace(netloc=f"{parts.username}@127.0.0.1:{proxy.port}").geturl(), schema)


def timed(send: Callable[[], httpx.Response]) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    r = send()
    return r, time.monotonic() - started


def assert_fails_closed(r: httpx.Response, elapsed: float) -> None:
    assert r.status_code == 503, r.text
    assert r.json()["code"] == "unavailable" and "fail closed" in r.json()["error"]
    assert elapsed < HANG_BOUND


def recovered(send: Callable[[], httpx.Response], bound: float = 60.0) -> httpx.Response:
    """The first answer that is not the store's fail-closed 503, within a bound that only catches a hang."""
    deadline = time.monotonic() + bound
    while True:
        r = send()
        if r.status_code != 503 or time.monotonic() > deadline:
            return r
        time.sleep(0.2)


def test_dsn_parameters_are_ours_or_passed_to_libpq() -> None:
    s = parse_dsn("postgresql://u@h:5/db?schema=s1&timeout=2.5&sslmode=disable&options=-c%20search_path%3Dx")
    assert (s.schema, s.timeout) == ("s1", 2.5)
    params = conninfo_to_dict(s.dsn)
    assert "schema" not in params and "timeout" not in params and params["sslmode"] == "disable"
    assert params["options"] == "-c search_path=x"  # a space, not a '+': libpq would reject that
    assert parse_dsn("postgresql://u@h/db").timeout == DEFAULT_TIMEOUT
    for bad in ("abc", "0", "-1", "nan", "inf"):
        with pytest.raises(ValueError, match=f"timeout=.*{bad!r}"):
            parse_dsn(f"postgresql://u@h/db?timeout={bad}")


def test_statement_timeout_and_dsn_options(pg_dsn: str) -> None:
    pool = PgPool(f"{pg_dsn}?timeout=1")
    try:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="QueryCanceled"), pool.session() as conn:
            conn.execute("SELECT pg_sleep(30)")
        assert time.monotonic() - started < HANG_BOUND
        with pool.session() as conn:  # the connection survived its timeout and is reused
            assert conn.execute("SHOW lock_timeout").fetchone() == ("1s",)
            assert conn.execute("SHOW idle_in_transaction_session_timeout").fetchone() == ("1s",)
    finally:
        pool.close()
    # the DSN's own -c settings win over ours
    pool = PgPool(f"{pg_dsn}?timeout=1&options=-c%20statement_timeout%3D7s")
    try:
        with pool.session() as conn:
            assert conn.execute("SHOW statement_timeout").fetchone() == ("7s",)
    finally:
        pool.close()


def test_hung_database_connect_and_query_are_bounded(pg_dsn: str, proxy: TcpProxy, schema: str) -> None:
    pool = PgPool(proxied_dsn(pg_dsn, proxy, schema) + "&timeout=1")
    try:
        with pool.session() as conn:
            conn.execute("SELECT 1")  # leaves one healthy pooled connection
        proxy.stall()
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="did not answer within 1 s"), pool.session() as conn:
            conn.execute("SELECT 1")  # the pooled connection: only the watchdog can end this wait
        with pytest.raises(StoreUnavailable, match="cannot connect"), pool.session() as conn:
            conn.execute("SELECT 1")  # the pool is empty now: a new connection that never completes
        assert time.monotonic() - started < HANG_BOUND
        proxy.resume()
        with pool.session() as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        pool.close()


def test_requests_get_503_while_postgres_hangs_and_recover(pg_dsn: str, proxy: TcpProxy, schema: str) -> None:
    # Every client is closed even when an assertion fails: a leaked socket would fail a later test.
    dsn = proxied_dsn(pg_dsn, proxy, schema) + "&timeout=1"
    with InProcessServer(db=dsn) as srv, ExitStack() as open_clients:
        raw = open_clients.enter_context(Raw(srv.url, srv.service_key))
        token = new_id()
        lease = raw.acquire("job", token).json()
        proxy.stall()
        clients = [open_clients.enter_context(Raw(srv.url, srv.service_key)) for _ in range(4)]
        for c in clients:
            c.http.timeout = httpx.Timeout(60.0)  # longer than HANG_BOUND: a hang fails the assertion below
        sends: list[Callable[[], httpx.Response]] = [
            lambda: clients[0].acquire("job", token),
            lambda: clients[1].get("job"),
            lambda: clients[2].release("job", token),
            lambda: clients[3].force_release("job"),
        ]
        results: list[tuple[httpx.Response, float]] = []
        # At once, so most of them need a new connection (bounded by connect_timeout) and one gets the
        # pooled one (bounded by the watchdog).
        threads = [threading.Thread(target=lambda s=s: results.append(timed(s))) for s in sends]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=90)
        assert len(results) == 4
        for r, elapsed in results:
            assert_fails_closed(r, elapsed)
        proxy.resume()
        # The pool reconnects within its 1 s connect timeout; on a loaded machine the first attempts may
        # still miss it, so the server must recover, not answer at once (a hang fails the bound).
        # nothing was lost or changed
        assert recovered(lambda: raw.get("job")).json() == {"held": True, **lease}
        assert recovered(lambda: raw.release("job", token)).status_code == 204


def test_long_lock_waits_are_503(pg_dsn: str, schema: str) -> None:
    with InProcessServer(db=with_schema(pg_dsn, schema) + "&timeout=1") as srv:
        raw = Raw(srv.url, srv.service_key)
        token = new_id()
        lease = raw.acquire("job", token).json()
        with psycopg.connect(pg_dsn) as blocker:  # one open transaction holding the row lock
            blocker.execute(
                sql.SQL("SELECT 1 FROM {} WHERE project = 'local' AND key = 'job' FOR UPDATE").format(
                    sql.Identifier(schema, "locks")
                )
            )
            for send in (
                lambda: raw.renew("job", token),
                lambda: raw.acquire("job", new_id()),
                lambda: raw.release("job", token),
                lambda: raw.force_release("job"),
            ):
                assert_fails_closed(*timed(send))
            assert raw.get("job").json() == {"held": True, **lease}  # reads take no row lock
            blocker.rollback()
            # the quota count waits for its table too
            quota_table = sql.Identifier(schema, "quota")
            blocker.execute(sql.SQL("LOCK TABLE {} IN EXCLUSIVE MODE").format(quota_table))
            assert_fails_closed(*timed(lambda: raw.get("job")))
            blocker.rollback()
        assert raw.renew("job", token).status_code == 200
        assert raw.release("job", token).status_code == 204
        raw.close()
