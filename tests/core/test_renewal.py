"""The lease keeper's timing and loss rules, with an injected clock: no sleeps, no server."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import threading
import time
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from volcano_locks.clock import lease_clock
from volcano_locks.errors import AuthError, ErrorCode, OwnershipLost, RateLimited, TransportError, Unavailable
from volcano_locks.keeping import _timing as _keep_timing
from volcano_locks.models import LockLease
from volcano_locks.renewal import (
    STOP_JITTER,
    STOP_REACH,
    AsyncLeaseKeeper,
    KeeperTiming,
    LeaseKeeper,
    Lose,
    RenewalSchedule,
    Send,
    Wait,
    backoff_delay,
    renewal_due,
    renewal_timeout,
    safe_window_end,
)

from .helpers import lease

T30 = KeeperTiming(request_timeout=renewal_timeout(10.0, 30))  # TTL 30, client timeout 10 -> 10 s


class FakeClock:
    """A monotonic clock that only moves when waited on."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now
        self.waits: list[float] = []

    def __call__(self) -> float:
        return self.now

    def wait(self, event: threading.Event, timeout: float) -> bool:
        if event.is_set():
            return True
        self.waits.append(timeout)
        self.now += timeout
        return event.is_set()


def inline(fn: Callable[[], None], name: str) -> None:
    fn()


def renewer(
    clock: FakeClock, script: list[object], *, latency: float = 0.1
) -> tuple[Callable[..., LockLease], list[tuple[float, float]]]:
    """A renew function following ``script`` (an exception to raise, or None to succeed)."""
    calls: list[tuple[float, float]] = []

    def renew(old: LockLease, timeout: float) -> LockLease:
        calls.append((clock.now, timeout))
        sent = clock.now
        clock.now += latency
        outcome = script.pop(0) if script else None
        if isinstance(outcome, BaseException):
            raise outcome
        if isinstance(outcome, float):  # a stall of that many seconds before the answer
            clock.now += outcome
        return dataclasses.replace(old, local_deadline=min(sent + old.ttl, old.absolute_deadline))

    return renew, calls


# ------------------------------------------------------------------------------------------ pure timing


def test_ttl30_renews_at_a_third_with_full_time_left() -> None:
    held = lease(ttl=30, sent=100.0)
    assert renewal_due(held, T30, 0.5) == pytest.approx(110.0)
    assert safe_window_end(held, T30) == pytest.approx(119.0)  # 130 - 1 margin - 10 timeout
    assert RenewalSchedule(held, T30, lambda: 0.5).next_action(100.0) == Wait(pytest.approx(110.0))


@pytest.mark.parametrize(("draw", "expected"), [(0.0, 109.0), (0.5, 110.0), (0.999999, 111.0)])
def test_jitter_bounds(draw: float, expected: float) -> None:
    assert renewal_due(lease(ttl=30, sent=100.0), T30, draw) == pytest.approx(expected, abs=1e-4)


def test_jitter_is_within_ten_percent_for_random_draws() -> None:
    rng = random.Random(7)
    dues = [renewal_due(lease(ttl=30, sent=0.0), T30, rng.random()) for _ in range(2000)]
    assert 9.0 <= min(dues) < 9.1 and 10.9 < max(dues) <= 11.0


def test_a_hold_that_stops_its_body_renews_inside_the_third() -> None:
    """``STOP_REACH``: the jittered interval leaves 7.6 % of a third for the round trip and the interrupt."""
    timing = dataclasses.replace(T30, reach=STOP_REACH, jitter=STOP_JITTER)
    rng = random.Random(11)
    dues = [renewal_due(lease(ttl=30, sent=0.0), timing, rng.random()) for _ in range(2000)]
    assert 8.36 <= min(dues) < 8.4 and 9.2 < max(dues) <= 9.24  # 84-92 % of the 10 s third


def test_keep_stops_its_block_at_the_stop_reach_and_only_then() -> None:
    held = lease(ttl=30, sent=lease_clock())
    stopping, plain = _keep_timing(10.0, held, stops_block=True), _keep_timing(10.0, held, stops_block=False)
    assert (stopping.reach, stopping.jitter) == (STOP_REACH, STOP_JITTER)
    assert (plain.reach, plain.jitter) == (1.0, 0.1)


def test_ttl30_with_little_time_left() -> None:
    held = lease(ttl=30, sent=0.0)
    schedule = RenewalSchedule(held, T30, lambda: 0.5)
    # Past the safe window, an attempt still fits, with its timeout cut to land 1 s before the deadline.
    assert schedule.next_action(25.0) == Send("renew", held, timeout=pytest.approx(4.0), deadline=30.0)
    assert schedule.next_action(28.5) == Send("renew", held, timeout=pytest.approx(0.5), deadline=30.0)
    lost = schedule.next_action(28.9)
    assert isinstance(lost, Lose) and lost.loss.code == ErrorCode.RENEWAL_WINDOW_EXHAUSTED


