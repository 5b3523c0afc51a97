"""The client and keeper against a misbehaving server: total deadlines, body caps, sane Retry-After,
the server's earlier expiry, renewals at least once a minute, and the suspend-aware lease clock."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from volcano_locks import AsyncVolcanoLocks, ProtocolError, RateLimited, TransportError, VolcanoLocks
from volcano_locks.clock import SUSPEND_AWARE, lease_clock
from volcano_locks.governor import BLACKOUT_SPREAD, WINDOW
from volcano_locks.protocol import MAX_RETRY_AFTER
from volcano_locks.renewal import KeeperTiming, RenewalSchedule, Wait, renewal_interval
from volcano_locks.server.harness import LocalServer

from .helpers import lease, make_client
from .misbehaving import answer, drip, huge_body, misbehaving

KEY = "hardening"
SERVICE_KEY = "not-a-real-key-for-a-fake-server"
HANG_BOUND = 8.0  # a generous bound that only catches a hang: every call below is given 1 s


# ------------------------------------------------------------------------ total deadline per request


@pytest.mark.parametrize("op", ["acquire", "get", "release"])
def test_a_dripping_server_cannot_hold_a_sync_call_past_its_timeout(op: str) -> None:
    with misbehaving(drip()) as url, VolcanoLocks(url, service_key=SERVICE_KEY, timeout=1.0) as client:
        started = time.monotonic()
        with pytest.raises(TransportError, match="no complete response within 1 s"):
            if op == "acquire":
                client.acquire(KEY, 30)
            elif op == "get":
                client.get(KEY)
            else:
                client.release(KEY, lease(key=KEY))
        # acquire is retried once (contract), so it may take two timeouts; never the drip's 30 s.
        assert time.monotonic() - started < HANG_BOUND


async def test_a_dripping_server_cannot_hold_an_async_call_past_its_timeout() -> None:
    with misbehaving(drip()) as url:
        async with AsyncVolcanoLocks(url, service_key=SERVICE_KEY, timeout=1.0) as client:
            started = time.monotonic()
            with pytest.raises(TransportError, match="no complete response within 1 s"):
                await client.get(KEY)
            assert time.monotonic() - started < HANG_BOUND


def test_with_lock_exit_is_bounded_when_the_release_drips(
    volcano_server: LocalServer, unique_key: str
) -> None:
    # Acquire on the real server, then release against a dripping one: the exit must not hang.
    with VolcanoLocks(volcano_server.url, service_key=volcano_server.service_key) as real:
        held = real.acquire(unique_key, 30)
    with misbehaving(drip()) as url, VolcanoLocks(url, service_key=SERVICE_KEY, timeout=1.0) as client:
        started = time.monotonic()
        with pytest.raises(TransportError):
            client.release(unique_key, held)
        assert time.monotonic() - started < HANG_BOUND
    with VolcanoLocks(volcano_server.url, service_key=volcano_server.service_key) as real:
        real.release(unique_key, held)


# ------------------------------------------------------------- nothing outlives a timed-out call


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _sockets_to(port: int) -> int:
    """TCP sockets this process holds open (an fd) whose peer is ``port`` on loopback (/proc/net/tcp)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[len("socket:[") : -1])
    with open("/proc/net/tcp") as table:
        rows = [line.split() for line in table.read().splitlines()[1:]]
    return sum(1 for row in rows if int(row[2].split(":")[1], 16) == port and row[9] in inodes)


def _settles(check: Callable[[], bool], bound: float = HANG_BOUND) -> bool:
    ends = time.monotonic() + bound
    while not check():
        if time.monotonic() > ends:
            return False
        time.sleep(0.1)
    return True


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_timed_out_calls_leave_no_thread_socket_or_connection_behind(kind: str) -> None:
    threads, fds = threading.active_count(), _fds()
    with misbehaving(drip()) as url:
        port = int(url.rsplit(":", 1)[1])
        client, close = make_client(kind, url, SERVICE_KEY, timeout=1.0)
        try:
            for call in (lambda: client.get(KEY), lambda: client.release(KEY, lease(key=KEY))):
                with pytest.raises(TransportError, match="no complete response within 1 s"):
                    call()
                assert _sockets_to(port) == 0  # the timed-out request's connection is closed now
            with pytest.raises(TransportError):
                client.acquire(KEY, 30)  # uncertain: its clean-up releases go out behind it
        finally:
            started = time.monotonic()
            close()
            assert time.monotonic() - started < HANG_BOUND  # one last clean-up round, bounded
        assert _sockets_to(port) == 0
        assert not [t.name for t in threading.enumerate() if t.name.startswith("volcano-locks")]
    # The dripping server's own threads end once their peers are gone; then we are back where we were.
    assert _settles(lambda: threading.active_count() <= threads and _fds() <= fds), (
        f"threads {threads} -> {threading.active_count()}, fds {fds} -> {_fds()}"
    )


# ------------------------------------------------------------------------------------ body cap


def test_a_huge_body_is_refused_not_read_whole() -> None:
    with (
        misbehaving(huge_body()) as url,
        VolcanoLocks(url, service_key=SERVICE_KEY, timeout=5.0) as client,
        pytest.raises(ProtocolError, match="larger than 65536 bytes"),
    ):
        client.get(KEY)


async def test_a_huge_body_is_refused_by_the_async_client_too() -> None:
    with misbehaving(huge_body()) as url:
        async with AsyncVolcanoLocks(url, service_key=SERVICE_KEY, timeout=5.0) as client:
            with pytest.raises(ProtocolError, match="larger than 65536 bytes"):
                await client.get(KEY)


