"""No request outlives its caller, and an acquisition that lands after its caller gave up is released.

Against the real local server delaying ``acquire`` past the callers' 1 s timeout: every POST of a
caller reaches the server before that caller raised (none was queued to go out later), the server does
grant those acquisitions once its delay is over, and the client releases each of them behind its
caller, so no key is left held. A caller that brought its own token owns recovery and is left to it.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from volcano_locks import AsyncVolcanoLocks, TransportError, VolcanoLocks
from volcano_locks.errors import LockContention, ServerError, Unavailable
from volcano_locks.orphans import RELEASE_AT, Attempt, Ledger, Orphan, uncertain
from volcano_locks.server.harness import LocalServer

CALLERS = 16
DELAY = 5.0  # the server answers acquire after this long; the callers give up after 1 s (twice)
TTL = 120  # far past every bound below: a key found free was released, it did not expire
FREE_BOUND = 25.0  # generous: the releases due after the delay come at gave_up + 7.5 s


@pytest.fixture(scope="module")
def server() -> Iterator[LocalServer]:
    """A server of its own: its request log holds only this module's requests."""
    with LocalServer(admin=True, quota=1_000_000) as srv:
        yield srv


def _keys(prefix: str) -> list[str]:
    run = uuid.uuid4().hex[:8]
    return [f"{prefix}-{run}-{n}" for n in range(CALLERS)]


def _held(server: LocalServer, keys: list[str]) -> list[str]:
    with VolcanoLocks(server.url, service_key=server.service_key) as observer:
        return [k for k in keys if observer.get(k).held]


def _wait_free(server: LocalServer, keys: list[str], posts: int = 2) -> list[str]:
    """Once the server has served every POST (its log has them), wait for the keys to be free."""
    ends = time.monotonic() + FREE_BOUND
    while time.monotonic() < ends:
        served = _by_key(server, keys, "acquire")
        if all(len(served[k]) >= posts for k in keys):
            break
        time.sleep(0.25)
    held = _held(server, keys)
    while held and time.monotonic() < ends:
        time.sleep(0.5)
        held = _held(server, keys)
    return held


def _by_key(server: LocalServer, keys: list[str], op: str) -> dict[str, list[dict[str, Any]]]:
    log = server.requests()
    return {k: [r for r in log if r["op"] == op and r["path"] == f"/locks/{k}/lease"] for k in keys}


def _check(server: LocalServer, keys: list[str], raised: dict[str, float]) -> None:
    assert sorted(raised) == sorted(keys)  # every caller raised
    posts = _by_key(server, keys, "acquire")
    for key in keys:
        assert len(posts[key]) == 2  # the first attempt and its one retry, nothing more
        # "time" is when the server had read the request: each came before its caller raised.
        late = [r["time"] - raised[key] for r in posts[key] if r["time"] > raised[key]]
        assert not late, f"{key}: POSTs reached the server {late} s after the caller raised"
    # The server did grant what the callers had given up on: the clean-up had something to do.
    assert sum(r["status"] == 201 for k in keys for r in posts[k]) >= CALLERS
    releases = _by_key(server, keys, "release")
    assert all(releases[k] and all(r["status"] == 204 for r in releases[k]) for k in keys)


@pytest.mark.slow
@pytest.mark.parametrize("when", ["before", "after"])
def test_sixteen_abandoned_sync_acquisitions_leave_nothing_held(server: LocalServer, when: str) -> None:
    keys = _keys(f"abandon-sync-{when}")
    raised: dict[str, float] = {}
    server.set_faults(f"delay={DELAY:g}:op=acquire:when={when}")
    try:
        with VolcanoLocks(server.url, service_key=server.service_key, timeout=1.0) as client:

            def caller(key: str) -> None:
                try:
                    client.acquire(key, TTL)
                except TransportError:
                    raised[key] = time.time()

            threads = [threading.Thread(target=caller, args=(k,)) for k in keys]
            for t in threads:
                t.start()
            for t in threads:
                t.join(10)
            assert time.time() - min(raised.values()) < DELAY  # they gave up before the server answered
            still_held = _wait_free(server, keys)  # the client is open: its clean-up runs meanwhile
    finally:
        server.set_faults(None)
    assert not still_held
    _check(server, keys, raised)


