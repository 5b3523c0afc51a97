"""VolcanoLockTrigger: primitives-only serialisation, and waiting through the core's wait engine.

The timing rules themselves (backoff, holder expiry, floor, jitter) are the core engine's and are
tested in tests/core/test_waiting.py.
"""

from __future__ import annotations

import json

from airflow_provider_volcano._tokens import TaskIdentity, new_nonce
from airflow_provider_volcano.triggers.lock import VolcanoLockTrigger

IDENTITY = TaskIdentity("d", "t", "r", 3, 2, new_nonce()).as_dict()


def _primitives_only(value: object) -> bool:
    if isinstance(value, dict):
        return all(isinstance(k, str) and _primitives_only(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_primitives_only(v) for v in value)
    return value is None or isinstance(value, str | int | float | bool)


def test_serialize_round_trip_is_primitives_only() -> None:
    trigger = VolcanoLockTrigger(
        volcano_conn_id="vc", lock_key="k.1", ttl=30, identity=IDENTITY, deadline=1_900_000_000.5, poll=1.5
    )
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_provider_volcano.triggers.lock.VolcanoLockTrigger"
    assert _primitives_only(kwargs)
    again = VolcanoLockTrigger(**json.loads(json.dumps(kwargs)))
    assert again.serialize() == (classpath, kwargs)
    assert set(kwargs) == {"volcano_conn_id", "lock_key", "ttl", "identity", "deadline", "poll"}


def test_serialize_without_deadline() -> None:
    _, kwargs = VolcanoLockTrigger(volcano_conn_id="vc", lock_key="k", ttl=5, identity=IDENTITY).serialize()
    assert kwargs["deadline"] is None


# -- against the real local server ----------------------------------------------------------------

import asyncio  # noqa: E402
import contextlib  # noqa: E402
import hashlib  # noqa: E402
import io  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from collections.abc import AsyncIterator  # noqa: E402

import pytest  # noqa: E402

from airflow_provider_volcano._tokens import derive_token  # noqa: E402

NONCE = new_nonce()
LEFT_BEHIND_BOUND = 15.0
"""Seconds a task a test left running has to end once cancelled (a trigger's watch waits 1 s for it)."""


@pytest.fixture(autouse=True)
async def _no_task_left_behind() -> AsyncIterator[None]:
    """End what a test left running (the triggerer would cancel it), in bounded time.

    pytest-asyncio closes the loop by cancelling every task and waiting for them without a bound: a task
    that does not end once cancelled hung CI's oldest-Airflow lane for 300 s, with nothing said. Here it
    fails the test naming each such task and where it waits, and the threads' stacks.
    """
    yield
    me = asyncio.current_task()
    left = [task for task in asyncio.all_tasks() if task is not me and not task.done()]
    for task in left:
        task.cancel()
    if not left:
        return
    _, pending = await asyncio.wait(left, timeout=LEFT_BEHIND_BOUND)
    if pending:
        said = []
        for task in pending:
            where = io.StringIO()
            task.print_stack(file=where)
            said.append(where.getvalue())
        threads = "".join(
            f"thread {ident}:\n" + "".join(traceback.format_stack(frame))
            for ident, frame in sys._current_frames().items()
        )
        pytest.fail(
            f"{len(pending)} task(s) still running {LEFT_BEHIND_BOUND:g} s after their cancel:\n"
            + "\n".join(said)
            + "\n"
            + threads
        )


def _trigger(key: str, n: int, **kwargs: object) -> VolcanoLockTrigger:
    identity = TaskIdentity("d", f"t{n}", "r", -1, 1, NONCE).as_dict()
    return VolcanoLockTrigger(
        volcano_conn_id="volcano_default", lock_key=key, ttl=10, identity=identity, **kwargs
    )  # type: ignore[arg-type]


async def _first_event(trigger: VolcanoLockTrigger) -> dict[str, object]:
    """The trigger's first event; its generator closed after it, as the triggerer ends a fired trigger."""
    async with contextlib.aclosing(trigger.run()) as events:
        async for event in events:
            return dict(event.payload)
    raise AssertionError("no event")


async def test_waiting_triggers_share_one_poller_and_one_release_wakes_one(
    volcano_conn, outside, unique_key
) -> None:
    held = outside.acquire(unique_key, 30)
    triggers = [_trigger(unique_key, n, poll=0.5) for n in range(8)]
    tasks = [asyncio.create_task(_first_event(t)) for t in triggers]
    await asyncio.sleep(3.0)
    gets = [r for r in volcano_conn.requests() if unique_key in r.get("path", "") and r.get("op") == "get"]
    # Eight triggers, one poll backing off from 0.5 s (the same holder seen again: x factor squared),
    # two or three reads in 3 s; eight pollers would send eight times as many.
    assert 2 <= len(gets) <= 9, len(gets)
    outside.release(unique_key, held)
    await asyncio.wait(tasks, timeout=5, return_when=asyncio.FIRST_COMPLETED)
    await asyncio.sleep(1.0)
    assert len([t for t in tasks if t.done()]) == 1  # the others keep waiting: no thundering herd
    (event,) = [t.result() for t in tasks if t.done()]
    assert event["status"] == "acquired" and event["fencing_token"] > held.fencing_token
    winner = triggers[tasks.index(next(t for t in tasks if t.done()))]
    assert winner is triggers[0]  # first come, first served
    state = outside.get(unique_key)
    assert state.held and state.fencing_token == event["fencing_token"]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    outside.force_release(unique_key)


async def test_trigger_acquires_with_the_derived_token_and_leaks_no_secret(
    volcano_conn, outside, unique_key
) -> None:
    trigger = _trigger(unique_key, 0, poll=0.5)
    event = await asyncio.wait_for(_first_event(trigger), 10)
    token = derive_token(volcano_conn.service_key, TaskIdentity("d", "t0", "r", -1, 1, NONCE), unique_key)
    # The resumed task re-acquires the very same lease with the token it derives itself.
    again = outside.acquire(unique_key, 10, token=token)
    assert again.fencing_token == event["fencing_token"]
    text = json.dumps(event) + json.dumps(trigger.serialize()[1])
    assert token not in text and volcano_conn.service_key not in text
    digest = hashlib.sha256(token.encode()).hexdigest()[:12]
    assert any(r.get("token_sha256") == digest and r.get("status") == 201 for r in volcano_conn.requests())
    outside.release(unique_key, again)


async def test_trigger_times_out_naming_the_holder(volcano_conn, outside, unique_key) -> None:
    held = outside.acquire(unique_key, 30)
    started = time.monotonic()
    event = await asyncio.wait_for(
        _first_event(_trigger(unique_key, 0, poll=0.5, deadline=time.time() + 1.5)), 10
    )
    assert event["status"] == "timeout" and event["fencing_token"] == held.fencing_token
    assert unique_key in str(event["message"]) and time.monotonic() - started < 8
    outside.release(unique_key, held)


async def test_trigger_reports_a_rejected_key_as_error(volcano_server, monkeypatch, unique_key) -> None:
    from tests.airflow.helpers import volcano_conn_json

    monkeypatch.setenv(
        "AIRFLOW_CONN_VOLCANO_DEFAULT", volcano_conn_json(volcano_server.url, volcano_server.anon_key)
    )
    event = await asyncio.wait_for(_first_event(_trigger(unique_key, 0, poll=0.5)), 10)
    assert event["status"] == "error" and unique_key in str(event["message"]), event


async def test_trigger_reports_a_broken_connection_as_error(monkeypatch, unique_key) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_VOLCANO_DEFAULT", json.dumps({"conn_type": "volcano", "password": "x" * 20})
    )
    event = await asyncio.wait_for(_first_event(_trigger(unique_key, 0)), 10)
    assert event["status"] == "error" and "has no API URL" in str(event["message"])


