"""The holder watch (issue 28): a waiter looks at the lock when Airflow says the holder's try ended.

The decisions are pure (:class:`HolderWatch`, time passed in); the driver is tested against the real
local server with a waiter whose own backoff would not look again within the test: only the watch's
wake can get it the lock. The holder's task state is injected where a real Airflow would answer (the
full-stack tests, ``test_waits_stack.py``, ask a real one).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from airflow_provider_volcano import _handoff
from airflow_provider_volcano.records.holder import HolderRecord
from airflow_provider_volcano.runtime.holder_watch import (
    EXPIRY_LOOKS,
    REPORTED_WITHIN,
    VOUCHED_LOOKS_EVERY,
    WAKES_PER_MINUTE,
    HolderWatch,
    look_at_holder,
)
from volcano_locks import AsyncVolcanoLocks, LockState
from volcano_locks.waiting import SharedPolls, WaitPolicy

NOT_REPORTED = _handoff._NOT_REPORTED


def _record(fencing: int = 7, try_number: int = 1, key: str = "k") -> HolderRecord:
    since = "2026-12-02T08:00:00+00:00"
    return HolderRecord(key, fencing, 30, since, "w1", "etl", "run", "load", -1, try_number)


def test_a_holder_seen_running_then_ended_wakes_once() -> None:
    watch = HolderWatch()
    assert watch.saw(_record(), "running", 0.0) is False
    assert watch.saw(_record(), "running", 1.0) is False
    assert watch.saw(_record(), "success", 2.0) is True and watch.ended and watch.wants_lock
    assert watch.saw(_record(), "success", 3.0) is False  # once per end, not a look a second


@pytest.mark.parametrize("state", ["failed", "up_for_retry", "restarting", "queued", None])
def test_any_way_out_of_running_is_an_end(state: str | None) -> None:
    watch = HolderWatch()
    watch.saw(_record(), "running", 0.0)
    assert watch.saw(_record(), state, 1.0) is True


def test_a_state_airflow_did_not_report_concludes_nothing() -> None:
    watch = HolderWatch()
    watch.saw(_record(), "running", 0.0)
    assert watch.saw(_record(), NOT_REPORTED, 1.0) is False and not watch.ended
    assert watch.saw(None, NOT_REPORTED, 2.0) is False


def test_a_record_of_a_try_already_over_wakes_once_and_a_new_holder_wakes_too() -> None:
    watch = HolderWatch()
    assert watch.saw(_record(), "success", 0.0) is True  # found over: one look
    assert watch.saw(_record(), "success", 1.0) is False
    assert watch.saw(_record(fencing=8, try_number=1), "running", 2.0) is True  # changed hands
    assert not watch.ended


def test_expiry_wakes_follow_a_lease_left_behind_and_only_that_lease() -> None:
    watch = HolderWatch()
    watch.saw(_record(), "running", 0.0)
    watch.saw(_record(), "failed", 1.0)
    expires = datetime.fromtimestamp(100.0, UTC)
    watch.saw_lock(LockState(held=True, expires_at=expires, fencing_token=8), 1.0)  # another lease
    assert not watch.wants_lock and not watch.due(1000.0)
    watch = HolderWatch()
    watch.saw(_record(), "running", 0.0)
    watch.saw(_record(), "failed", 1.0)
    watch.saw_lock(LockState(held=True, expires_at=expires, fencing_token=7), 1.0)
    assert not watch.due(101.0)  # the grace second first
    due = [t for t in (101.2, 101.3, 102.2, 103.2, 104.2, 110.0) if watch.due(t)]
    assert due == [101.2, 102.2, 103.2][:EXPIRY_LOOKS]


def test_wakes_are_bounded_whatever_the_records_say() -> None:
    watch = HolderWatch()
    wakes = sum(watch.saw(_record(fencing=n), "success", n / 10) for n in range(100))  # 100 in 10 s
    assert wakes == WAKES_PER_MINUTE
    assert watch.saw(_record(fencing=1000), "success", 61.0) is True  # a minute later: again


def test_only_a_try_airflow_says_runs_now_is_vouched_for() -> None:
    watch = HolderWatch()
    assert watch.vouched(0.0) is None  # nothing watched yet
    watch.saw(_record(fencing=7), NOT_REPORTED, 0.0)
    assert watch.vouched(0.0) is None  # Airflow has not said it runs
    watch.saw(_record(fencing=7), "running", 1.0)
    assert watch.vouched(1.0) == 7
    watch.saw(_record(fencing=7), NOT_REPORTED, 2.0)  # Airflow did not answer: still the last report's
    assert watch.vouched(1.0 + REPORTED_WITHIN) == 7
    assert watch.vouched(1.1 + REPORTED_WITHIN) is None  # too long without an answer: vouch for nothing
    watch.saw(_record(fencing=7), "running", 40.0)
    assert watch.vouched(40.0) == 7
    watch.saw(_record(fencing=7), "success", 41.0)
    assert watch.vouched(41.0) is None  # ended: the waiters are woken, and look for themselves
    watch.saw(_record(fencing=9), "running", 42.0)  # the lock changed hands
    assert watch.vouched(42.0) == 9


# -- the driver against the real local server --------------------------------------------------------


async def _waiter(conn, key: str) -> asyncio.Task:
    """A waiter whose own looks back off beyond the test: only a wake gets it the lock."""
    client = AsyncVolcanoLocks(conn.url, conn.anon_key, conn.service_key)
    policy = WaitPolicy(poll=600.0, cap=600.0)
    task = asyncio.ensure_future(client.wait_acquire(key, 30, timeout=900, poll=600.0, policy=policy))
    task.add_done_callback(lambda _t: asyncio.ensure_future(client.aclose()))
    await asyncio.sleep(0.5)  # its first attempt is refused, then it sleeps
    assert not task.done()
    return task


async def test_a_release_at_the_end_of_the_holders_try_is_seen_at_once(
    volcano_conn, outside, unique_key
) -> None:
    lease = outside.acquire(unique_key, 60)
    record = _record(lease.fencing_token, key=unique_key)
    states = iter(["running", "running", "success"])

    def state_of(_record: HolderRecord) -> object:
        return next(states)

    waiter = await _waiter(volcano_conn, unique_key)
    async with AsyncVolcanoLocks(volcano_conn.url, volcano_conn.anon_key, volcano_conn.service_key) as client:
        watch = HolderWatch()
        assert await look_at_holder(watch, unique_key, record, client, state_of=state_of) is False
        outside.release(unique_key, lease)  # the body ended; Airflow records the try's end after
        assert await look_at_holder(watch, unique_key, record, client, state_of=state_of) is False
        assert await look_at_holder(watch, unique_key, record, client, state_of=state_of)
        got = await asyncio.wait_for(waiter, 60)
    assert got.fencing_token > lease.fencing_token
    outside.release(unique_key, got)


async def test_a_crashed_holders_lease_is_taken_at_its_expiry(volcano_conn, outside, unique_key) -> None:
    lease = outside.acquire(unique_key, 5)  # then never renewed: the holder is gone
    record = _record(lease.fencing_token, key=unique_key)
    waiter = await _waiter(volcano_conn, unique_key)
    state = "running"
    async with AsyncVolcanoLocks(volcano_conn.url, volcano_conn.anon_key, volcano_conn.service_key) as client:
        watch = HolderWatch()
        await look_at_holder(watch, unique_key, record, client, state_of=lambda r: state)
        state = "failed"  # what the supervisor reports after a kill -9
        while not waiter.done():
            await look_at_holder(watch, unique_key, record, client, state_of=lambda r: state)
            await asyncio.wait({waiter}, timeout=0.2)
            assert datetime.now(UTC) < lease.expires_at + timedelta(seconds=60), "never taken over"
        got = waiter.result()
    assert got.fencing_token > lease.fencing_token
    assert datetime.now(UTC) >= lease.expires_at + timedelta(seconds=1)  # the server's grace, not before
    outside.release(unique_key, got)


async def test_a_running_holder_is_vouched_for_to_the_keys_waiters_and_withdrawn_when_it_ends(
    volcano_conn, outside, unique_key
) -> None:
    lease = outside.acquire(unique_key, 60)
    record = _record(lease.fencing_token, key=unique_key)
    state = "running"
    waiter = await _waiter(volcano_conn, unique_key)
    [entry] = SharedPolls.matching(unique_key, volcano_conn.url, None)
    async with AsyncVolcanoLocks(volcano_conn.url, volcano_conn.anon_key, volcano_conn.service_key) as client:
        watch = HolderWatch()
        await look_at_holder(watch, unique_key, record, client, state_of=lambda r: state)
        assert entry.vouched == (lease.fencing_token, VOUCHED_LOOKS_EVERY)
        state = "success"  # the body is releasing: Airflow records the try's end first here
        assert await look_at_holder(watch, unique_key, record, client, state_of=lambda r: state)
        assert entry.vouched is None
        outside.release(unique_key, lease)
        got = await asyncio.wait_for(waiter, 60)
    outside.release(unique_key, got)
