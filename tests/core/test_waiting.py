"""wait_acquire: the sleep policy, timeouts, Retry-After, recovery, and the shared per-key poll."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from volcano_locks import AsyncVolcanoLocks, InvalidRequest, LockState, RateLimited, VolcanoLocks, WaitTimeout
from volcano_locks.server.harness import InProcessServer, LocalServer
from volcano_locks.waiting import FLOOR, JITTER, SharedPolls, poll_delay

NOW = datetime(2026, 11, 29, 10, 0, 0, tzinfo=UTC)


def held_until(seconds: float) -> LockState:
    return LockState(True, NOW + timedelta(seconds=seconds), 3)


# ------------------------------------------------------------------------------------------ policy


@pytest.mark.parametrize("draw", [0.0, 0.5, 0.9999])
def test_poll_is_jittered_within_jitter(draw: float) -> None:
    assert (1 - JITTER) * 5 <= poll_delay(None, poll=5, now=NOW, draw=draw) <= (1 + JITTER) * 5


def test_never_longer_than_expiry_plus_grace() -> None:
    assert poll_delay(held_until(2.0), poll=30, now=NOW, draw=0.0) == pytest.approx(3.0)
    assert poll_delay(held_until(2.0), poll=30, now=NOW, draw=0.9999) == pytest.approx(3.2, abs=1e-3)
    assert poll_delay(held_until(60.0), poll=1, now=NOW, draw=0.5) == pytest.approx(1.0)


def test_never_less_than_the_floor() -> None:
    assert poll_delay(held_until(-10.0), poll=1, now=NOW, draw=0.5) == FLOOR
    assert poll_delay(None, poll=0.01, now=NOW, draw=0.5) == FLOOR


def test_bad_arguments(volcano_server: LocalServer) -> None:
    with VolcanoLocks(volcano_server.url, service_key=volcano_server.service_key) as client:
        for kwargs in ({"timeout": -1}, {"poll": 0}, {"poll": True}, {"token": "x"}):
            with pytest.raises(InvalidRequest):
                client.wait_acquire("k", 30, **kwargs)  # type: ignore[arg-type]
        assert client.requests_sent == 0


# ------------------------------------------------------------------------------- against the server


def test_waits_for_expiry_then_acquires(movable_server: InProcessServer, unique_key: str) -> None:
    with VolcanoLocks(movable_server.url, service_key=movable_server.service_key) as client:
        holder = client.acquire(unique_key, 5)  # never renewed: lapses after 5 s (+1 s grace)
        # The server's clock, not a 6 s sleep, runs the lease out while the waiter looks.
        lapse = threading.Timer(0.5, movable_server.jump_clock, args=(6.5,))
        lapse.start()
        try:
            lease = client.wait_acquire(unique_key, 30, timeout=20, poll=1.0)
        finally:
            lapse.join()
        assert lease.fencing_token > holder.fencing_token
        assert client.requests_sent <= 12  # one look per ~1 s or at expiry + grace, not a busy loop
        client.release(unique_key, lease)


def test_timeout_reports_the_holder(volcano_server: LocalServer, unique_key: str) -> None:
    with VolcanoLocks(volcano_server.url, service_key=volcano_server.service_key) as client:
        holder = client.acquire(unique_key, 30)
        with pytest.raises(WaitTimeout) as info:
            client.wait_acquire(unique_key, 30, timeout=1.0, poll=0.3)
        assert info.value.holder is not None and info.value.holder.fencing_token == holder.fencing_token
        with pytest.raises(WaitTimeout):
            client.wait_acquire(unique_key, 30, timeout=0)  # one try, then give up
        client.release(unique_key, holder)
    assert SharedPolls.active() == 0


def test_uncertain_acquisition_in_a_wait_is_recovered(admin_server: LocalServer, unique_key: str) -> None:
    with VolcanoLocks(admin_server.url, service_key=admin_server.service_key) as client:
        admin_server.set_faults("drop:count=2:op=acquire:when=after")
        lease = client.wait_acquire(unique_key, 30, timeout=10, poll=0.3)
        assert client.get(unique_key).fencing_token == lease.fencing_token  # the same lease, not a new one
        acquires = [r for r in admin_server.requests() if r["op"] == "acquire" and unique_key in r["path"]]
        assert (
            len(acquires) == 3 and len({r["request_id"] for r in acquires}) == 1
        )  # recovered as the same op
        assert acquires[-1]["status"] == 201
        client.release(unique_key, lease)


def _granted(server: LocalServer, key: str, within: float = 30.0) -> None:
    """Wait until the server has logged granting an acquisition of `key` (logged once its reply is
    sent, after any `when=after` delay), so the lock's being free afterwards shows a release, not an
    acquisition still to be served; fails, with the key's requests, if none was granted."""
    deadline = time.monotonic() + within
    while not any(
        r["op"] == "acquire" and r["served"] == 201 and key in r["path"] for r in server.requests()
    ):
        assert time.monotonic() < deadline, [
            {k: r[k] for k in ("op", "status", "served", "fault", "request_id", "mono")}
            for r in server.requests()
            if key in r["path"]
        ]
        time.sleep(0.2)


