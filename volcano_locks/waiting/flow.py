"""The one wait engine: ``wait_acquire`` for the core clients, the Airflow trigger and Prefect alike.

A waiter wants a held lock. Every request it makes is paid from the project's 600 a minute, so the
engine spends deliberately:

* **One poll per key.** Waiters on the same key in one process (sync: every thread; async: one event
  loop) queue first come, first served behind one *head*. Only the head looks at the lock, and when
  it is free only the head acquires, with its own ownership token and TTL: one release wakes one
  waiter, not the herd. When the head leaves (acquired, timed out, cancelled), the next one takes over
  the key's knowledge (holder, backoff) and carries on.
* **Backoff that learns from what it sees.** The first attempt goes straight to ``acquire`` (an
  uncontended lock costs one request). While the lock stays held, the head looks (``get``) after
  ``poll`` seconds, then longer each time up to ``cap`` (jittered ±35 %, :data:`JITTER`). Each look tells it
  something: the **fencing token moved** since the last look (or the lock was seen free and then
  taken by someone else) means the lock is changing hands, a line of short jobs is passing, so the
  backoff resets to ``poll``, grows by ``factor`` only, and the next handoff is seen within about
  ``poll`` seconds; the **same holder seen again** (same token) means the holder is not passing the
  lock on soon, so the backoff grows twice as fast (``factor`` squared) and a long holder costs little.
  When the holder's ``expires_at`` comes sooner and it is
  *not* seen renewing, the look is moved to ``expires_at`` plus the server's one-second takeover
  grace: a crashed holder is taken over on time, a renewing one is not polled at its (ever-moving)
  expiry. See :func:`poll_delay`. Arithmetic of a line: ``n`` waiting processes, each holding for ``h``
  seconds in turn, pass in about ``n * (h + poll / 2)`` seconds once they have seen the token move
  (each backing off towards ``cap`` on its own would leave gaps that grow towards ``cap`` as the line
  thins), and while the line passes each waiter costs about ``60 / poll`` looks a minute.
* **Governed.** Every look and attempt draws from the process's waiting budget in
  :class:`volcano_locks.governor.Governor`, shared by every key and waiter of the credential and
  handed out in order, so a process waiting on 1,000 keys costs what one waiting on 10 does (its keys
  are simply looked at less often); the budget's rate adapts to the whole project's 429s (see the
  governor's docstring). After a 429 anywhere in the process, looks stop until ``Retry-After`` has
  passed: the flow checks the blackout again at send time, so a look booked before the 429 is not
  sent inside it. Only a waiter's very first attempt ignores a blackout: it is an acquisition like
  any direct call (an uncontended lock costs one request), not yet a waiting request.
* **Woken, not only polling.** :func:`wake` makes the heads waiting on a key try to acquire at once.
  The clients call it when they release a lock in this process; integrations call it when they are
  told of a release elsewhere (Prefect events). Polling stays as the safety net.

The engine's decisions are one sans-I/O generator (:func:`_wait_flow`) that yields "block until" and
"send" steps; :func:`wait_acquire` drives it with threads and :func:`async_wait_acquire` with asyncio.
The waiter keeps one ownership token for all its attempts, so an acquisition whose outcome was
uncertain (no answer twice, or 503s) is recovered by the next attempt with the same token and request id.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import random
import threading
import uuid
from collections import deque
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import ClassVar, Literal, Protocol

from volcano_locks.clock import lease_clock
from volcano_locks.errors import (
    ConflictError,
    ErrorCode,
    InvalidRequest,
    RateLimited,
    ServerError,
    TransportError,
    Unavailable,
    VolcanoError,
    WaitTimeout,
)
from volcano_locks.governor import Governor
from volcano_locks.models import LockLease, LockState
from volcano_locks.protocol import (
    new_request_id,
    validate_key,
    validate_poll,
    validate_token,
    validate_ttl,
    validate_wait_timeout,
)

__all__ = [
    "FLOOR",
    "GRACE",
    "JITTER",
    "AsyncWaitClient",
    "Contention",
    "OnWaiting",
    "SharedPolls",
    "SyncWaitClient",
    "WaitPolicy",
    "async_wait_acquire",
    "poll_delay",
    "wait_acquire",
    "wake",
]

logger = logging.getLogger("volcano_locks.waiting")

FLOOR = 0.25
"""The shortest sleep between two looks at one key, in seconds."""
GRACE = 1.0
"""The server's takeover grace after ``expires_at``, in seconds."""
JITTER = 0.35
"""Each sleep between looks is the interval times a uniform draw from ``1 ± JITTER``.

Wide enough that waiting processes started together are looking at unrelated moments after a few
looks: when a long hold ends, they then see it one by one (the first within about ``cap / n``
seconds of the release) instead of in clusters that leave the lock idle in between."""