def test_long_request_timeout_pulls_renewal_earlier() -> None:
    slow = KeeperTiming(request_timeout=25.0)
    assert renewal_due(lease(ttl=30, sent=0.0), slow, 0.5) == pytest.approx(4.0)  # 30 - 1 - 25


def test_renewal_timeout_keeps_short_ttls_workable() -> None:
    assert renewal_timeout(10.0, 5) == pytest.approx(5 / 3)
    timing = KeeperTiming(request_timeout=renewal_timeout(10.0, 5))
    due = renewal_due(lease(ttl=5, sent=0.0), timing, 0.5)
    assert 0 < due <= safe_window_end(lease(ttl=5, sent=0.0), timing)


def test_ninety_day_clamp() -> None:
    # The absolute deadline falls inside the TTL: the lease cannot be extended, so no renewal is sent
    # and the keeper reports loss exactly at the absolute deadline.
    clamped = lease(ttl=30, sent=0.0, absolute=20.0)
    assert clamped.local_deadline == 20.0
    schedule = RenewalSchedule(clamped, T30, lambda: 0.5)
    assert schedule.next_action(5.0) == Wait(20.0)
    lost = schedule.next_action(20.0)
    assert isinstance(lost, Lose) and lost.loss.code == ErrorCode.ABSOLUTE_DEADLINE_REACHED


def test_ninety_day_clamp_after_renewals() -> None:
    keeper, clock, calls = make_keeper([], absolute=35.0)
    keeper.run()
    assert [round(at, 3) for at, _ in calls] == [10.0]  # the renewal that reached the deadline was the last
    assert keeper.lease.local_deadline == 35.0
    assert (
        keeper.loss is not None
        and keeper.loss.code == ErrorCode.ABSOLUTE_DEADLINE_REACHED
        and clock.now == 35.0
    )


def test_backoff_grows_and_is_capped() -> None:
    timing = KeeperTiming(request_timeout=10.0)
    assert [backoff_delay(n, timing, 0.5) for n in (1, 2, 3, 4, 5, 9)] == [0.25, 0.5, 1.0, 2.0, 4.0, 4.0]
    assert (
        backoff_delay(1, timing, 0.0) == pytest.approx(0.1875) and backoff_delay(1, timing, 0.9999) < 0.3126
    )


# ------------------------------------------------------------------------------------------ the keeper loop


def make_keeper(
    script: list[object],
    *,
    ttl: int = 30,
    latency: float = 0.1,
    on_loss: Callable[..., object] | None = None,
    clock: FakeClock | None = None,
    absolute: float | None = None,
) -> tuple[LeaseKeeper, FakeClock, list[tuple[float, float]]]:
    clock = clock or FakeClock()
    renew, calls = renewer(clock, script, latency=latency)
    timing = KeeperTiming(request_timeout=renewal_timeout(10.0, ttl))
    keeper = LeaseKeeper(
        lease(ttl=ttl, sent=clock.now, absolute=absolute),
        renew,
        timing=timing,
        clock=clock,
        wait=clock.wait,
        spawn=inline,
        rng=lambda: 0.5,
        on_loss=on_loss,
    )
    return keeper, clock, calls


def test_keeper_renews_every_third_and_measures_from_send() -> None:
    lost = OwnershipLost("gone", status=409, code="lock_ownership_lost")
    keeper, _clock, calls = make_keeper([None, None, None, lost])
    keeper.run()
    assert [round(at, 2) for at, _ in calls] == [10.0, 20.0, 30.0, 40.0]  # a third after each *send*
    assert all(timeout == 10.0 for _, timeout in calls)
    assert keeper.loss is lost


def test_transient_failures_are_retried_within_the_window() -> None:
    script: list[object] = [
        TransportError("x"),
        Unavailable("503", status=503),
        TransportError("y"),
        None,
        OwnershipLost("end"),
    ]
    keeper, _clock, calls = make_keeper(script)
    keeper.run()
    times = [round(at, 3) for at, _ in calls]
    assert times[:4] == [
        10.0,
        pytest.approx(10.35),
        pytest.approx(10.95),
        pytest.approx(12.05),
    ]  # 0.25, 0.5, 1.0 backoff
    assert (
        keeper.loss is not None and keeper.loss.message == "end"
    )  # the retries recovered; later loss is the server's
    assert times[4] == pytest.approx(22.05)  # renewed at 12.05 -> next a third later


