"""The engine's decisions for one waiter, as a sans-I/O flow: when to look, when to acquire, what it learnt.

:func:`_wait_flow` yields :class:`~volcano_locks._steps.Wait` and :class:`~volcano_locks._steps.Send`
steps and receives each call's outcome; :func:`_settle` folds an outcome into the key's knowledge and
the waiter's state. The drivers (:mod:`volcano_locks.waiting.drivers`) perform the steps.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Generator
from datetime import UTC, datetime

from volcano_locks._steps import Op, Send, Wait
from volcano_locks.errors import (
    ConflictError,
    ErrorCode,
    RateLimited,
    ServerError,
    TransportError,
    Unavailable,
    WaitTimeout,
)
from volcano_locks.eta import reporting
from volcano_locks.governor import Governor
from volcano_locks.models import LockLease, LockState
from volcano_locks.waiting.policy import FLOOR, OnWaiting, WaitPolicy, poll_delay, until_ended
from volcano_locks.waiting.registry import _KeyWait
from volcano_locks.waiting.waiter import _Booking, _Waiter

__all__: list[str] = []

logger = logging.getLogger("volcano_locks.waiting")

_Step = Wait | Send
_Flow = Generator[_Step, object, LockLease]


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _wait_flow(
    entry: _KeyWait,
    waiter: _Waiter,
    governor: Governor,
    policy: WaitPolicy,
    timeout: float | None,
    on_waiting: OnWaiting | None,
    clock: Callable[[], float],
    rng: Callable[[], float],
    wall: Callable[[], datetime] = _utcnow,
    *,
    raising: bool = False,
) -> Generator[_Step, object, LockLease]:
    """The engine's decisions for one waiter: yields steps, receives outcomes, returns the lease.

    ``clock`` is the lease clock (when to send), ``wall`` the aware UTC time that holders' expiries
    are compared with; both are injectable so a fleet of waiters can be simulated. A ``raising``
    waiter (``contention="raise"``) never looks: every request it sends is an acquisition, so one
    that gets no answer is booked as uncertain and abandoned if the wait ends there.
    """
    started = clock()
    deadline = None if timeout is None else started + timeout
    next_report: float | None = None  # set at the first refusal: that is when waiting starts
    try:
        while True:
            now = clock()
            if not waiter.first and deadline is not None and now >= deadline:
                raise WaitTimeout(
                    f"lock {waiter.key!r} still held after waiting {timeout:g} s",
                    code=ErrorCode.WAIT_TIMEOUT,
                    holder=entry.holder,
                )
            if next_report is not None and now >= next_report:
                next_report = now + policy.report_every
                if on_waiting is not None:
                    _report(on_waiting, entry, waiter, now, started)
            horizon = min((t for t in (deadline, next_report) if t is not None), default=math.inf)
            is_head = entry.head() is waiter
            if not is_head and not waiter.first:  # a newcomer's first attempt does not queue
                yield Wait(horizon)
                continue
            with entry.lock:
                informed = is_head and (entry.woken or entry.free_seen)
            if waiter.booking is not None and informed and waiter.booking.op == "get":
                governor.refund()  # told the lock is free: acquire ahead of the read that was booked
                waiter.booking = None
            if waiter.booking is None:
                if not (waiter.first or informed) and now < entry.next_look_at:
                    yield Wait(min(entry.next_look_at, horizon))
                    continue
                booked: Op = "acquire" if raising or waiter.direct or informed else "get"
                # A first attempt is billed like any waiting request (500 triggers restarting at once
                # must not spend the project's minute), but a 429's blackout does not hold it.
                at = governor.reserve(priority=informed, honour_blackout=not waiter.first)
                waiter.booking = _Booking(booked, at)
            # At send time, not only at booking: a 429 that arrived since holds this request too.
            at = waiter.booking.at
            send_at = at if waiter.first else max(at, governor.blocked_until)
            if now < send_at:
                yield Wait(min(send_at, horizon))
                continue
            op, waiter.booking = waiter.booking.op, None
            if is_head:
                with entry.lock:
                    entry.woken = False
            waiter.sending(op)
            outcome = yield Send(op)
            first = waiter.first
            lease = _settle(entry, waiter, op, outcome, governor, policy, clock(), rng, is_head, wall())
            if lease is not None:
                if not first:
                    logger.info(
                        "acquired lock %r after waiting %.1f s (fencing token %d)",
                        waiter.key,
                        clock() - started,
                        lease.fencing_token,
                    )
                return lease
            if next_report is None and entry.holder is not None:
                if entry.holder.fencing_token is None and first and is_head and on_waiting is not None:
                    # A refusal does not say who holds the lock; the waiter who reports the wait
                    # looks once at once (from the budget, like any look) so the report can.
                    entry.next_look_at = clock()
                    continue
                next_report = clock() + policy.report_every
                if on_waiting is not None:
                    _report(on_waiting, entry, waiter, clock(), started)
    finally:
        if waiter.booking is not None:
            governor.refund()
            waiter.booking = None


def _report(on_waiting: OnWaiting, entry: _KeyWait, waiter: _Waiter, now: float, started: float) -> None:
    """Call ``on_waiting`` with the holder and the time waited; :func:`volcano_locks.eta.reported` gives
    the waiter's expected start meanwhile."""
    looked = None if entry.looked_at is None else max(0.0, now - entry.looked_at)
    with reporting(entry.eta(waiter, now), holder_age=looked):
        on_waiting(entry.holder, now - started)