OnWaiting = Callable[[LockState | None, float], object]
"""``on_waiting(holder, waited_seconds)``: called when a wait starts and about every minute after."""


@dataclass(frozen=True)
class WaitPolicy:
    """How often a waiting key is looked at (see the module docstring for the arithmetic).

    The engine learns within these bounds: a fencing token that moved between looks resets the
    interval to ``poll`` and grows it by ``factor``; the same holder seen again grows it by ``factor``
    squared.

    Attributes:
        poll: Seconds before the first look after a refused attempt, and after the lock changed hands.
        factor: A look that finds a new holder waits this many times longer (squared for the same
            holder seen again), ...
        cap: ... up to this many seconds (never below ``poll``).
        report_every: Seconds between ``on_waiting`` reports.
        follow_turnover: While the lock passes a line (its holder has held less than twice what its
            predecessor did, or less than that plus ``cap``), look every half ``poll`` instead of
            backing off: the next handoff is due, and each half second it is not seen leaves the
            lock idle. For a poller that stands for many waiters (the Airflow triggerer: one poll
            per key for all its triggers); separate waiting processes leave it off, since each of
            them would look that often.
    """

    poll: float = 1.0
    factor: float = 1.6
    cap: float = 20.0
    report_every: float = 60.0
    follow_turnover: bool = False

    def grown(self, delay: float, *, same_holder: bool = False) -> float:
        """The delay after ``delay``: times ``factor`` (squared for the same holder seen again), capped."""
        return min(max(self.cap, self.poll), delay * self.factor ** (2 if same_holder else 1))


def poll_delay(
    holder: LockState | None,
    *,
    poll: float,
    now: datetime,
    draw: float,
    floor: float = FLOOR,
    renewing: bool = False,
) -> float:
    """Seconds to sleep before the next look: jittered ``poll`` (:data:`JITTER`), cut to expiry + grace.

    Args:
        holder: What is known of the current holder (``None``: nothing).
        poll: The current interval (the backoff).
        now: The current wall-clock time (aware UTC), to compare with ``holder.expires_at``.
        draw: A uniform [0, 1) draw for jitter.
        floor: The lower bound.
        renewing: The holder was seen renewing (its expiry moved): its expiry says nothing about when
            the lock will be free, so the delay is not cut to it.
    """
    delay = poll * (1 - JITTER + 2 * JITTER * draw)
    if holder is not None and holder.expires_at is not None and not renewing:
        # A little spread past the grace keeps waiters in different processes from arriving together.
        until_free = (holder.expires_at - now).total_seconds() + GRACE + 0.2 * draw
        delay = min(delay, until_free)
    return max(floor, delay)


class SyncWaitClient(Protocol):
    """What the engine needs of a sync client (``VolcanoLocks``): its credential's identity and two calls."""

    @property
    def api_url(self) -> str: ...
    @property
    def credential_id(self) -> str: ...
    @property
    def governor(self) -> Governor: ...
    def get(self, key: str) -> LockState: ...
    def acquire(
        self, key: str, ttl: int, *, token: str | None = ..., request_id: str | None = ...
    ) -> LockLease: ...
    def abandon(self, key: str, token: str, request_id: str) -> None: ...


class AsyncWaitClient(Protocol):
    """What the engine needs of an async client (``AsyncVolcanoLocks``)."""

    @property
    def api_url(self) -> str: ...
    @property
    def credential_id(self) -> str: ...
    @property
    def governor(self) -> Governor: ...
    async def get(self, key: str) -> LockState: ...
    async def acquire(
        self, key: str, ttl: int, *, token: str | None = ..., request_id: str | None = ...
    ) -> LockLease: ...
    def abandon(self, key: str, token: str, request_id: str) -> None: ...
    async def release(self, key: str, lease: LockLease) -> None: ...