def test_retry_after_is_honoured_exactly_within_the_window() -> None:
    keeper, _clock, calls = make_keeper(
        [RateLimited("slow", status=429, retry_after=3.0), OwnershipLost("end")]
    )
    keeper.run()
    assert [round(at, 3) for at, _ in calls] == [10.0, 13.1]


def test_retry_after_beyond_the_window_is_loss() -> None:
    keeper, clock, calls = make_keeper([RateLimited("slow", status=429, retry_after=25.0)])
    keeper.run()
    assert (
        len(calls) == 1 and keeper.loss is not None and keeper.loss.code == ErrorCode.RENEWAL_WINDOW_EXHAUSTED
    )
    assert isinstance(keeper.loss.__cause__, RateLimited) and clock.now < 11


def test_window_exhausted_by_failures_is_loss_before_the_deadline() -> None:
    keeper, clock, calls = make_keeper([TransportError(f"n{i}") for i in range(100)])
    keeper.run()
    assert keeper.loss is not None and keeper.loss.code == ErrorCode.RENEWAL_WINDOW_EXHAUSTED
    assert "failed renewal" in str(keeper.loss) and isinstance(keeper.loss.__cause__, TransportError)
    assert all(
        at + timeout <= 30.0 - 1.0 + 1e-9 for at, timeout in calls
    )  # every attempt could land 1 s early
    assert clock.now < 30.0  # reported before the local deadline


def test_stalled_renewal_is_loss_even_if_it_succeeds_late() -> None:
    keeper, _clock, calls = make_keeper([25.0])  # the first renewal answers 25 s late
    keeper.run()
    assert keeper.loss is not None and keeper.loss.code == ErrorCode.RENEWAL_STALLED and len(calls) == 1


def test_stalled_renewal_with_no_answer_is_loss_at_the_local_deadline() -> None:
    # Real threads: the renewal never answers; the keeper must not wait for it past the deadline.
    release = threading.Event()

    def renew(old: LockLease, timeout: float) -> LockLease:
        release.wait(30)
        return old

    start = time.monotonic()
    held = dataclasses.replace(lease(ttl=5, sent=start - 4.4), local_deadline=start + 0.6)
    keeper = LeaseKeeper(held, renew, timing=KeeperTiming(request_timeout=0.4, margin=0.1))
    keeper.start()
    try:
        assert keeper.wait_lost(10)
        assert keeper.loss is not None and keeper.loss.code == ErrorCode.RENEWAL_STALLED
        assert time.monotonic() - start < 5  # generous: only catches a keeper that waited for the answer
    finally:
        release.set()
        keeper.stop()


def test_ownership_lost_and_other_errors_are_final() -> None:
    keeper, _, calls = make_keeper([AuthError("revoked", status=401), None])
    keeper.run()
    assert keeper.loss is not None and keeper.loss.code == ErrorCode.RENEWAL_FAILED and len(calls) == 1
    assert isinstance(keeper.loss.__cause__, AuthError)


def test_first_loss_reason_is_kept_and_reported_once() -> None:
    reported: list[OwnershipLost] = []
    first = OwnershipLost("first", code="lock_ownership_lost")
    keeper, _clock, _ = make_keeper([first], on_loss=reported.append)
    keeper.run()
    assert keeper.loss is first and reported == [first]
    schedule = RenewalSchedule(lease(), T30)
    assert schedule.lose(first) is first and schedule.lose(OwnershipLost("later")) is first


def test_keeper_never_dies_silently() -> None:
    calls = {"n": 0}

    def broken_clock() -> float:
        calls["n"] += 1
        if calls["n"] > 3:
            raise RuntimeError("clock broke")
        return 0.0

    reported: list[OwnershipLost] = []
    keeper = LeaseKeeper(
        lease(),
        lambda old, t: old,
        timing=T30,
        clock=broken_clock,
        wait=lambda e, t: False,
        spawn=inline,
        on_loss=reported.append,
    )
    keeper.run()
    assert (
        keeper.loss is not None and keeper.loss.code == ErrorCode.KEEPER_FAILED and reported == [keeper.loss]
    )
    assert isinstance(keeper.loss.__cause__, RuntimeError)


def test_on_loss_failure_is_logged_not_fatal(caplog: pytest.LogCaptureFixture) -> None:
    def bad(loss: OwnershipLost) -> None:
        raise ValueError("callback bug")

    keeper, _, _ = make_keeper([OwnershipLost("x")], on_loss=bad)
    keeper.run()
    assert keeper.lost and "on_loss callback failed" in caplog.text


def test_named_thread_stop_and_join() -> None:
    keeper = LeaseKeeper(
        lease(key="thread-name", ttl=3600, sent=time.monotonic()), lambda old, t: old, timing=T30
    )
    keeper.start()
    assert "volcano-lock-keeper:thread-name" in {t.name for t in threading.enumerate()}
    keeper.stop()
    assert "volcano-lock-keeper:thread-name" not in {t.name for t in threading.enumerate()}
    assert not keeper.lost and keeper.wait_lost(0) is False