async def test_trigger_rides_out_503_and_429_while_waiting(volcano_conn, outside, unique_key) -> None:
    held = outside.acquire(unique_key, 30)
    volcano_conn.server.set_faults("status=503:op=get:count=2,status=429:op=get:count=1")
    try:
        task = asyncio.create_task(_first_event(_trigger(unique_key, 0, poll=0.3)))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            statuses = [r["status"] for r in volcano_conn.requests() if unique_key in r.get("path", "")]
            if 503 in statuses and 429 in statuses and statuses[-1] == 200:
                break
            await asyncio.sleep(0.2)
        outside.release(unique_key, held)
        event = await asyncio.wait_for(task, 20)
    finally:
        volcano_conn.server.set_faults(None)
    assert event["status"] == "acquired" and event["fencing_token"] > held.fencing_token
    assert {503, 429} <= {r["status"] for r in volcano_conn.requests() if unique_key in r.get("path", "")}
    outside.force_release(unique_key)


async def test_trigger_acquires_for_the_handoff_and_says_when(volcano_conn, outside, unique_key) -> None:
    """The lease the trigger takes lasts handoff_ttl, not the task's ttl; the event says when it began."""
    from datetime import UTC, datetime

    trigger = _trigger(unique_key, 0, poll=0.5, handoff_ttl=60)  # the task's ttl is 10
    assert trigger.serialize()[1]["handoff_ttl"] == 60
    before = datetime.now(UTC)
    event = await asyncio.wait_for(_first_event(trigger), 10)
    assert event["status"] == "acquired" and event["handoff_ttl"] == 60
    acquired_at = datetime.fromisoformat(str(event["acquired_at"]))
    assert before.timestamp() - 1 <= acquired_at.timestamp() <= datetime.now(UTC).timestamp() + 1
    state = outside.get(unique_key)
    assert state.held and state.expires_at is not None
    assert (state.expires_at - acquired_at).total_seconds() > 50  # ~60 s, far past the task's 10 s
    # The resumed task's idempotent re-acquire sets it to its own ttl (same lease, same fencing token).
    token = derive_token(volcano_conn.service_key, TaskIdentity("d", "t0", "r", -1, 1, NONCE), unique_key)
    again = outside.acquire(unique_key, 10, token=token)
    assert again.fencing_token == event["fencing_token"]
    assert (again.expires_at - datetime.now(UTC)).total_seconds() <= 11
    outside.release(unique_key, again)