class _Signal(Protocol):
    def set(self) -> None: ...


class _ThreadSignal:
    def __init__(self) -> None:
        self.event = threading.Event()

    def set(self) -> None:
        self.event.set()


class _LoopSignal:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.event = asyncio.Event()

    def set(self) -> None:
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting any more
            self.loop.call_soon_threadsafe(self.event.set)


@dataclass(eq=False)
class _Waiter:
    key: str
    ttl: int
    token: str = field(repr=False)
    request_id: str | None
    signal: _Signal
    first: bool = True  # the very first attempt: straight to acquire, not held by a 429 blackout
    direct: bool = True  # acquire without a look first: the first try, and after an uncertain one
    uncertain: bool = False  # an acquisition got no definite answer: the server may hold a lease for it
    op: str | None = None  # the request the reservation below is for
    slot: float | None = None  # lease-clock time the reserved request may be sent
    priority: bool = False


@dataclass(eq=False)
class _KeyWait:
    """One key's queue of waiters and what they know about the lock (shared by its waiters)."""

    key: str
    lock: threading.Lock = field(default_factory=threading.Lock)
    waiters: deque[_Waiter] = field(default_factory=deque)
    holder: LockState | None = None
    renewing: bool = False
    moved: bool = False  # the last look found the lock changed hands since the one before
    delay: float | None = None
    next_look_at: float = -math.inf
    free_seen: bool = False
    woken: bool = False
    changed_at: float | None = None  # lease-clock time the current holder was first seen
    tenure: float | None = None  # how long the holder before it held, as seen from here

    def changed_hands(self, now: float) -> None:
        """The lock has a new holder since the last look: remember how long the previous one held."""
        if self.changed_at is not None:
            self.tenure = now - self.changed_at
        self.changed_at = now

    def in_turnover(self, now: float, slack: float) -> bool:
        """The lock is passing a line: its holder has held under twice (or ``slack`` s over) the last tenure.

        The slack covers a holder that is slow to start its work (an Airflow task resuming from
        its trigger can take twenty seconds of scheduling before it holds for its few seconds).
        """
        if self.tenure is None or self.changed_at is None:
            return False
        return now - self.changed_at < max(2 * self.tenure, self.tenure + slack)

    def head(self) -> _Waiter | None:
        with self.lock:
            return self.waiters[0] if self.waiters else None

    def wake_head(self) -> bool:
        with self.lock:
            self.woken = True
            head = self.waiters[0] if self.waiters else None
        if head is not None:
            head.signal.set()
        return head is not None

    def leave(self, waiter: _Waiter) -> None:
        with self.lock:
            was_head = bool(self.waiters) and self.waiters[0] is waiter
            if waiter in self.waiters:
                self.waiters.remove(waiter)
            head = self.waiters[0] if self.waiters else None
        if was_head and head is not None:
            head.signal.set()

    def seen_held(self, state: LockState, now: float) -> None:
        """Fold in a look (or a refusal) that found the lock held: renewing? changed hands?"""
        old = self.holder
        self.moved = old is not None and (
            not old.held
            or (
                old.fencing_token is not None
                and state.fencing_token is not None
                and state.fencing_token != old.fencing_token
            )
        )
        if self.moved:
            self.delay = None  # the lock changed hands since the last look: a line is passing
            self.changed_hands(now)
        self.renewing = (
            old is not None
            and old.fencing_token is not None
            and old.fencing_token == state.fencing_token
            and old.expires_at is not None
            and state.expires_at is not None
            and state.expires_at > old.expires_at
        )
        self.holder = state
        self.free_seen = False