def _free_within(client: VolcanoLocks, key: str, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while client.get(key).held and time.monotonic() < deadline:
        time.sleep(0.2)
    return not client.get(key).held


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_raise_mode_abandons_an_unanswered_acquisition_after_a_429(
    admin_server: LocalServer, unique_key: str, kind: str
) -> None:
    # contention="raise": the first acquire is refused by a 429; the next is granted but answered
    # only after the client's 1 s timeout (its own retry too), and the wait runs out there. That
    # retry was an acquisition (the only call raise mode makes), so the lease it won is released
    # behind the caller, not left held for its TTL (120 s). The wait is 2.5 s: after the 429 the
    # governor holds waiting requests for Retry-After (1 s) plus a random spread of up to 0.5 s, so a
    # 1.5 s wait could end before the next try was sent, and then nothing was granted to release.
    admin_server.set_faults("status=429:count=1:op=acquire,delay=3:count=2:op=acquire:when=after")
    url, service_key = admin_server.url, admin_server.service_key
    if kind == "sync":
        with VolcanoLocks(url, service_key=service_key, timeout=1.0) as client:
            with pytest.raises(WaitTimeout):
                client.wait_acquire(unique_key, 120, timeout=2.5, contention="raise")
            _granted(admin_server, unique_key)
            assert _free_within(client, unique_key, 20)
    else:

        async def wait() -> None:
            async with AsyncVolcanoLocks(url, service_key=service_key, timeout=1.0) as client:
                with pytest.raises(WaitTimeout):
                    await client.wait_acquire(unique_key, 120, timeout=2.5, contention="raise")
                await asyncio.to_thread(_granted, admin_server, unique_key)
                deadline = time.monotonic() + 20
                while (await client.get(unique_key)).held and time.monotonic() < deadline:
                    await asyncio.sleep(0.2)
                assert not (await client.get(unique_key)).held

        asyncio.run(wait())
    log = [r for r in admin_server.requests() if unique_key in r["path"]]
    assert log[0]["op"] == "acquire" and log[0]["status"] == 429
    assert any(r["op"] == "release" and r["status"] == 204 for r in log)  # freed by a release, not the TTL


def _gets(server: LocalServer, key: str) -> int:
    return sum(1 for r in server.requests() if r["op"] == "get" and r["path"] == f"/locks/{key}")


async def test_async_waiters_share_one_poll(volcano_server: LocalServer, unique_key: str) -> None:
    url, key = volcano_server.url, volcano_server.service_key
    async with AsyncVolcanoLocks(url, service_key=key) as holder_client:
        holder = await holder_client.acquire(unique_key, 30)
        clients = [AsyncVolcanoLocks(url, service_key=key) for _ in range(5)]  # like 5 triggers, 5 clients
        order: list[int] = []

        async def waiter(c: AsyncVolcanoLocks) -> None:
            lease = await c.wait_acquire(unique_key, 30, timeout=30, poll=0.5)
            order.append(lease.fencing_token)
            await c.release(unique_key, lease)

        start = time.monotonic()
        tasks = [asyncio.create_task(waiter(c)) for c in clients]
        await asyncio.sleep(2.0)
        assert SharedPolls.active() >= 1
        gets_while_held = _gets(volcano_server, unique_key)
        await holder_client.release(unique_key, holder)
        await asyncio.gather(*tasks)
        elapsed = time.monotonic() - start
        for c in clients:
            await c.aclose()
    assert sorted(order) == order and len(set(order)) == 5
    # One look per ~0.5 s for all five waiters together (five separate pollers would send ~5x).
    assert gets_while_held <= 2.0 / ((1 - JITTER) * 0.5) + 2
    assert _gets(volcano_server, unique_key) <= elapsed / ((1 - JITTER) * 0.5) + 6
    assert SharedPolls.active() == 0


def test_threads_share_one_poll(volcano_server: LocalServer, unique_key: str) -> None:
    url, key = volcano_server.url, volcano_server.service_key
    with VolcanoLocks(url, service_key=key) as holder_client:
        holder = holder_client.acquire(unique_key, 30)
        tokens: list[int] = []

        def waiter() -> None:
            with VolcanoLocks(url, service_key=key) as c:
                lease = c.wait_acquire(unique_key, 30, timeout=30, poll=0.5)
                tokens.append(lease.fencing_token)
                c.release(unique_key, lease)

        threads = [threading.Thread(target=waiter) for _ in range(4)]
        for t in threads:
            t.start()
        time.sleep(2.0)
        gets_while_held = _gets(volcano_server, unique_key)
        holder_client.release(unique_key, holder)
        for t in threads:
            t.join(30)
    assert len(set(tokens)) == 4
    assert gets_while_held <= 2.0 / ((1 - JITTER) * 0.5) + 2


async def test_unrelated_credentials_do_not_share(volcano_server: LocalServer, unique_key: str) -> None:
    scoped = volcano_server.mint_key(permissions=["locks.manage"])  # same project, another credential
    async with (
        AsyncVolcanoLocks(volcano_server.url, service_key=volcano_server.service_key) as a,
        AsyncVolcanoLocks(volcano_server.url, service_key=scoped) as b,
    ):
        holder = await a.acquire(unique_key, 30)
        waits = [asyncio.create_task(c.wait_acquire(unique_key, 30, timeout=1.5, poll=0.5)) for c in (a, b)]
        await asyncio.sleep(0.3)
        assert SharedPolls.active() == 2
        for w in waits:
            with pytest.raises(WaitTimeout):
                await w
        await a.release(unique_key, holder)
    assert SharedPolls.active() == 0


async def test_wait_is_cancellable(volcano_server: LocalServer, unique_key: str) -> None:
    async with AsyncVolcanoLocks(volcano_server.url, service_key=volcano_server.service_key) as client:
        holder = await client.acquire(unique_key, 30)
        task = asyncio.create_task(client.wait_acquire(unique_key, 30, timeout=None))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert SharedPolls.active() == 0
        await client.release(unique_key, holder)


def test_requests_sent_counts_waiting(volcano_server: LocalServer, unique_key: str) -> None:
    # A credential of its own: its governor's bucket is not what earlier tests left of the shared one.
    own = volcano_server.mint_key(permissions=["locks.manage"])
    with VolcanoLocks(volcano_server.url, service_key=own) as client:
        holder = client.acquire(unique_key, 30)
        before = client.requests_sent
        with pytest.raises(WaitTimeout):
            client.wait_acquire(unique_key, 30, timeout=1.2, poll=0.4)
        spent: Any = client.requests_sent - before
        assert 2 <= spent <= 6  # the first acquire plus one look per ~0.4 s
        client.release(unique_key, holder)


def test_rate_limited_wait_honours_retry_after(tmp_path: Any, unique_key: str) -> None:
    with (
        LocalServer(db=str(tmp_path / "q.sqlite3"), quota=2) as srv,
        VolcanoLocks(srv.url, service_key=srv.service_key) as client,
    ):
        for _ in range(20):  # spend the window (a minute boundary may reset it once)
            try:
                client.get(unique_key)
            except RateLimited as exc:
                retry_after = exc.retry_after
                break
        else:
            pytest.fail("quota never ran out")
        assert retry_after is not None
        before = client.requests_sent
        with pytest.raises(WaitTimeout):
            client.wait_acquire(unique_key, 30, timeout=min(2.0, retry_after - 0.5), poll=0.3)
        assert client.requests_sent - before == 1  # no look before Retry-After, however short the poll


async def test_cancelled_wait_releases_what_its_acquisition_won(
    admin_server: LocalServer, unique_key: str
) -> None:
    async with AsyncVolcanoLocks(admin_server.url, service_key=admin_server.service_key) as client:
        admin_server.set_faults("delay=1.0:count=1:op=acquire:when=after")  # granted, answered 1 s later
        task = asyncio.create_task(client.wait_acquire(unique_key, 30, timeout=10))
        await asyncio.sleep(0.4)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        deadline = time.monotonic() + 10
        while (await client.get(unique_key)).held and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert not (await client.get(unique_key)).held  # not left held for the TTL