async def test_waiting_lines_name_the_holder_from_the_engines_look_at_no_extra_request(
    volcano_conn, outside, unique_key, capfd
) -> None:
    """Issue 28: the lines take the engine's look (its age said) instead of reading the lock again."""
    held = outside.acquire(unique_key, 30)
    first = asyncio.create_task(_first_event(_trigger(unique_key, 0, poll=30.0)))
    await asyncio.sleep(6.0)  # past the lines' own shared read's few seconds (LOOK_EVERY)
    second = asyncio.create_task(_first_event(_trigger(unique_key, 1, poll=30.0)))
    await asyncio.sleep(1.5)
    out, err = capfd.readouterr()
    lines = [line for line in (out + err).splitlines() if "Still waiting for lock" in line]
    gets = [r for r in volcano_conn.requests() if unique_key in r.get("path", "") and r.get("op") == "get"]
    for task in (first, second):
        task.cancel()
    await asyncio.gather(first, second, return_exceptions=True)
    outside.release(unique_key, held)
    assert len(lines) == 2, lines
    assert all(f"held with fencing token {held.fencing_token} until" in line for line in lines), lines
    ages = [int(re.search(r"\(as read (\d+) s ago\)", line).group(1)) for line in lines]  # type: ignore[union-attr]
    # The second line says the first trigger's look, taken about six seconds before it (less the first
    # trigger's own start).
    assert ages[0] <= 1 and 3 <= ages[1] <= 7, lines
    # One look: the first trigger's engine asks who holds the lock once, and both lines say it.
    assert len(gets) == 1, gets
