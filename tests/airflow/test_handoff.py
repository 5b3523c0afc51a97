"""Handoff records: a waiter frees a handoff lease whose task try can no longer use it, and only that.

The rules are pure functions (tested without I/O); the waiters (trigger and in-slot operator) are
tested against the real local server, with the record read through Airflow's own environment-variable
backend (``AIRFLOW_VAR_...``) and the owner's task state injected where a real Airflow would answer
(``owner_state``; the full-stack tests ask a real one).
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from airflow_provider_volcano import _handoff
from airflow_provider_volcano._handoff import (
    DEAD_STATES,
    HandoffRecord,
    describe,
    record_key,
    unusable_because,
)
from airflow_provider_volcano._tokens import TaskIdentity, derive_token, new_nonce
from airflow_provider_volcano.operators.lock import VolcanoLockOperator
from airflow_provider_volcano.triggers import lock as trigger_module
from airflow_provider_volcano.triggers.lock import VolcanoLockTrigger
from volcano_locks import LockState
from volcano_locks.server.service import hash_token

OWNER = TaskIdentity("etl", "load", "manual__1", -1, 1, new_nonce())
NOT_REPORTED = _handoff._NOT_REPORTED


def _record(fencing: int = 7, owner: TaskIdentity = OWNER, key: str = "k") -> HandoffRecord:
    return HandoffRecord(key, fencing, datetime(2026, 12, 1, 12, 5, tzinfo=UTC), owner)


def test_a_record_round_trips_and_anything_else_is_no_record() -> None:
    record = _record()
    assert HandoffRecord.parse("k", record.to_json()) == record
    assert HandoffRecord.parse("other", record.to_json()) is None  # a record names its own lock
    for text in (None, "", "{", "[]", '{"lock_key": "k"}', record.to_json().replace("7", '"7"', 1)):
        assert HandoffRecord.parse("k", text) is None, text
    assert record_key("a:b") == "volcano_lock_handoff:a:b"


@pytest.mark.parametrize("state", sorted(DEAD_STATES, key=str))
def test_a_try_whose_task_instance_is_over_cannot_use_its_handoff(state: str | None) -> None:
    reason = unusable_because(_record(), state, None)
    assert reason is not None and (("cleared" in reason) if state is None else (state in reason))


@pytest.mark.parametrize("state", ["scheduled", "queued", "running", "deferred", "up_for_reschedule"])
def test_a_try_that_may_still_resume_keeps_its_handoff(state: str) -> None:
    assert unusable_because(_record(), state, None) is None
    other = TaskIdentity("etl", "other", "manual__1", -1, 1, new_nonce())
    assert unusable_because(_record(), state, other) is None


def test_a_state_airflow_did_not_report_keeps_the_handoff() -> None:
    assert unusable_because(_record(), NOT_REPORTED, None) is None


def test_the_task_instances_own_next_try_frees_its_predecessors_handoff() -> None:
    later = TaskIdentity(OWNER.dag_id, OWNER.task_id, OWNER.run_id, -1, 2, new_nonce())
    assert unusable_because(_record(), "running", later) == "its task instance is on try 2 now"
    mapped = TaskIdentity(OWNER.dag_id, OWNER.task_id, OWNER.run_id, 0, 2, new_nonce())
    assert unusable_because(_record(), "running", mapped) is None  # another task instance


def test_the_waiting_line_tells_a_handoff_from_a_running_holder() -> None:
    assert "a handoff to etl.load (run 'manual__1', try 1), which has not resumed yet (task state: " in (
        describe(_record(), 7, "scheduled")
    )
    assert "failed" in describe(_record(), 7, "failed")
    assert describe(_record(), 8, "scheduled").startswith("not a handoff")  # the holder changed since
    assert describe(None, 7, NOT_REPORTED).startswith("not a handoff")
    line = trigger_module.waiting_facts(
        LockState(held=True, expires_at=datetime(2026, 12, 1, 12, 5, tzinfo=UTC), fencing_token=7),
        _record(),
        "scheduled",
    )
    assert line.startswith("held with fencing token 7 until 2026-12-01T12:05:00+00:00; a handoff to ")


# -- waiters against the real local server ----------------------------------------------------------


def _stranded(volcano_conn, outside, monkeypatch, key: str, state: object) -> tuple[Any, str]:
    """A lease a trigger took for OWNER (with its token), its record, and Airflow's answer ``state``."""
    token = derive_token(volcano_conn.service_key, OWNER, key)
    lease = outside.acquire(key, 60, token=token)
    record = HandoffRecord(key, lease.fencing_token, lease.expires_at, OWNER)
    monkeypatch.setenv(f"AIRFLOW_VAR_{record_key(key).upper()}", record.to_json())
    monkeypatch.setattr(_handoff, "owner_state", lambda owner: state if owner == OWNER else NOT_REPORTED)
    monkeypatch.setattr(trigger_module, "owner_state", _handoff.owner_state)
    return lease, token


