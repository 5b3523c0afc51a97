"""The SQL run-once ledger on real SQLite and PostgreSQL, and ``with_lock(once=...)`` on the real server."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from volcano_locks import AsyncVolcanoLocks, InvalidRequest, LockContention, VolcanoLocks
from volcano_locks.errors import ErrorCode
from volcano_locks.fencing import Fence, StaleFencingToken
from volcano_locks.once import AlreadyDone, AsyncSQLLedger, OnceRecord, SQLLedger, Who

from .helpers import Warehouse

LOCK = "rollup-lock"
AIRFLOW_TRY = Who.of("airflow", dag_id="rollup", run_id="scheduled__2026-12-01", task_id="load", try_number=1)


def _do(
    w: Warehouse, key: str, token: int, *, who: Who = AIRFLOW_TRY, resource: str | None = None
) -> OnceRecord:
    with w.ledger.begin(key, Fence(LOCK, token), who=who, resource=resource) as effect:
        w.effect(effect.connection, key, token)
        effect.result = {"rows": 1, "token": token}
    assert effect.record is not None
    return effect.record


def test_the_effect_and_its_record_commit_together(warehouse: Warehouse) -> None:
    record = _do(warehouse, "rollup:2026-12-01", 3)
    assert (record.lock_key, record.fencing_token, record.result) == (LOCK, 3, {"rows": 1, "token": 3})
    assert warehouse.ledger.lookup("rollup:2026-12-01") == record
    assert warehouse.ledger.lookup("rollup:2026-12-01").result == {"rows": 1, "token": 3}  # type: ignore[union-attr]
    assert warehouse.effects("rollup:2026-12-01") == 1
    assert warehouse.ledger.lookup("rollup:2026-12-02") is None


def test_a_retry_after_commit_does_nothing_and_names_the_first_run(warehouse: Warehouse) -> None:
    first = _do(warehouse, "rollup:2026-12-01", 3)
    ran = []
    again = warehouse.ledger.begin("rollup:2026-12-01", Fence(LOCK, 4), who=Who.of("prefect"))
    with pytest.raises(AlreadyDone) as caught, again as effect:  # a newer token, another orchestrator
        ran.append(effect)  # never reached: refused before the body
    assert not ran
    assert caught.value.record == first and caught.value.record.result == {"rows": 1, "token": 3}
    assert caught.value.code == ErrorCode.ALREADY_DONE
    message = str(caught.value)
    assert (
        "dag_id=rollup" in message and "run_id=scheduled__2026-12-01" in message and "try_number=1" in message
    )
    assert "fencing token 3" in message
    assert warehouse.effects() == 1


def test_an_effect_that_fails_records_nothing_and_the_next_run_does_it(warehouse: Warehouse) -> None:
    with (
        pytest.raises(RuntimeError, match="boom"),
        warehouse.ledger.begin("rollup:2026-12-01", Fence(LOCK, 3)) as e,
    ):
        warehouse.effect(e.connection, "rollup:2026-12-01", 3)
        raise RuntimeError("boom")
    assert warehouse.ledger.lookup("rollup:2026-12-01") is None and warehouse.effects() == 0
    _do(warehouse, "rollup:2026-12-01", 4)
    assert warehouse.effects() == 1


def test_a_stale_writer_is_refused_by_the_fence_and_records_nothing(warehouse: Warehouse) -> None:
    _do(warehouse, "rollup:2026-12-01", 7, resource="rollup")  # the newer holder did day 1
    with pytest.raises(StaleFencingToken):
        _do(warehouse, "rollup:2026-12-02", 6, resource="rollup")  # the old holder, resumed
    assert warehouse.ledger.lookup("rollup:2026-12-02") is None and warehouse.effects() == 1


def test_a_writer_fenced_on_another_resource_still_meets_the_ledger_at_commit(warehouse: Warehouse) -> None:
    first = _do(warehouse, "rollup:2026-12-01", 3, resource="orders")
    # Its look-up happened before the first run committed: simulate by recording under another resource
    # after the key is done: the insert finds the key and the whole transaction rolls back.
    tables = warehouse.ledger.tables
    with warehouse.engine.connect() as conn:
        assert tables.insert(conn, first) is False
        conn.rollback()
    with pytest.raises(AlreadyDone):
        _do(warehouse, "rollup:2026-12-01", 9, resource="payments")
    assert warehouse.effects() == 1


@pytest.mark.postgres
def test_concurrent_duplicates_on_postgresql_do_the_effect_once(pg_sqlalchemy_url: str) -> None:
    w = Warehouse(pg_sqlalchemy_url)
    try:
        outcomes: list[str] = []
        start = threading.Barrier(8)

        def attempt(i: int) -> None:
            start.wait()
            try:
                # each fenced on its own resource, so only the ledger's key stands between them
                _do(w, "rollup:2026-12-01", 5, resource=f"r{i}")
                outcomes.append("done")
            except AlreadyDone:
                outcomes.append("duplicate")

        threads = [threading.Thread(target=attempt, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sorted(outcomes) == ["done"] + ["duplicate"] * 7
        assert w.effects() == 1
    finally:
        w.drop()


def test_forget_is_audited_and_lets_a_run_do_the_key_again(warehouse: Warehouse) -> None:
    first = _do(warehouse, "rollup:2026-12-01", 3)
    with pytest.raises(ValueError, match="'why'"):
        warehouse.ledger.forget("rollup:2026-12-01", by="ana", why="  ")
    forgotten = warehouse.ledger.forget("rollup:2026-12-01", by="ana", why="source data was fixed")
    assert forgotten == first
    assert warehouse.ledger.forget("rollup:2026-12-01", by="ana", why="again") is None  # nothing audited
    (entry,) = warehouse.ledger.audit("rollup:2026-12-01")
    assert (entry.by, entry.why, entry.record) == ("ana", "source data was fixed", first)
    _do(warehouse, "rollup:2026-12-01", 4)
    assert warehouse.effects() == 2
    assert [r.business_key for r in warehouse.ledger.records(prefix="rollup:")] == ["rollup:2026-12-01"]


def test_list_filters_by_prefix_literally(warehouse: Warehouse) -> None:
    for key in ("a_1", "ab1", "a%2"):
        _do(warehouse, key, 1, resource=key)
    assert [r.business_key for r in warehouse.ledger.records(prefix="a_")] == ["a_1"]
    assert [r.business_key for r in warehouse.ledger.records(prefix="a%")] == ["a%2"]
    assert len(warehouse.ledger.records(limit=2)) == 2


@pytest.mark.parametrize(
    ("key", "shown"),
    [("", "''"), (" padded", "' padded'"), ("x" * 300, "xxx"), ("tab\there", "'tab\\there'")],
)
def test_a_bad_business_key_is_refused_naming_it(warehouse: Warehouse, key: str, shown: str) -> None:
    with pytest.raises(ValueError, match="business key") as caught:
        warehouse.ledger.once(key)
    assert shown in str(caught.value)
    with pytest.raises(ValueError, match="business key must be a string, got int"):
        warehouse.ledger.lookup(42)  # type: ignore[arg-type]


def test_a_result_must_be_small_json(warehouse: Warehouse) -> None:
    with (
        pytest.raises(ValueError, match=r"must be JSON.*got set"),
        warehouse.ledger.begin("k", Fence(LOCK, 1)) as e,
    ):
        e.result = {1, 2}
    with (
        pytest.raises(ValueError, match="at most 16384 bytes"),
        warehouse.ledger.begin("k", Fence(LOCK, 1)) as e,
    ):
        e.result = "x" * 20_000
    assert warehouse.ledger.lookup("k") is None


def test_bad_ledger_table_names_are_refused(tmp_path: Path) -> None:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'x.sqlite3'}")
    with pytest.raises(ValueError, match="'drop table x'"):
        SQLLedger(engine, table="drop table x")


# -- with_lock(once=...) against the real local server --------------------------------------------------


def test_with_lock_once_reports_a_duplicate_with_the_first_result(
    warehouse: Warehouse, volcano_client: VolcanoLocks, unique_key: str
) -> None:
    day = "rollup:2026-12-01"
    with volcano_client.with_lock(
        unique_key, ttl=30, once=warehouse.ledger.once(day, who=AIRFLOW_TRY)
    ) as guard:
        assert guard.duplicate is None
        with guard.once.begin() as effect:
            warehouse.effect(effect.connection, day, guard.fencing_token)
            effect.result = {"rows": 1}
        token = guard.fencing_token
    with volcano_client.with_lock(unique_key, ttl=30, once=warehouse.ledger.once(day)) as again:
        assert again.duplicate is not None
        assert again.duplicate.result == {"rows": 1} and again.duplicate.fencing_token == token
        assert again.duplicate.who == AIRFLOW_TRY
        assert again.fencing_token is not None and again.fencing_token > token
    assert warehouse.effects(day) == 1


def test_the_record_holds_no_secret(
    warehouse: Warehouse, volcano_client: VolcanoLocks, volcano_server: Any, unique_key: str
) -> None:
    with volcano_client.with_lock(unique_key, ttl=30, once=warehouse.ledger.once("k")) as guard:
        with guard.once.begin() as effect:
            effect.result = {"ok": True}
        lease = guard.lease
    assert lease is not None
    with warehouse.engine.connect() as conn:
        rows = conn.execute(sa.select(warehouse.ledger.tables.ledger)).all()
    dumped = json.dumps([[str(v) for v in row] for row in rows])
    assert lease.token not in dumped and volcano_server.service_key not in dumped


def test_a_failed_look_up_releases_the_lock_and_raises(
    tmp_path: Path, volcano_client: VolcanoLocks, unique_key: str
) -> None:
    missing = tmp_path / "no-such-dir" / "ledger.sqlite3"  # SQLite cannot open it
    ledger = SQLLedger(sa.create_engine(f"sqlite:///{missing}"))
    context = volcano_client.with_lock(unique_key, ttl=30, once=ledger.once("k"))
    with pytest.raises(sa.exc.OperationalError), context:
        pytest.fail("the block must not run")
    with volcano_client.with_lock(unique_key, ttl=30) as guard:  # released, not left held
        assert guard.acquired


def test_with_lock_refuses_a_once_that_is_not_a_ledger_key(
    volcano_client: VolcanoLocks, unique_key: str
) -> None:
    with pytest.raises(InvalidRequest, match="invalid once str"):
        volcano_client.with_lock(unique_key, ttl=30, once="rollup:2026-12-01")


def test_a_guard_without_once_has_neither(volcano_client: VolcanoLocks, unique_key: str) -> None:
    with volcano_client.with_lock(unique_key, ttl=30) as guard:
        assert guard.once is None and guard.duplicate is None
    with volcano_client.with_lock(unique_key, ttl=30) as held:
        with pytest.raises(LockContention), volcano_client.with_lock(unique_key, ttl=30):
            pass
        assert held.acquired


# -- the asyncio face ---------------------------------------------------------------------------------


def _async_url(url: str) -> str:
    return url.replace("sqlite://", "sqlite+aiosqlite://", 1)


def test_the_async_ledger_decides_as_the_sync_one(
    warehouse: Warehouse, volcano_server: Any, unique_key: str
) -> None:
    url = warehouse.url if warehouse.url.startswith("postgresql") else _async_url(warehouse.url)

    async def run() -> tuple[OnceRecord | None, OnceRecord | None]:
        engine = create_async_engine(url, poolclass=NullPool)
        ledger = AsyncSQLLedger(engine, table=warehouse.ledger.tables.ledger.name)
        srv = volcano_server
        async with AsyncVolcanoLocks(srv.url, service_key=srv.service_key, timeout=10.0) as locks:
            async with locks.with_lock(unique_key, ttl=30, once=ledger.once("day")) as guard:
                first_seen = guard.duplicate
                async with guard.once.begin() as effect:
                    await effect.connection.execute(
                        sa.insert(warehouse.rollup).values(
                            business_key="day", fencing_token=guard.fencing_token
                        )
                    )
                    effect.result = [1, 2]
            async with locks.with_lock(unique_key, ttl=30, once=ledger.once("day")) as again:
                duplicate = again.duplicate
            with pytest.raises(AlreadyDone):
                async with ledger.begin("day", Fence(unique_key, 99)):
                    pass
            assert await ledger.forget("day", by="ops", why="re-run") is not None
            assert await ledger.lookup("day") is None
        await engine.dispose()
        return first_seen, duplicate

    first_seen, duplicate = asyncio.run(run())
    assert first_seen is None
    assert duplicate is not None and duplicate.result == [1, 2]
    assert warehouse.effects("day") == 1
    (entry,) = warehouse.ledger.audit("day")
    assert entry.by == "ops"
