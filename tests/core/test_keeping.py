"""keep / async_keep against the real local server: renew a held lease, never release it, report loss."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from volcano_locks import AsyncVolcanoLocks, OwnershipLost, VolcanoLocks
from volcano_locks.keeping import async_keep, keep
from volcano_locks.server.harness import LocalServer


@pytest.fixture
def sync_client(volcano_client: VolcanoLocks) -> VolcanoLocks:
    return volcano_client


@pytest.fixture
async def async_client(volcano_server: LocalServer) -> Any:
    client = AsyncVolcanoLocks(volcano_server.url, service_key=volcano_server.service_key)
    yield client
    await client.aclose()


def test_keep_renews_and_leaves_the_lease_held(sync_client: VolcanoLocks, unique_key: str) -> None:
    lease = sync_client.acquire(unique_key, 5)
    with keep(sync_client, lease) as guard:
        time.sleep(6.5)  # past the TTL: only renewals keep it
        assert not guard.lost and guard.fencing_token == lease.fencing_token
        assert guard.lease is not None and guard.lease.expires_at > lease.expires_at
    state = sync_client.get(unique_key)
    assert state.held and state.fencing_token == lease.fencing_token  # not released on exit
    sync_client.release(unique_key, guard.lease)


def test_keep_raises_the_loss_after_the_block(sync_client: VolcanoLocks, unique_key: str) -> None:
    lease = sync_client.acquire(unique_key, 5)
    seen: list[OwnershipLost] = []
    with pytest.raises(OwnershipLost) as info, keep(sync_client, lease, on_loss=seen.append) as guard:
        sync_client.force_release(unique_key)
        assert guard.wait_lost(10)
    assert info.value is guard.loss and seen == [guard.loss]
    assert info.value.code == "lock_ownership_lost"


def test_the_block_exception_wins_over_the_loss(sync_client: VolcanoLocks, unique_key: str) -> None:
    lease = sync_client.acquire(unique_key, 5)
    with pytest.raises(ZeroDivisionError), keep(sync_client, lease) as guard:
        sync_client.force_release(unique_key)
        assert guard.wait_lost(10)
        _ = 1 / 0


def test_keep_interrupts_the_body_on_loss(sync_client: VolcanoLocks, unique_key: str) -> None:
    lease = sync_client.acquire(unique_key, 5)
    with pytest.raises(OwnershipLost) as info, keep(sync_client, lease, interrupt=True) as guard:
        sync_client.force_release(unique_key)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:  # protected work that never checks guard.lost
            time.sleep(0.02)
        pytest.fail("the body was not interrupted")
    assert info.value.code == "lock_ownership_lost" and guard.lost
    time.sleep(0.2)  # nothing fires later


def test_a_lease_without_a_safe_window_is_loss_before_the_block(
    sync_client: VolcanoLocks, unique_key: str
) -> None:
    lease = sync_client.acquire(unique_key, 5)
    from dataclasses import replace

    spent = replace(lease, local_deadline=lease.local_deadline - 5)  # as if acquired 5 s ago
    entered = False
    with pytest.raises(OwnershipLost, match="no safe renewal window") as info, keep(sync_client, spent):
        entered = True
    assert not entered and info.value.code == "no_safe_window"
    assert sync_client.get(unique_key).held  # nothing released
    sync_client.release(unique_key, lease)


async def test_async_keep_renews_and_leaves_the_lease_held(
    async_client: AsyncVolcanoLocks, unique_key: str
) -> None:
    lease = await async_client.acquire(unique_key, 5)
    async with async_keep(async_client, lease) as guard:
        await asyncio.sleep(6.5)
        assert not guard.lost and guard.lease is not None and guard.lease.expires_at > lease.expires_at
    state = await async_client.get(unique_key)
    assert state.held and state.fencing_token == lease.fencing_token
    await async_client.release(unique_key, guard.lease)


async def test_async_keep_cancels_the_block_and_raises_the_loss(
    async_client: AsyncVolcanoLocks, unique_key: str
) -> None:
    lease = await async_client.acquire(unique_key, 5)
    with pytest.raises(OwnershipLost) as info:
        async with async_keep(async_client, lease) as guard:
            await async_client.force_release(unique_key)
            await asyncio.sleep(15)
            pytest.fail("the block was not cancelled")
    assert info.value is guard.loss and info.value.code == "lock_ownership_lost"


async def test_an_outside_cancellation_stays_a_cancellation(
    async_client: AsyncVolcanoLocks, unique_key: str
) -> None:
    lease = await async_client.acquire(unique_key, 5)

    async def body() -> None:
        async with async_keep(async_client, lease):
            await asyncio.sleep(15)

    task = asyncio.create_task(body())
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (await async_client.get(unique_key)).held  # nothing released
    await async_client.release(unique_key, lease)
