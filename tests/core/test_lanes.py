"""Renewals in their own lane: a holder keeps its lock while fifty waiters' reads crawl through its client.

The server delays every ``get`` by a few seconds; fifty waiters poll keys that another credential holds
(a same-credential release would wake them in-process and hide the polling), and one holder renews a
5 s lease through the very same client for about twenty seconds. Before the lanes, the sync client's
renewals queued in its worker pool behind those reads and the holder lost its lock.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.fleet import hold_elsewhere, release_elsewhere
from volcano_locks import AsyncVolcanoLocks, VolcanoLocks, WaitTimeout
from volcano_locks.server.harness import LocalServer

pytestmark = pytest.mark.slow

WAITERS = 50
GET_DELAY = 5.0
HOLD = 20.0  # seconds the holder holds; its 5 s lease is renewed about every 1.7 s
TTL = 5
BUDGET = 600  # the waiting budget: the fifty first acquires are spent in seconds, then reads flow


@pytest.fixture(scope="module")
def lane_server() -> Iterator[LocalServer]:
    """A server of its own (its request log is ours) with a quota that is never the cause."""
    with LocalServer(admin=True, quota=1_000_000) as srv:
        yield srv


def _setup(server: LocalServer) -> tuple[str, list[str], str, dict[str, Any]]:
    run = uuid.uuid4().hex[:8]
    keys = [f"lanes-{run}-w{n}" for n in range(WAITERS)]
    other, leases = hold_elsewhere(server, keys, ttl=600)
    server.clear_requests()
    server.set_faults(f"delay={GET_DELAY:g}:op=get")
    return f"lanes-{run}-holder", keys, other, leases


def _check(server: LocalServer, holder_key: str, keys: list[str], lost: object) -> None:
    log = server.requests()
    renewals = [r for r in log if r["op"] == "renew" and holder_key in r["path"]]
    slow_reads = [r for r in log if r["op"] == "get" and r["fault"]]
    seen = collections.Counter((r["op"], r["status"], r["fault"]) for r in log)
    assert lost is None, f"the holder lost its lock: {lost}; requests: {seen}"
    assert renewals and all(r["status"] == 200 for r in renewals)
    assert len(renewals) >= HOLD / (TTL / 3) * 0.7, seen  # it renewed at about a third of the TTL
    # The waiters really were polling, with reads outstanding for GET_DELAY seconds each.
    assert len({r["path"] for r in slow_reads}) >= 20 and len(slow_reads) >= 30, seen


def test_a_sync_holder_keeps_its_lock_while_fifty_waiters_reads_are_slow(lane_server: LocalServer) -> None:
    holder_key, keys, other, leases = _setup(lane_server)
    outcomes: list[BaseException | None] = []
    try:
        with VolcanoLocks(
            lane_server.url, service_key=lane_server.service_key, timeout=10.0, wait_budget=BUDGET
        ) as client:

            def wait(key: str) -> None:
                try:
                    client.wait_acquire(key, 30, timeout=HOLD)
                    outcomes.append(None)
                except WaitTimeout as exc:
                    outcomes.append(exc)

            threads = [threading.Thread(target=wait, args=(k,), name=f"lane-waiter-{k}") for k in keys]
            for t in threads:
                t.start()
            time.sleep(1.0)  # the waiters' first looks are out
            with client.with_lock(holder_key, TTL) as guard:
                guard.wait_lost(HOLD)
                lost = guard.loss
            for t in threads:
                t.join(HOLD + 30)
            assert not any(t.is_alive() for t in threads)
    finally:
        lane_server.set_faults(None)
        release_elsewhere(lane_server, other, leases, keys)
    assert len(outcomes) == WAITERS and all(isinstance(o, WaitTimeout) for o in outcomes)
    _check(lane_server, holder_key, keys, lost)


async def test_an_async_holder_keeps_its_lock_while_fifty_waiters_reads_are_slow(
    lane_server: LocalServer,
) -> None:
    holder_key, keys, other, leases = _setup(lane_server)
    try:
        async with AsyncVolcanoLocks(
            lane_server.url, service_key=lane_server.service_key, timeout=10.0, wait_budget=BUDGET
        ) as client:
            waiters = [asyncio.create_task(client.wait_acquire(k, 30, timeout=HOLD)) for k in keys]
            await asyncio.sleep(1.0)
            lost = None
            try:
                async with client.with_lock(holder_key, TTL) as guard:
                    await asyncio.sleep(HOLD)
                    lost = guard.loss
            except Exception as exc:  # loss cancels the body and leaves as OwnershipLost
                lost = exc
            outcomes = await asyncio.gather(*waiters, return_exceptions=True)
    finally:
        lane_server.set_faults(None)
        release_elsewhere(lane_server, other, leases, keys)
    assert all(isinstance(o, WaitTimeout) for o in outcomes), outcomes
    _check(lane_server, holder_key, keys, lost)
