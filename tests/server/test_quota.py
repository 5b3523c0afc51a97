"""The quota is shared by every server process on one store: per project, per clock minute, 429 past it."""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from volcano_locks.server.clock import ManualClock
from volcano_locks.server.harness import InProcessServer, LocalServer
from volcano_locks.server.quota import QuotaLimiter
from volcano_locks.server.store_postgres import split_schema

from .conftest import START
from .helpers import Raw, drop_schema, new_id, with_schema

QUOTA = 5


def stored_windows(db: str) -> set[int]:
    """The minutes the store still keeps counts for, read from the database itself."""
    if db.startswith("postgresql://"):
        dsn, schema = split_schema(db)
        with psycopg.connect(dsn) as conn:
            rows = conn.execute(sql.SQL("SELECT minute FROM {}").format(sql.Identifier(schema, "quota")))
            return {int(m) for (m,) in rows.fetchall()}
    with sqlite3.connect(db) as conn:
        return {int(m) for (m,) in conn.execute("SELECT minute FROM quota")}


@pytest.fixture
def pair(storage_db: str, clock: ManualClock) -> Iterator[tuple[InProcessServer, InProcessServer]]:
    """Two servers on one store and one clock, as two processes on one database would be."""
    secret = "quota-secret-" + uuid.uuid4().hex
    with (
        InProcessServer(db=storage_db, secret=secret, clock=clock, quota=QUOTA) as a,
        InProcessServer(db=storage_db, secret=secret, clock=clock, quota=QUOTA) as b,
    ):
        yield a, b


def test_two_servers_on_one_store_share_the_quota(
    pair: tuple[InProcessServer, InProcessServer], clock: ManualClock, storage_db: str
) -> None:
    a, b = pair
    ra, rb = Raw(a.url, a.service_key), Raw(b.url, b.service_key)
    clock.set(START + 20.25)
    for server in pair:  # 401 and 403 count nowhere
        for key in ("garbage", server.anon_key):
            refused = Raw(server.url, key)
            assert refused.get("job").status_code in (401, 403)
            refused.close()
    token = new_id()
    statuses = [
        ra.acquire("job", token).status_code,
        rb.get("job").status_code,
        ra.acquire("job", token).status_code,  # a retry counts too
        rb.force_release("other").status_code,
        ra.get("job").status_code,
    ]
    assert statuses == [201, 200, 201, 204, 200]
    for client in (rb, ra):  # the sixth request, on either server
        r = client.get("job")
        assert r.status_code == 429, r.text
        assert r.json()["code"] == "lock_rate_limited"
        assert r.headers["retry-after"] == "40"  # 39.75 s left in the minute, whole seconds
    other = Raw(b.url, b.mint_key(project="other"))  # per project
    assert other.get("job").status_code == 200
    clock.set(START + 60)  # the next clock minute, on both
    assert ra.get("job").status_code == 200 and rb.get("job").status_code == 200
    clock.set(START + 300)  # a later minute prunes the ones before the previous
    assert ra.get("job").status_code == 200
    assert stored_windows(storage_db) == {int(START + 300) // 60}
    for client in (ra, rb, other):
        client.close()


def test_two_server_processes_on_postgres_share_the_quota(pg_dsn: str) -> None:
    schema = f"vl_quota_{uuid.uuid4().hex[:12]}"
    db = with_schema(pg_dsn, schema)
    secret = "quota-secret-" + uuid.uuid4().hex
    try:
        with (
            LocalServer(db=db, secret=secret, quota=QUOTA, log_requests=False) as a,
            LocalServer(db=db, secret=secret, quota=QUOTA, log_requests=False) as b,
        ):
            for _ in range(3):  # a minute boundary in the middle of an attempt: try again in the new one
                minute = time.time() // 60
                project = f"p-{uuid.uuid4().hex[:8]}"  # fresh counts for every attempt
                ra = Raw(a.url, a.mint_key(project=project))
                rb = Raw(b.url, b.mint_key(project=project))
                responses = [c.get("job") for c in (ra, rb, ra, rb, rb, ra)]
                ra.close()
                rb.close()
                if time.time() // 60 == minute:
                    break
            assert [r.status_code for r in responses] == [200] * QUOTA + [429]
            assert 1 <= int(responses[-1].headers["retry-after"]) <= 60
    finally:
        drop_schema(pg_dsn, schema)


def test_in_memory_counter_for_a_single_process() -> None:
    clock = ManualClock(START + 59.5)
    limiter = QuotaLimiter(2, clock)
    assert [limiter.hit("p"), limiter.hit("p"), limiter.hit("q"), limiter.hit("p")] == [None, None, None, 1]
    clock.advance(0.5)
    assert limiter.hit("p") is None
    assert limiter.counter.increment("p", int(START) // 60) == 4  # the old window is still counted ...
    clock.advance(60)
    limiter.hit("p")
    assert limiter.counter.increment("p", int(START) // 60) == 1  # ... until two minutes on
    assert QuotaLimiter(0, clock).hit("p") is None
    with pytest.raises(ValueError, match="-1"):
        QuotaLimiter(-1)