# ------------------------------------------------------------------------------ Retry-After


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("12", 12.0),
        ("99999999", MAX_RETRY_AFTER),
        ("1e308", MAX_RETRY_AFTER),
        ("1e400", None),
        ("nan", None),
        ("-3", None),
        ("9" * 400, None),
        ("soon", None),
    ],
)
def test_retry_after_is_capped_and_never_an_untyped_error(header: str, expected: float | None) -> None:
    body = json.dumps({"error": "slow down", "code": "lock_rate_limited"}).encode()
    with (
        misbehaving(answer(429, body, {"Retry-After": header})) as url,
        VolcanoLocks(url, service_key=SERVICE_KEY) as client,
        pytest.raises(RateLimited) as info,
    ):
        client.get(KEY)
    assert info.value.retry_after == expected
    # The process's waiting stops for the (capped) Retry-After, plus at most the spread; without a
    # usable one, for what is left of the clock-aligned window (what the contract's header would say).
    blocked = client.governor.blocked_until - lease_clock()
    left_in_window = WINDOW - time.time() % WINDOW
    assert blocked <= (expected if expected is not None else left_in_window) + BLACKOUT_SPREAD + 1.0


# ------------------------------------------------------------------ the server's earlier expiry


def test_the_servers_earlier_expiry_wins_over_the_local_ttl() -> None:
    soon = (datetime.now(UTC) + timedelta(seconds=3)).isoformat().replace("+00:00", "Z")
    body = json.dumps({"expires_at": soon, "fencing_token": 5}).encode()
    with misbehaving(answer(201, body)) as url, VolcanoLocks(url, service_key=SERVICE_KEY) as client:
        started = lease_clock()
        got = client.acquire(KEY, 30)
    assert got.local_deadline - started < 3.5  # not 30 s: the server says the lease ends in 3


def test_the_local_ttl_wins_when_the_server_claims_longer(
    volcano_server: LocalServer, unique_key: str
) -> None:
    with VolcanoLocks(volcano_server.url, service_key=volcano_server.service_key) as client:
        started = lease_clock()
        got = client.acquire(unique_key, 30)
        assert 29.0 < got.local_deadline - started <= lease_clock() - started + 30.0
        client.release(unique_key, got)


# ---------------------------------------------------------------------- renewals once a minute


@pytest.mark.parametrize(("ttl", "interval"), [(15, 5.0), (180, 60.0), (3600, 60.0), (7_776_000, 60.0)])
def test_renewals_come_at_least_once_a_minute(ttl: int, interval: float) -> None:
    assert renewal_interval(ttl) == interval
    schedule = RenewalSchedule(lease(ttl=ttl, sent=0.0), KeeperTiming(request_timeout=2.0), rng=lambda: 0.5)
    action = schedule.next_action(0.0)
    assert isinstance(action, Wait) and action.until == pytest.approx(interval)


def test_a_ninety_day_lease_keeps_checking_once_a_minute_after_each_renewal() -> None:
    timing = KeeperTiming(request_timeout=2.0)
    capped = lease(ttl=7_776_000, sent=0.0)  # its TTL reaches the 90-day cap
    schedule = RenewalSchedule(capped, timing, rng=lambda: 0.5)
    schedule.succeeded(capped, 61.0)  # renewed at 61 s: the server kept the cap
    action = schedule.next_action(61.0)
    assert isinstance(action, Wait) and 61.0 + 54.0 <= action.until <= 61.0 + 66.0


def test_a_ninety_day_lease_of_a_hold_that_stops_its_body_keeps_its_earlier_reach() -> None:
    from volcano_locks.renewal import STOP_JITTER, STOP_REACH

    timing = KeeperTiming(request_timeout=2.0, reach=STOP_REACH, jitter=STOP_JITTER)
    capped = lease(ttl=7_776_000, sent=0.0)
    schedule = RenewalSchedule(capped, timing, rng=lambda: 0.5)
    schedule.succeeded(capped, 61.0)
    action = schedule.next_action(61.0)
    # 60 s x 0.88, less the 5 % jitter: the same reach as every other renewal of such a hold
    assert isinstance(action, Wait) and action.until == pytest.approx(
        61.0 + 60.0 * STOP_REACH * (1 - STOP_JITTER)
    )


def test_a_force_released_long_ttl_lease_is_noticed_within_about_a_minute() -> None:
    from volcano_locks import OwnershipLost

    schedule = RenewalSchedule(
        lease(ttl=3600, sent=0.0), KeeperTiming(request_timeout=10.0), rng=lambda: 0.99
    )
    action = schedule.next_action(0.0)
    assert isinstance(action, Wait) and action.until <= 66.0  # 60 s + 10 % jitter
    schedule.failed(OwnershipLost("force released", code="lock_ownership_lost"), action.until)
    assert schedule.loss is not None


# ------------------------------------------------------------------------------- lease clock


def test_the_lease_clock_counts_through_suspension_where_the_platform_can() -> None:
    if hasattr(time, "CLOCK_BOOTTIME"):
        assert SUSPEND_AWARE
        assert abs(lease_clock() - time.clock_gettime(time.CLOCK_BOOTTIME)) < 0.5


def test_leases_are_measured_on_the_lease_clock(volcano_server: LocalServer, unique_key: str) -> None:
    with VolcanoLocks(volcano_server.url, service_key=volcano_server.service_key) as client:
        before = lease_clock()
        got = client.acquire(unique_key, 10)
        after = lease_clock()
        assert before + 10 <= got.local_deadline <= after + 10
        client.release(unique_key, got)