def _releases(volcano_conn, key: str, token: str) -> list[int]:
    digest = hash_token(token)[:12]
    return [
        r["status"]
        for r in volcano_conn.requests()
        if r.get("op") == "release" and key in r.get("path", "") and r.get("token_sha256") == digest
    ]


def _trigger(key: str, **kwargs: Any) -> VolcanoLockTrigger:
    waiter = TaskIdentity("etl", "next", "manual__1", -1, 1, new_nonce())
    return VolcanoLockTrigger(
        volcano_conn_id="volcano_default", lock_key=key, ttl=10, identity=waiter.as_dict(), poll=0.5, **kwargs
    )


async def _first_event(trigger: VolcanoLockTrigger) -> dict[str, Any]:
    async for event in trigger.run():
        return dict(event.payload)
    raise AssertionError("no event")


async def test_a_trigger_frees_a_handoff_whose_task_failed_within_seconds(
    volcano_conn, outside, unique_key, monkeypatch, capfd
) -> None:
    lease, token = _stranded(volcano_conn, outside, monkeypatch, unique_key, "failed")
    started = time.monotonic()
    event = await asyncio.wait_for(_first_event(_trigger(unique_key)), 30)
    took = time.monotonic() - started
    assert event["status"] == "acquired" and event["fencing_token"] > lease.fencing_token
    assert took < _handoff.LOOK_EVERY + 5, took  # the 60 s lease was not waited out
    assert _releases(volcano_conn, unique_key, token) == [204]  # with the stranded try's own token
    out = capfd.readouterr()
    assert (
        "it was held for the handoff to etl.load (run 'manual__1', try 1), which can no longer use it "
        in (out.out + out.err)
    )
    outside.force_release(unique_key)


async def test_a_trigger_waits_behind_a_handoff_whose_task_may_still_resume(
    volcano_conn, outside, unique_key, monkeypatch, capfd
) -> None:
    lease, token = _stranded(volcano_conn, outside, monkeypatch, unique_key, "queued")
    event = await asyncio.wait_for(_first_event(_trigger(unique_key, deadline=time.time() + 8)), 30)
    assert event["status"] == "timeout"
    assert _releases(volcano_conn, unique_key, token) == []
    out = capfd.readouterr()
    assert "which has not resumed yet (task state: queued)" in out.out + out.err  # the waiting line
    state = outside.get(unique_key)
    assert state.held and state.fencing_token == lease.fencing_token
    outside.release(unique_key, lease)


def test_a_wait_in_the_worker_slot_frees_a_cleared_tasks_handoff(
    volcano_conn, outside, unique_key, monkeypatch, capfd
) -> None:
    _, token = _stranded(volcano_conn, outside, monkeypatch, unique_key, None)  # cleared: no state
    ti = type("TI", (), {"xcom_push": lambda self, key, value: None})()
    ti.dag_id, ti.task_id, ti.run_id, ti.map_index, ti.try_number = "etl", "next", "manual__1", -1, 1
    op = VolcanoLockOperator(task_id="next", lock_key=unique_key, python_callable=lambda: "ran")
    started = time.monotonic()
    assert op.execute({"ti": ti}) == "ran"  # type: ignore[arg-type]
    assert time.monotonic() - started < 2 * _handoff.LOOK_EVERY + 5
    assert _releases(volcano_conn, unique_key, token) == [204]
    out = capfd.readouterr()
    assert "its task instance was cleared" in out.out + out.err