@pytest.mark.slow
async def test_sixteen_abandoned_async_acquisitions_leave_nothing_held(server: LocalServer) -> None:
    keys = _keys("abandon-async")
    raised: dict[str, float] = {}
    server.set_faults(f"delay={DELAY:g}:op=acquire:when=before")
    try:
        async with AsyncVolcanoLocks(server.url, service_key=server.service_key, timeout=1.0) as client:

            async def caller(key: str) -> None:
                try:
                    await client.acquire(key, TTL)
                except TransportError:
                    raised[key] = time.time()

            await asyncio.gather(*(caller(k) for k in keys))
            still_held = await asyncio.to_thread(_wait_free, server, keys)
    finally:
        server.set_faults(None)
    assert not still_held
    _check(server, keys, raised)


async def test_a_cancelled_async_acquisition_is_released(server: LocalServer) -> None:
    key = _keys("cancelled")[0]
    server.set_faults("delay=3:op=acquire:when=after")  # granted at once, answered 3 s later
    try:
        async with AsyncVolcanoLocks(server.url, service_key=server.service_key, timeout=10.0) as client:
            attempt = asyncio.create_task(client.acquire(key, TTL))
            await asyncio.sleep(1.0)
            assert _held(server, [key]) == [key]  # the server granted it; the caller has no lease
            attempt.cancel()
            with pytest.raises(asyncio.CancelledError):
                await attempt
            still_held = await asyncio.to_thread(_wait_free, server, [key], 1)
    finally:
        server.set_faults(None)
    assert not still_held
    assert len(_by_key(server, [key], "acquire")[key]) == 1


def test_a_callers_own_token_is_left_for_the_caller_to_recover(server: LocalServer) -> None:
    key = _keys("own-token")[0]
    token, request_id = str(uuid.uuid4()), str(uuid.uuid4())
    server.set_faults("delay=2:op=acquire:when=after")
    try:
        with VolcanoLocks(server.url, service_key=server.service_key, timeout=0.5) as client:
            with pytest.raises(TransportError):
                client.acquire(key, TTL, token=token, request_id=request_id)
            server.set_faults(None)
            time.sleep(RELEASE_AT[3] + 0.5)  # past the clean-up releases a client-made token would get
            assert _held(server, [key]) == [key]
            recovered = client.acquire(key, TTL, token=token, request_id=request_id)  # the contract's way
            assert recovered.token == token
            client.release(key, recovered)
    finally:
        server.set_faults(None)
    assert not _by_key(server, [key], "release")[key][:-1]  # the caller's own release is the only one


# --------------------------------------------------------------------------------- sans-I/O parts


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (TransportError("no response"), True),
        (Unavailable("503", status=503), True),
        (ServerError("500", status=500), True),
        (asyncio.CancelledError(), True),
        (KeyboardInterrupt(), True),
        (LockContention("held", status=409), False),
    ],
)
def test_which_endings_leave_an_acquisition_possibly_granted(exc: BaseException, expected: bool) -> None:
    assert uncertain(exc) is expected


def test_only_a_client_made_token_that_was_sent_is_cleaned_up() -> None:
    made = Attempt.start(None, None)
    assert made.generated and not made.abandoned(TransportError("x"))  # nothing sent yet
    made.sent = True
    assert made.abandoned(TransportError("x")) and not made.abandoned(LockContention("held", status=409))
    own = Attempt.start(str(uuid.uuid4()), None)
    own.sent = True
    assert not own.abandoned(TransportError("x"))
    assert made.token not in repr(made)


def test_the_ledger_releases_on_its_schedule_then_forgets() -> None:
    ledger = Ledger((0.0, 1.0, 4.0))
    a, b = Orphan("a", str(uuid.uuid4()), "r1", 10.0), Orphan("b", str(uuid.uuid4()), "r2", 10.5)
    ledger.add(a)
    ledger.add(b)
    assert ledger.due(10.0) == [a] and ledger.next_at() == 10.5
    assert ledger.due(11.2) == [b, a]
    assert ledger.due(11.2) == [] and ledger.next_at() == 11.5
    assert ledger.due(13.9) == [b] and ledger.next_at() == 14.0
    assert ledger.due(20.0) == [a, b] and ledger.next_at() is None and len(ledger) == 0


def test_the_last_round_releases_each_pending_orphan_once() -> None:
    ledger = Ledger()
    orphans = [Orphan(f"k{n}", str(uuid.uuid4()), f"r{n}", 0.0) for n in range(3)]
    for o in orphans:
        ledger.add(o)
    ledger.due(1.0)  # two steps taken each; the rest are still scheduled
    assert sorted(o.key for o in ledger.drain()) == ["k0", "k1", "k2"] and ledger.next_at() is None