class SharedPolls:
    """Registry of the per-key queues, scoped by ``(scope, API URL, credential fingerprint, key)``.

    The scope is ``"thread"`` for sync waiters (one process) and the running event loop for async
    waiters. Keying by URL and credential fingerprint means waiters share a poll only when the server
    would see them as the same project asking about the same lock, which is exactly when sharing is
    safe. Several clients built from one connection (many Airflow triggers in one triggerer, each with
    its own client) do share, which is the point. An entry lives only while waiters use it.
    """

    _guard: ClassVar[threading.Lock] = threading.Lock()
    _entries: ClassVar[dict[tuple[object, str, str, str], _KeyWait]] = {}
    _users: ClassVar[dict[tuple[object, str, str, str], int]] = {}

    @classmethod
    @contextmanager
    def join(cls, scope: object, api_url: str, credential_id: str, waiter: _Waiter) -> Iterator[_KeyWait]:
        """Queue ``waiter`` on its key's shared poll for the duration of the block."""
        ident = (scope, api_url, credential_id, waiter.key)
        with cls._guard:
            entry = cls._entries.get(ident)
            if entry is None:
                entry = cls._entries[ident] = _KeyWait(waiter.key)
            cls._users[ident] = cls._users.get(ident, 0) + 1
        with entry.lock:
            entry.waiters.append(waiter)
        try:
            yield entry
        finally:
            entry.leave(waiter)
            with cls._guard:
                cls._users[ident] -= 1
                if cls._users[ident] == 0:
                    del cls._users[ident]
                    cls._entries.pop(ident, None)

    @classmethod
    def active(cls) -> int:
        """How many keys currently have a shared poll (for tests and diagnostics)."""
        with cls._guard:
            return len(cls._entries)

    @classmethod
    def matching(cls, key: str, api_url: str | None, credential_id: str | None) -> list[_KeyWait]:
        """The queues waiting on ``key`` (of that API URL and credential, where given)."""
        with cls._guard:
            return [
                entry
                for (_, url, cred, k), entry in cls._entries.items()
                if k == key
                and (api_url is None or url == api_url)
                and (credential_id is None or cred == credential_id)
            ]


def wake(key: str, *, api_url: str | None = None, credential_id: str | None = None) -> int:
    """Make every queue in this process waiting on ``key`` try to acquire it at once.

    Callable from any thread. The woken head still spends its request from the waiting budget (ahead
    of reads) and still honours a 429's ``Retry-After``.

    Args:
        key: The lock key that was released.
        api_url: Only waiters of this API URL (``None``: any).
        credential_id: Only waiters of this credential fingerprint (``None``: any).

    Returns:
        How many key queues had a waiter to wake.
    """
    woken = sum(1 for entry in SharedPolls.matching(key, api_url, credential_id) if entry.wake_head())
    if woken:
        logger.debug("woke %d waiting queue(s) for lock %r", woken, key)
    return woken


@dataclass(frozen=True)
class _Block:
    """Wait until the lease-clock time ``until``, or until the waiter's signal is set."""

    until: float


@dataclass(frozen=True)
class _Send:
    """Send ``op`` (``"get"`` or ``"acquire"``); the outcome (result or ``VolcanoError``) comes back."""

    op: str


