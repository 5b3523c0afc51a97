"""Handoff records: a waiter frees a handoff lease whose task try can no longer use it, and only that.

The rules are pure functions (tested without I/O); the waiters (trigger and in-slot operator) are
tested against the real local server, with the record read through Airflow's own environment-variable
backend (``AIRFLOW_VAR_...``) and the owner's task state injected where a real Airflow would answer
(``owner_state``; the full-stack tests ask a real one).
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from airflow_provider_volcano import _handoff
from airflow_provider_volcano._handoff import DEAD_STATES, GroupState, describe, unusable_because
from airflow_provider_volcano._tokens import TaskIdentity, derive_token, new_nonce
from airflow_provider_volcano.operators.lock import VolcanoLockOperator
from airflow_provider_volcano.records import HandoffRecord, Keyring, handoff_variable, read_handoff, sealed
from airflow_provider_volcano.runtime import handoff_look
from airflow_provider_volcano.triggers.lock import VolcanoLockTrigger
from tests.airflow.helpers import volcano_conn_json
from volcano_locks import LockState
from volcano_locks.server.service import hash_token

OWNER = TaskIdentity("etl", "load", "manual__1", -1, 1, new_nonce())
NOT_REPORTED = _handoff._NOT_REPORTED


def _record(fencing: int = 7, owner: TaskIdentity = OWNER, key: str = "k") -> HandoffRecord:
    return HandoffRecord(key, fencing, datetime(2026, 12, 1, 12, 5, tzinfo=UTC), owner)


def test_a_sealed_record_opens_and_anything_else_is_no_record(monkeypatch: pytest.MonkeyPatch) -> None:
    ring = Keyring.of("key-a")
    text = json.dumps(sealed(ring, _record()))
    monkeypatch.setenv("AIRFLOW_VAR_VOLCANO_LOCK_HANDOFF:K", text)
    opened = read_handoff(ring, "k")
    assert opened.record == _record() and opened.refusal is None
    assert read_handoff(ring, "other").record is None  # nothing stored for that lock
    unsealed = json.dumps(_record().facts())
    for value in ("", "{", "[]", unsealed, text.replace('"fencing_token": 7', '"fencing_token": 8')):
        monkeypatch.setenv("AIRFLOW_VAR_VOLCANO_LOCK_HANDOFF:K", value)
        opened = read_handoff(ring, "k")
        assert opened.record is None and opened.refusal, value
    assert handoff_variable("a:b") == "volcano_lock_handoff:a:b"


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


def test_a_groups_lease_is_never_freed_because_its_acquire_task_ended() -> None:
    group = HandoffRecord("k", 7, None, OWNER, "group", "g.volcano_lock_release")
    for state in (*DEAD_STATES, "running", NOT_REPORTED):
        assert unusable_because(group, state, None) is None  # the acquire task's state decides nothing
    later = TaskIdentity(OWNER.dag_id, OWNER.task_id, OWNER.run_id, -1, 2, new_nonce())
    assert unusable_because(group, GroupState("running", None), later) is None
    assert unusable_because(group, GroupState("running", "running"), None) is None
    assert unusable_because(group, GroupState("running", NOT_REPORTED), None) is None
    assert (
        unusable_because(group, GroupState("failed", NOT_REPORTED), None)
        == "its lock group's DAG run is failed"
    )
    assert unusable_because(group, GroupState("running", "skipped"), None) == (
        "its lock group's release task 'g.volcano_lock_release' is skipped"
    )
    assert "group run: running, release task: not reported" in describe(
        group, 7, GroupState("running", NOT_REPORTED)
    )


def test_the_waiting_line_tells_a_handoff_from_a_running_holder() -> None:
    assert "a handoff to etl.load (run 'manual__1', try 1), which has not resumed yet (task state: " in (
        describe(_record(), 7, "scheduled")
    )
    assert "failed" in describe(_record(), 7, "failed")
    assert describe(_record(), 8, "scheduled").startswith("not a handoff")  # the holder changed since
    assert describe(None, 7, NOT_REPORTED).startswith("not a handoff")
    line = handoff_look.waiting_facts(
        LockState(held=True, expires_at=datetime(2026, 12, 1, 12, 5, tzinfo=UTC), fencing_token=7),
        _record(),
        "scheduled",
    )
    assert line.startswith(
        "held with fencing token 7 until 2026-12-01T12:05:00+00:00 (as of a read of unknown age); "
        "a handoff to "
    )


# -- waiters against the real local server ----------------------------------------------------------


def _stranded(
    volcano_conn, outside, monkeypatch, key: str, state: object, kind: str = "task", renewed: bool = False
) -> tuple[Any, str]:
    """A lease a trigger took for OWNER (with its token), its record, and Airflow's answer ``state``.

    ``renewed``: the record names an earlier lease of OWNER's; the live one is newer (a record whose
    delete failed, outliving its lease).
    """
    token = derive_token(volcano_conn.service_key, OWNER, key)
    lease = recorded = outside.acquire(key, 60, token=token)
    if renewed:
        outside.release(key, recorded)
        lease = outside.acquire(key, 60, token=token)
    release = "g.volcano_lock_release" if kind == "group" else None
    record = HandoffRecord(key, recorded.fencing_token, recorded.expires_at, OWNER, kind, release)
    text = json.dumps(sealed(Keyring.of(volcano_conn.service_key), record))
    monkeypatch.setenv(f"AIRFLOW_VAR_{handoff_variable(key).upper()}", text)
    monkeypatch.setattr(
        _handoff, "owner_state", lambda record: state if record.owner == OWNER else NOT_REPORTED
    )
    monkeypatch.setattr(handoff_look, "owner_state", _handoff.owner_state)
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


async def test_a_trigger_never_frees_a_groups_lease_because_its_acquire_task_ended(
    volcano_conn, outside, unique_key, monkeypatch, capfd
) -> None:
    """A group acquire task's genuine record (its delete failed): the task is over, the group is not."""
    lease, token = _stranded(
        volcano_conn, outside, monkeypatch, unique_key, GroupState("running", "scheduled"), kind="group"
    )
    event = await asyncio.wait_for(_first_event(_trigger(unique_key, deadline=time.time() + 8)), 30)
    assert event["status"] == "timeout"
    assert _releases(volcano_conn, unique_key, token) == []
    out = capfd.readouterr()
    assert "a lock group's lease, acquired for etl.load" in out.out + out.err  # the waiting line
    state = outside.get(unique_key)
    assert state.held and state.fencing_token == lease.fencing_token
    outside.release(unique_key, lease)