def _settle(
    entry: _KeyWait,
    waiter: _Waiter,
    op: Op,
    outcome: object,
    governor: Governor,
    policy: WaitPolicy,
    now: float,
    rng: Callable[[], float],
    is_head: bool,
    wall: datetime,
) -> LockLease | None:
    """Fold one outcome into the key's knowledge; return the lease if the waiter got it.

    Only the head moves the key's schedule (its backoff and next look); a newcomer's first attempt
    adds what it learnt of the holder.
    """

    def look_later(holder: LockState | None) -> None:
        if not is_head:
            return
        if policy.at_expiry:
            look_at_expiry(holder)
            return
        vouched = entry.vouched_cap(holder)
        if vouched is not None:
            # Its end is announced (`vouch`): looks are the safety net only, at the vouched cap (and at
            # the lease's end when the holder is not seen renewing: a crash nobody reported).
            entry.next_look_at = now + poll_delay(
                holder, poll=vouched, now=wall, draw=rng(), renewing=entry.renewing
            )
            return
        # A poller for many waiters looks every half poll while a line passes (the next handoff is
        # due); past twice the last tenure (and its slack) it is a long holder: back off, cost little.
        turnover = policy.follow_turnover and entry.in_turnover(now, policy.cap)
        delay = policy.poll if entry.delay is None else entry.delay
        entry.next_look_at = now + poll_delay(
            holder, poll=policy.poll / 2 if turnover else delay, now=wall, draw=rng(), renewing=entry.renewing
        )
        if not turnover:
            entry.delay = policy.grown(delay, same_holder=not entry.moved)

    def look_at_expiry(holder: LockState | None) -> None:
        # Releases wake this waiter: look when the holder's lease ends unrenewed (the first in line
        # even when it renews), but no later than about ``cap`` from now: a holder whose release is
        # announced nowhere (another client, another orchestrator, a lost event) may release a long
        # lease early. An unknown expiry, or a renewing holder left to the first, backs off.
        passed = holder is None or (entry.renewing and entry.behind > 0)
        until = None if passed or holder is None else until_ended(holder, now=wall, draw=rng())
        if until is not None:
            at_most = poll_delay(None, poll=policy.cap, now=wall, draw=rng())
            entry.next_look_at = now + max(FLOOR, min(until + entry.behind, at_most))
            return
        delay = policy.poll if entry.delay is None else entry.delay
        entry.next_look_at = now + poll_delay(None, poll=delay, now=wall, draw=rng())
        entry.delay = policy.grown(delay)

    if isinstance(outcome, LockLease):
        waiter.acquired()
        with entry.lock:
            entry.holder = LockState(True, outcome.expires_at, outcome.fencing_token)
            entry.renewing = False
            entry.free_seen = False
            entry.delay, entry.moved = None, True
            entry.changed_hands(now)  # our own waiter holds it now: the next in line times its tenure
            entry.looked_at = now
        entry.next_look_at = now + poll_delay(None, poll=policy.poll, now=wall, draw=rng())
        return outcome
    if isinstance(outcome, LockState):
        waiter.looked()
        entry.looked_at = now
        if outcome.held:
            entry.seen_held(outcome, now)
            look_later(outcome)
        else:
            entry.holder, entry.free_seen = outcome, True
        return None
    if isinstance(outcome, ConflictError):  # OwnershipLost too: our own lapsed lease, not yet free
        waiter.refused()
        state = outcome.holder or entry.holder or LockState(held=True)
        entry.seen_held(state, now)
        look_later(state)
        return None
    if isinstance(outcome, RateLimited):
        # Refused before it was served: after an uncertain acquisition the next try still acquires
        # with the same token and request id (to learn its outcome), else it looks first.
        waiter.rate_limited()
        pause = outcome.retry_after if outcome.retry_after is not None else policy.poll
        entry.next_look_at = max(entry.next_look_at, now + pause, governor.blocked_until)
        logger.info(
            "waiting for lock %r was rate limited; next look in %.1f s (request id %s)",
            waiter.key,
            entry.next_look_at - now,
            outcome.request_id,
        )
        return None
    if isinstance(outcome, TransportError | Unavailable | ServerError):
        # Uncertain (no answer, 503, another 5xx): a long wait rides it out. The next try goes straight
        # to acquire with the same token and request id, which recovers the lease if the server did
        # grant it.
        waiter.unanswered(op)
        logger.warning("waiting for lock %r: %s; trying again", waiter.key, outcome)
        look_later(entry.holder)
        return None
    if isinstance(outcome, BaseException):
        raise outcome
    raise TypeError(f"unexpected wait outcome {type(outcome).__name__}")  # pragma: no cover