_Step = _Block | _Send


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _check(key: str, ttl: int, timeout: float | None, token: str | None, poll: float) -> str:
    validate_key(key)
    validate_ttl(ttl)
    validate_wait_timeout(timeout, name="timeout")
    validate_poll(poll)
    return str(uuid.uuid4()) if token is None else validate_token(token)


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
) -> Generator[_Step, object, LockLease]:
    """The engine's decisions for one waiter: yields steps, receives outcomes, returns the lease.

    ``clock`` is the lease clock (when to send), ``wall`` the aware UTC time that holders' expiries
    are compared with; both are injectable so a fleet of waiters can be simulated.
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
                    on_waiting(entry.holder, now - started)
            horizon = min((t for t in (deadline, next_report) if t is not None), default=math.inf)
            is_head = entry.head() is waiter
            if not is_head and not waiter.first:  # a newcomer's first attempt does not queue
                yield _Block(horizon)
                continue
            with entry.lock:
                informed = is_head and (entry.woken or entry.free_seen)
            if waiter.slot is not None and informed and waiter.op == "get":
                governor.refund()  # told the lock is free: acquire ahead of the read that was booked
                waiter.slot = None
            if waiter.slot is None:
                if not (waiter.first or informed) and now < entry.next_look_at:
                    yield _Block(min(entry.next_look_at, horizon))
                    continue
                waiter.op = "acquire" if waiter.direct or informed else "get"
                waiter.priority = informed
                # A first attempt is billed like any waiting request (500 triggers restarting at once
                # must not spend the project's minute), but a 429's blackout does not hold it.
                waiter.slot = governor.reserve(priority=informed, honour_blackout=not waiter.first)
            # At send time, not only at booking: a 429 that arrived since holds this request too.
            send_at = waiter.slot if waiter.first else max(waiter.slot, governor.blocked_until)
            if now < send_at:
                yield _Block(min(send_at, horizon))
                continue
            op, waiter.slot = waiter.op, None
            if is_head:
                with entry.lock:
                    entry.woken = False
            if op == "acquire" and waiter.request_id is None:
                waiter.request_id = new_request_id()
            outcome = yield _Send(op or "get")
            first, waiter.first = waiter.first, False
            lease = _settle(
                entry, waiter, op or "get", outcome, governor, policy, clock(), rng, is_head, wall()
            )
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
                    on_waiting(entry.holder, clock() - started)
    finally:
        if waiter.slot is not None:
            governor.refund()
            waiter.slot = None


def _settle(
    entry: _KeyWait,
    waiter: _Waiter,
    op: str,
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
        # A poller for many waiters looks every half poll while a line passes (the next handoff is
        # due); past twice the last tenure (and its slack) it is a long holder: back off, cost little.
        turnover = policy.follow_turnover and entry.in_turnover(now, policy.cap)
        delay = policy.poll if entry.delay is None else entry.delay
        entry.next_look_at = now + poll_delay(
            holder, poll=policy.poll / 2 if turnover else delay, now=wall, draw=rng(), renewing=entry.renewing
        )
        if not turnover:
            entry.delay = policy.grown(delay, same_holder=not entry.moved)

    if isinstance(outcome, LockLease):
        waiter.direct = waiter.uncertain = False
        waiter.request_id = None
        with entry.lock:
            entry.holder = LockState(True, outcome.expires_at, outcome.fencing_token)
            entry.renewing = False
            entry.free_seen = False
            entry.delay, entry.moved = None, True
            entry.changed_hands(now)  # our own waiter holds it now: the next in line times its tenure
        entry.next_look_at = now + poll_delay(None, poll=policy.poll, now=wall, draw=rng())
        return outcome
    if isinstance(outcome, LockState):
        if outcome.held:
            entry.seen_held(outcome, now)
            look_later(outcome)
        else:
            entry.holder, entry.free_seen = outcome, True
        return None
    if isinstance(outcome, ConflictError):  # OwnershipLost too: our own lapsed lease, not yet free
        waiter.direct = waiter.uncertain = False
        waiter.request_id = None
        state = outcome.holder or entry.holder or LockState(held=True)
        entry.seen_held(state, now)
        look_later(state)
        return None
    if isinstance(outcome, RateLimited):
        # Refused before it was served: after an uncertain acquisition the next try still acquires
        # with the same token and request id (to learn its outcome), else it looks first.
        waiter.direct = waiter.uncertain
        if not waiter.uncertain:
            waiter.request_id = None
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
        waiter.direct = op == "acquire" or waiter.direct
        waiter.uncertain = op == "acquire" or waiter.uncertain
        logger.warning("waiting for lock %r: %s; trying again", waiter.key, outcome)
        look_later(entry.holder)
        return None
    if isinstance(outcome, BaseException):
        raise outcome
    raise TypeError(f"unexpected wait outcome {type(outcome).__name__}")  # pragma: no cover


def _new_waiter(
    key: str,
    ttl: int,
    timeout: float | None,
    token: str | None,
    poll: float,
    request_id: str | None,
    signal: _Signal,
) -> _Waiter:
    return _Waiter(key, ttl, _check(key, ttl, timeout, token, poll), request_id, signal)


def _policy(poll: float, policy: WaitPolicy | None) -> WaitPolicy:
    base = policy or WaitPolicy()
    return dataclasses.replace(base, poll=float(poll), cap=max(base.cap, float(poll)))


def wait_acquire(
    client: SyncWaitClient,
    key: str,
    ttl: int,
    *,
    timeout: float | None = None,
    token: str | None = None,
    poll: float = 1.0,
    request_id: str | None = None,
    on_waiting: OnWaiting | None = None,
    policy: WaitPolicy | None = None,
    contention: Contention = "wait",
) -> LockLease:
    """Acquire ``key`` with ``client``, waiting out contention up to ``timeout`` seconds (sync).

    Args:
        client: The client whose credential and connection pool the waiter uses.
        key: The lock key.
        ttl: The lease TTL in seconds.
        timeout: Give up after this many seconds (``None``: no bound; ``0``: one attempt).
        token: The ownership token for every attempt (generated when ``None``).
        poll: Seconds before the first look; later looks back off (see :class:`WaitPolicy`).
        request_id: Request id for the first acquisition.
        on_waiting: Called with the last holder seen and the seconds waited, when the wait starts
            and every ``policy.report_every`` seconds after.
        policy: The backoff (``poll`` overrides its first interval).
        contention: ``"wait"`` waits out a held lock; ``"raise"`` waits only for an answer: every
            attempt is an acquisition, a refusal (``ConflictError``) is raised at once, and what is
            not an answer (no response, 503, 429) is tried again as in a wait (same token, and the
            same request id after an uncertain attempt) until ``timeout``. Such a waiter does not
            queue behind the key's other waiters, and ``on_waiting(None, waited)`` is called after
            each attempt that got no answer.

    Raises:
        WaitTimeout: Still held (``contention="raise"``: still unanswered) when the timeout ran out;
            ``holder`` is the last state seen.
        ConflictError: Held by another owner (``contention="raise"`` only).
    """
    signal = _ThreadSignal()
    waiter = _new_waiter(key, ttl, timeout, token, poll, request_id, signal)
    raising = _raising(contention)
    scope, started = object() if raising else "thread", lease_clock()
    with _flow_for(client, scope, waiter, poll, policy, timeout, None if raising else on_waiting) as flow:
        step, lease = _advance(flow, None)
        while step is not None:
            if isinstance(step, _Block):
                remaining = step.until - lease_clock()
                if remaining > 0:
                    signal.event.wait(remaining if math.isfinite(remaining) else None)
                signal.event.clear()
                step, lease = _advance(flow, None)
                continue
            client.governor.note_waiting()
            op = "acquire" if raising else step.op
            outcome = _outcome(partial(_send_sync, client, waiter, op))
            if raising:
                _answered_or_raise(outcome, waiter, on_waiting, lease_clock() - started)
            step, lease = _advance(flow, outcome)
        assert lease is not None
        return lease


Contention = Literal["wait", "raise"]
"""What a waiter does when the lock is held: wait it out, or raise the refusal (see :func:`wait_acquire`)."""


def _raising(contention: str) -> bool:
    if contention not in ("wait", "raise"):
        raise InvalidRequest(f"invalid contention {contention!r}: expected 'wait' or 'raise'")
    return contention == "raise"


def _answered_or_raise(outcome: object, waiter: _Waiter, on_waiting: OnWaiting | None, waited: float) -> None:
    """For ``contention="raise"``: raise a refusal; report an attempt that got no answer."""
    if isinstance(outcome, ConflictError):
        waiter.uncertain = False  # a definite answer: no lease of this attempt to abandon
        raise outcome
    if isinstance(outcome, VolcanoError) and on_waiting is not None:
        on_waiting(None, waited)


def _send_sync(client: SyncWaitClient, waiter: _Waiter, op: str) -> object:
    if op == "get":
        return client.get(waiter.key)
    return client.acquire(waiter.key, waiter.ttl, token=waiter.token, request_id=waiter.request_id)


async def async_wait_acquire(
    client: AsyncWaitClient,
    key: str,
    ttl: int,
    *,
    timeout: float | None = None,
    token: str | None = None,
    poll: float = 1.0,
    request_id: str | None = None,
    on_waiting: OnWaiting | None = None,
    policy: WaitPolicy | None = None,
    contention: Contention = "wait",
) -> LockLease:
    """Acquire ``key`` with ``client``, waiting out contention up to ``timeout`` seconds (cancellable).

    Same arguments as :func:`wait_acquire`. A cancellation that lands while an acquisition is in
    flight lets that request finish in the background and releases the lease if it was granted (best
    effort: the client must stay open).

    Raises:
        WaitTimeout: Still held when the timeout ran out; ``holder`` is the last state seen.
    """
    signal = _LoopSignal(asyncio.get_running_loop())
    waiter = _new_waiter(key, ttl, timeout, token, poll, request_id, signal)
    raising = _raising(contention)
    scope, started = object() if raising else asyncio.get_running_loop(), lease_clock()
    with _flow_for(client, scope, waiter, poll, policy, timeout, None if raising else on_waiting) as flow:
        step, lease = _advance(flow, None)
        while step is not None:
            if isinstance(step, _Block):
                remaining = step.until - lease_clock()
                if remaining > 0:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(remaining if math.isfinite(remaining) else None):
                            await signal.event.wait()
                signal.event.clear()
                step, lease = _advance(flow, None)
                continue
            client.governor.note_waiting()
            call = client.get(key) if step.op == "get" and not raising else _acquire_or_undo(client, waiter)
            try:
                outcome: object = await call
            except VolcanoError as exc:
                outcome = exc
            if raising:
                _answered_or_raise(outcome, waiter, on_waiting, lease_clock() - started)
            step, lease = _advance(flow, outcome)
        assert lease is not None
        return lease


_Flow = Generator[_Step, object, LockLease]


@contextmanager
def _flow_for(
    client: SyncWaitClient | AsyncWaitClient,
    scope: object,
    waiter: _Waiter,
    poll: float,
    policy: WaitPolicy | None,
    timeout: float | None,
    on_waiting: OnWaiting | None,
) -> Iterator[_Flow]:
    """Queue ``waiter`` on its key's shared poll and give the engine's flow for it; close it after."""
    with SharedPolls.join(scope, client.api_url, client.credential_id, waiter) as entry:
        flow = _wait_flow(
            entry,
            waiter,
            client.governor,
            _policy(poll, policy),
            timeout,
            on_waiting,
            lease_clock,
            random.random,
        )
        try:
            yield flow
        finally:
            flow.close()
            if waiter.uncertain and waiter.request_id is not None:
                # The wait ends (timed out, cancelled, failed) right after an attempt whose outcome is
                # unknown: the server may hold a lease for this token that nobody will use.
                client.abandon(waiter.key, waiter.token, waiter.request_id)


def _advance(flow: _Flow, outcome: object) -> tuple[_Step | None, LockLease | None]:
    """Send ``outcome`` into the flow: its next step, or ``None`` and the lease it returned."""
    try:
        return flow.send(outcome), None
    except StopIteration as stop:
        return None, stop.value


def _outcome(call: Callable[[], object]) -> object:
    try:
        return call()
    except VolcanoError as exc:
        return exc


_undoing: set[asyncio.Task[None]] = set()  # strong refs so pending clean-ups are not collected mid-flight


async def _acquire_or_undo(client: AsyncWaitClient, waiter: _Waiter) -> LockLease:
    """Acquire; if the waiter is cancelled meanwhile, let the request finish and release what it won.

    Without this, a cancelled wait whose acquisition the server granted would hold the lock, unseen,
    until its TTL ran out.
    """
    attempt = asyncio.ensure_future(
        client.acquire(waiter.key, waiter.ttl, token=waiter.token, request_id=waiter.request_id)
    )
    try:
        return await asyncio.shield(attempt)
    except asyncio.CancelledError:
        attempt.add_done_callback(lambda done: _release_won(client, done))
        raise


def _release_won(client: AsyncWaitClient, done: asyncio.Future[LockLease]) -> None:
    if done.cancelled() or done.exception() is not None:
        return
    lease = done.result()

    async def release() -> None:
        try:
            await client.release(lease.key, lease)
            logger.info(
                "released a lease won by a cancelled wait_acquire (fencing token %d)", lease.fencing_token
            )
        except Exception as exc:
            logger.warning("could not release a lease won by a cancelled wait_acquire: %s", exc)

    task = asyncio.get_running_loop().create_task(release(), name="volcano-lock-undo-acquire")
    _undoing.add(task)
    task.add_done_callback(_undoing.discard)