async def test_a_trigger_frees_a_groups_lease_once_the_groups_run_is_over(
    volcano_conn, outside, unique_key, monkeypatch
) -> None:
    lease, token = _stranded(
        volcano_conn, outside, monkeypatch, unique_key, GroupState("failed", NOT_REPORTED), kind="group"
    )
    event = await asyncio.wait_for(_first_event(_trigger(unique_key)), 30)
    assert event["status"] == "acquired" and event["fencing_token"] > lease.fencing_token
    assert _releases(volcano_conn, unique_key, token) == [204]
    outside.force_release(unique_key)


async def test_a_record_that_outlived_its_lease_frees_nothing(
    volcano_conn, outside, unique_key, monkeypatch
) -> None:
    """The owner is over, but Volcano's live fencing token is not the record's: nothing is released."""
    lease, token = _stranded(volcano_conn, outside, monkeypatch, unique_key, "failed", renewed=True)
    event = await asyncio.wait_for(_first_event(_trigger(unique_key, deadline=time.time() + 8)), 30)
    assert event["status"] == "timeout"
    assert _releases(volcano_conn, unique_key, token) == [204]  # the set-up's own, of the earlier lease
    state = outside.get(unique_key)
    assert state.held and state.fencing_token == lease.fencing_token
    outside.release(unique_key, lease)


async def test_an_unsealed_record_frees_nothing_and_is_logged(
    volcano_conn, outside, unique_key, monkeypatch, caplog
) -> None:
    """A record written by a user or another task's code (no seal): ignored, whoever it names."""
    lease, token = _stranded(volcano_conn, outside, monkeypatch, unique_key, "failed")
    variable = handoff_variable(unique_key)
    facts = HandoffRecord(unique_key, lease.fencing_token, lease.expires_at, OWNER).facts()
    for forged in (facts, {**facts, "seal": Keyring.of("a guessed key").seal("handoff", facts)}):
        monkeypatch.setenv(f"AIRFLOW_VAR_{variable.upper()}", json.dumps(forged))
        event = await asyncio.wait_for(_first_event(_trigger(unique_key, deadline=time.time() + 7)), 30)
        assert event["status"] == "timeout"
    assert _releases(volcano_conn, unique_key, token) == []
    assert f"Ignoring Variable {variable!r}: it carries no seal" in caplog.text
    assert f"Ignoring Variable {variable!r}: sealed under another key" in caplog.text
    assert volcano_conn.service_key not in caplog.text
    outside.release(unique_key, lease)


async def test_a_stranded_handoff_sealed_before_a_rotation_is_freed_with_its_own_token(
    volcano_conn, outside, unique_key, monkeypatch
) -> None:
    """The record and the token are the old key's; the connection lists it as previous: freed at once."""
    lease, token = _stranded(volcano_conn, outside, monkeypatch, unique_key, "failed")
    new_key = volcano_conn.server.mint_key(ttl_seconds=86_400)
    monkeypatch.setenv(
        "AIRFLOW_CONN_VOLCANO_DEFAULT",
        volcano_conn_json(volcano_conn.url, new_key, previous_service_keys=[volcano_conn.service_key]),
    )
    event = await asyncio.wait_for(_first_event(_trigger(unique_key)), 30)
    assert event["status"] == "acquired" and event["fencing_token"] > lease.fencing_token
    assert _releases(volcano_conn, unique_key, token) == [204]  # derived with the key that sealed it
    outside.force_release(unique_key)