# ------------------------------------------------------------------------------------------ async keeper


async def test_async_keeper_with_injected_clock() -> None:
    clock = FakeClock()
    script: list[object] = [None, Unavailable("x"), None, OwnershipLost("end")]
    renew_sync, calls = renewer(clock, script)

    async def renew(old: LockLease, timeout: float) -> LockLease:
        return renew_sync(old, timeout)

    async def sleep(delay: float) -> None:
        clock.now += delay
        await asyncio.sleep(0)

    keeper = AsyncLeaseKeeper(
        lease(key="ak", ttl=30), renew, timing=T30, clock=clock, sleep=sleep, rng=lambda: 0.5
    )
    keeper.start()
    assert await keeper.wait_lost(5)
    assert [round(at, 2) for at, _ in calls] == [10.0, 20.0, 20.35, 30.35]
    assert keeper.loss is not None and keeper.loss.message == "end"
    await keeper.stop()


async def test_async_keeper_task_is_named_and_stops() -> None:
    async def renew(old: LockLease, timeout: float) -> LockLease:
        return old

    keeper = AsyncLeaseKeeper(lease(key="ak2", ttl=3600, sent=time.monotonic()), renew, timing=T30)
    keeper.start()
    await asyncio.sleep(0)
    assert "volcano-lock-keeper:ak2" in {t.get_name() for t in asyncio.all_tasks()}
    await keeper.stop()
    assert "volcano-lock-keeper:ak2" not in {t.get_name() for t in asyncio.all_tasks()}
    assert not keeper.lost and await keeper.wait_lost(0) is False


async def test_async_stalled_renewal_is_loss_at_the_deadline() -> None:
    async def renew(old: LockLease, timeout: float) -> LockLease:
        await asyncio.sleep(30)
        return old

    start = time.monotonic()
    held = dataclasses.replace(lease(ttl=5, sent=start - 4.4), local_deadline=start + 0.6)
    keeper = AsyncLeaseKeeper(held, renew, timing=KeeperTiming(request_timeout=0.4, margin=0.1))
    keeper.start()
    assert await keeper.wait_lost(10)
    assert keeper.loss is not None and keeper.loss.code == ErrorCode.RENEWAL_STALLED
    await keeper.stop()


# ------------------------------------------------------------------------------------------ invariants

_outcome = st.one_of(
    st.none(),
    st.just("transport"),
    st.just("503"),
    st.floats(min_value=1, max_value=60).map(lambda s: ("429", s)),
)


@settings(max_examples=150, deadline=None)
@given(
    ttl=st.integers(min_value=5, max_value=600),
    client_timeout=st.floats(min_value=0.5, max_value=30),
    script=st.lists(_outcome, max_size=30),
    latency=st.floats(min_value=0.0, max_value=0.9),
    seed=st.integers(0, 2**32 - 1),
)
def test_schedule_invariants(
    ttl: int, client_timeout: float, script: list[object], latency: float, seed: int
) -> None:
    """Whatever the server does, every attempt can land 1 s early, and loss is never reported late."""
    rng = random.Random(seed)
    timing = KeeperTiming(request_timeout=renewal_timeout(client_timeout, ttl))
    schedule = RenewalSchedule(lease(ttl=ttl, sent=0.0), timing, rng.random)
    now = 0.0
    for _ in range(200):
        action = schedule.next_action(now)
        if isinstance(action, Lose):
            assert now <= schedule.lease.local_deadline + 1e-9
            return
        if isinstance(action, Wait):
            assert action.until > now and action.until <= schedule.lease.local_deadline
            now = action.until
            continue
        held = schedule.lease
        assert action.op == "renew" and action.lease is held and action.timeout is not None
        assert action.timeout >= timing.min_attempt
        assert now + action.timeout <= held.local_deadline - timing.margin + 1e-9
        took = latency * action.timeout
        outcome = script.pop(0) if script else OwnershipLost("end")
        sent, now = now, now + took
        if outcome is None:
            schedule.succeeded(dataclasses.replace(held, local_deadline=sent + ttl), now)
        elif outcome == "transport":
            schedule.failed(TransportError("x"), now)
        elif outcome == "503":
            schedule.failed(Unavailable("x", status=503), now)
        elif isinstance(outcome, tuple):
            schedule.failed(RateLimited("x", status=429, retry_after=outcome[1]), now)
        else:
            schedule.failed(outcome, now)  # type: ignore[arg-type]
    pytest.fail("the schedule did not reach a decision")
