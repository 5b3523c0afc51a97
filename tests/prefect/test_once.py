"""locked_task(..., once_key=...) under real Prefect runs, the real lock server and a real SQL/S3 ledger."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from prefect import flow, task
from prefect.cache_policies import INPUTS
from prefect.client.orchestration import get_client
from prefect.states import State
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from prefect_volcano import (
    DUPLICATE_TAG,
    SKIPPED_STATE_NAME,
    SKIPPED_TAG,
    current_lease,
    current_once,
    is_skipped,
    locked_task,
)
from tests.fencing.s3_server import MotoServer
from tests.once.helpers import Warehouse, sqlite_url
from tests.prefect.helpers import lock_events, run_logs
from volcano_locks import InvalidRequest
from volcano_locks.fencing import FencedS3Prefix
from volcano_locks.once import AsyncSQLLedger, S3Ledger

pytestmark = pytest.mark.usefixtures("volcano_env")


@pytest.fixture
def warehouse(tmp_path: Path) -> Iterator[Warehouse]:
    made = Warehouse(sqlite_url(tmp_path))
    yield made
    made.drop()


def rollup_task(w: Warehouse, lock: str, calls: list[str], **options: Any) -> Any:
    @task(**options)
    @locked_task(lock, once_key="rollup:{day}", ledger=w.ledger)
    def rollup(day: str) -> dict[str, Any]:
        calls.append(day)
        with current_once().begin() as effect:
            w.effect(effect.connection, f"rollup:{day}", current_lease().fencing_token)
            effect.result = {"day": day, "rows": 1}
        return {"day": day, "rows": 1}

    return rollup


def test_a_second_run_of_a_done_key_ends_as_a_duplicate_with_the_first_result(
    warehouse: Warehouse, unique_key: str
) -> None:
    calls: list[str] = []
    rollup = rollup_task(warehouse, unique_key, calls)
    states: list[State[Any]] = []

    @flow
    def daily(day: str) -> None:
        states.append(rollup(day, return_state=True))

    daily("2026-12-01")
    daily("2026-12-01")  # a re-run of the same day
    daily("2026-12-02")
    first, duplicate, other = states
    assert first.name == "Completed" and first.result() == {"day": "2026-12-01", "rows": 1}
    assert duplicate.is_completed() and duplicate.name == SKIPPED_STATE_NAME and is_skipped(duplicate)
    message = duplicate.message or ""
    assert (
        message.startswith("Skipped: duplicate run") and "'rollup:2026-12-01' was done by prefect" in message
    )
    record = warehouse.ledger.lookup("rollup:2026-12-01")
    assert record is not None and f"task_run_id={record.who.get('task_run_id')}" in message
    assert record.who.get("task_run_id") == str(first.state_details.task_run_id)
    assert duplicate.result() == {"day": "2026-12-01", "rows": 1}  # the recorded result
    assert other.name == "Completed"
    assert calls == ["2026-12-01", "2026-12-02"]
    assert warehouse.effects("rollup:2026-12-01") == 1 and warehouse.effects() == 2
    assert "Skipped: duplicate run" in run_logs(duplicate)
    with get_client(sync_client=True) as client:
        tags = client.read_flow_run(duplicate.state_details.flow_run_id).tags  # type: ignore[arg-type]
    assert SKIPPED_TAG in tags and DUPLICATE_TAG in tags
    events = lock_events(unique_key, ["duplicate"])
    (dup,) = [e for e in events if e.event == "volcano.lock.duplicate"]
    assert (
        dup.payload["business_key"] == "rollup:2026-12-01"
        and dup.payload["first_fencing_token"] == record.fencing_token
    )


def test_a_duplicate_is_not_cached_and_a_retry_after_commit_is_a_duplicate(
    warehouse: Warehouse, unique_key: str
) -> None:
    calls: list[str] = []
    failed_once: list[bool] = []

    @task(retries=1, cache_policy=INPUTS, persist_result=True)
    @locked_task(unique_key, once_key="rollup:{day}", ledger=warehouse.ledger)
    def rollup(day: str) -> str:
        calls.append(day)
        if warehouse.ledger.lookup(f"rollup:{day}") is None:
            with current_once().begin() as effect:
                warehouse.effect(effect.connection, f"rollup:{day}", current_lease().fencing_token)
                effect.result = "written"
        if not failed_once:  # the effect committed, then the worker "died" before reporting success
            failed_once.append(True)
            raise RuntimeError("lost the worker after the commit")
        return "written"

    @flow
    def daily(day: str) -> Any:
        return rollup(day, return_state=True)

    state = daily("2026-12-01")
    assert is_skipped(state) and state.result() == "written"  # the retry found the record
    assert calls == ["2026-12-01"] and warehouse.effects() == 1


def test_the_once_key_template_is_checked_where_it_is_written(warehouse: Warehouse, unique_key: str) -> None:
    with pytest.raises(ValueError, match="once_key needs ledger"):
        locked_task(unique_key, once_key="rollup:{day}")
    with pytest.raises(ValueError, match="ledger needs once_key"):
        locked_task(unique_key, ledger=warehouse.ledger)
    with pytest.raises(TypeError, match=r"run-once ledger.*got str"):
        locked_task(unique_key, once_key="k", ledger="warehouse")
    with pytest.raises(ValueError, match="business key"):
        locked_task(unique_key, once_key=" padded", ledger=warehouse.ledger)
    with pytest.raises(ValueError, match="'region'"):

        @locked_task(unique_key, once_key="rollup:{region}", ledger=warehouse.ledger)
        def rollup(day: str) -> None: ...

    with pytest.raises(TypeError, match="is async: its ledger must be an AsyncSQLLedger, got SQLLedger"):

        @locked_task(unique_key, once_key="rollup:{day}", ledger=warehouse.ledger)
        async def arollup(day: str) -> None: ...


def test_a_rendered_once_key_that_is_bad_fails_the_task_naming_it(
    warehouse: Warehouse, unique_key: str
) -> None:
    @task
    @locked_task(unique_key, once_key="rollup:{day}", ledger=warehouse.ledger)
    def rollup(day: str) -> None: ...

    states: list[State[Any]] = []

    @flow
    def daily() -> None:
        states.append(rollup("x\n", return_state=True))

    daily()
    (state,) = states
    assert state.is_failed()
    with pytest.raises(InvalidRequest, match=r"rendered from key 'rollup:\{day\}'"):
        state.result()


def test_current_once_needs_once_key(unique_key: str) -> None:
    @task
    @locked_task(unique_key)
    def plain() -> None:
        current_once()

    states: list[State[Any]] = []

    @flow
    def f() -> None:
        states.append(plain(return_state=True))

    f()
    (state,) = states
    with pytest.raises(RuntimeError, match="once_key= and ledger="):
        state.result()


def test_async_task_with_an_async_ledger(warehouse: Warehouse, unique_key: str, tmp_path: Path) -> None:
    url = warehouse.url.replace("sqlite://", "sqlite+aiosqlite://", 1)

    async def run() -> list[State[Any]]:
        engine = create_async_engine(url, poolclass=NullPool)
        ledger = AsyncSQLLedger(engine, table=warehouse.ledger.tables.ledger.name)

        @locked_task(unique_key, once_key="rollup:{day}", ledger=ledger)
        @task
        async def rollup(day: str) -> int:
            async with current_once().begin() as effect:
                await effect.connection.execute(
                    sa.insert(warehouse.rollup).values(business_key=day, fencing_token=1)
                )
                effect.result = 7
            return 7

        states: list[State[Any]] = []

        @flow(result_storage=tmp_path)  # see ASYNC_FLOWS in tests/prefect/conftest.py
        async def daily(day: str) -> None:
            states.append(await rollup(day, return_state=True))

        await daily("d1")
        await daily("d1")
        await engine.dispose()
        return states

    first, duplicate = asyncio.run(run())
    assert first.name == "Completed" and is_skipped(duplicate)
    assert await_result(duplicate) == 7 and warehouse.effects() == 1


def await_result(state: State[Any]) -> Any:
    """A state's result from sync code, whatever Prefect hands back for an async run's state."""
    value = state.result()
    return asyncio.run(value) if asyncio.iscoroutine(value) else value


def test_s3_ledger_under_a_task(s3_server: MotoServer, unique_key: str) -> None:
    bucket = s3_server.bucket()
    ledger = S3Ledger(FencedS3Prefix(s3_server.client(), bucket, f"marts/{uuid.uuid4().hex[:8]}"))

    @task
    @locked_task(unique_key, once_key="lake:{day}", ledger=ledger)
    def publish(day: str) -> str:
        current_once().publish({"part-0.json": day.encode()}, result={"day": day})
        return day

    @flow
    def daily(day: str) -> Any:
        return publish(day, return_state=True)

    assert daily("d1").name == "Completed"
    again = daily("d1")
    assert is_skipped(again) and again.result() == {"day": "d1"}
    assert ledger.prefix.read("part-0.json") == b"d1"
