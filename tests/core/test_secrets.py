"""No service key or ownership token in any log line, repr or exception text, across every path."""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

import pytest

from volcano_locks import AsyncVolcanoLocks, LockContention, OwnershipLost, VolcanoLocks, WaitTimeout
from volcano_locks.server.harness import LocalServer


def test_nothing_secret_leaks(
    admin_server: LocalServer, unique_key: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    service_key = admin_server.service_key
    token = str(uuid.uuid4())
    texts: list[str] = []

    def record(*objects: Any) -> None:
        for obj in objects:
            texts.extend([repr(obj), str(obj)])
            if isinstance(obj, BaseException):
                cause = obj.__cause__
                while cause is not None:
                    texts.extend([repr(cause), str(cause)])
                    cause = cause.__cause__

    with VolcanoLocks(admin_server.url, service_key=service_key) as client:
        record(client)
        lease = client.acquire(unique_key, 5, token=token)
        record(lease, lease.public_dict(), client.get(unique_key))
        for call in (
            lambda: client.acquire(unique_key, 5),
            lambda: client.wait_acquire(unique_key, 5, timeout=0.5, poll=0.3),
            lambda: client.acquire("bad key", 5, token=token),
            lambda: client.acquire(unique_key, 5, token=token + "x"),
        ):
            with pytest.raises(Exception) as info:
                call()
            record(info.value)
        admin_server.set_faults("drop:count=2:op=acquire,status=503:count=1:op=renew")
        with pytest.raises(Exception) as info:
            client.acquire(unique_key + "x", 5, token=token)
        record(info.value)
        with pytest.raises(Exception) as info:
            client.renew(unique_key, lease)
        record(info.value)
        admin_server.set_faults(None)
        client.release(unique_key, lease)
        with pytest.raises(OwnershipLost) as lost, client.with_lock(unique_key, 5, token=token) as guard:
            record(guard)
            client.force_release(unique_key)
            guard.wait_lost(10)
        record(lost.value, guard)
        client.force_release(unique_key + "x")

    async def run_async() -> None:
        async with AsyncVolcanoLocks(admin_server.url, service_key=service_key) as aclient:
            record(aclient)
            with pytest.raises(OwnershipLost) as alost:
                async with aclient.with_lock(unique_key, 5, token=str(uuid.uuid4())) as aguard:
                    record(aguard)
                    await aclient.force_release(unique_key)
                    await asyncio.sleep(10)
            record(alost.value)
            holder = await aclient.acquire(unique_key, 5, token=token)
            with pytest.raises((LockContention, WaitTimeout)) as contention:
                await aclient.wait_acquire(unique_key, 5, timeout=0.5)
            record(contention.value)
            await aclient.release(unique_key, holder)

    asyncio.run(run_async())
    logged = [r.getMessage() for r in caplog.records] + [caplog.text]
    assert any("request id" in line for line in logged)  # logs do carry request ids
    for text in texts + logged:
        assert token not in text
        assert service_key not in text
