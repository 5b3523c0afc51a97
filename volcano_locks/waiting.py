"""``wait_acquire``: wait out contention, spending the project's request budget deliberately.

Policy (:func:`poll_delay`): between attempts a waiter sleeps about ``poll`` seconds (±20 % jitter), no
longer than the holder's ``expires_at`` plus the server's 1 s takeover grace (from a ``get``, or from a
409 body when the server includes it), never less than a floor (0.25 s), and exactly ``Retry-After``
after a 429. The waiter keeps one ownership token for all its attempts, so an acquisition whose
outcome was uncertain (no response twice) is recovered by the next attempt with the same token.

Sharing: waiters on the same key in one process (sync) or one event loop (async) share one poll
(:class:`SharedPolls`): per interval one of them sends the ``get`` and all read its answer, and when the
lock is free only one waiter at a time tries to ``acquire``. N waiters therefore cost one request per
interval, not N; ``requests_sent`` on each client shows who paid.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import threading
import time
import uuid
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, ClassVar

from volcano_locks.errors import (
    InvalidRequest,
    LockContention,
    RateLimited,
    TransportError,
    Unavailable,
    VolcanoError,
    WaitTimeout,
)
from volcano_locks.models import LockLease, LockState
from volcano_locks.protocol import new_request_id, validate_key, validate_token, validate_ttl

if TYPE_CHECKING:
    from volcano_locks.client import AsyncVolcanoLocks, VolcanoLocks

__all__ = ["FLOOR", "GRACE", "SharedPolls", "async_wait_acquire", "poll_delay", "wait_acquire"]

logger = logging.getLogger("volcano_locks.waiting")

FLOOR = 0.25
"""The shortest sleep between two attempts, in seconds."""
GRACE = 1.0
"""The server's takeover grace after ``expires_at``, in seconds."""


def poll_delay(
    holder: LockState | None, *, poll: float, now: datetime, draw: float, floor: float = FLOOR
) -> float:
    """Seconds to sleep before the next look: jittered ``poll``, cut to the holder's expiry + grace.

    Args:
        holder: What is known of the current holder (``None``: nothing).
        poll: The nominal interval.
        now: The current wall-clock time (aware UTC), to compare with ``holder.expires_at``.
        draw: A uniform [0, 1) draw for jitter.
        floor: The lower bound.
    """
    delay = poll * (0.8 + 0.4 * draw)
    if holder is not None and holder.expires_at is not None:
        # A little spread past the grace keeps waiters in different processes from arriving together.
        until_free = (holder.expires_at - now).total_seconds() + GRACE + 0.2 * draw
        delay = min(delay, until_free)
    return max(floor, delay)


@dataclass
class _Shared:
    """One key's poll, shared by the waiters of a scope."""

    turn: object
    next_check_at: float = 0.0
    last_state: LockState | None = None
    users: int = 0


@dataclass
class _Waiter:
    key: str
    ttl: int
    token: str
    poll: float
    request_id: str | None
    direct: bool = True  # acquire without a get first: the first try, and after an uncertain acquisition
    holder: LockState | None = None
    rng: Callable[[], float] = field(default=random.random)


class SharedPolls:
    """Registry of shared per-key polls, scoped by ``(scope, API URL, SHA-256 of the service key, lock key)``.

    The scope is ``"thread"`` for sync waiters (one process) and the running event loop for async
    waiters. Keying by URL and credential fingerprint means two clients share a poll only when the server
    would see them as the same project asking about the same lock, which is exactly when sharing is
    safe; unrelated clients (another URL, another key) never share. Several clients built from one
    connection (e.g. many Airflow triggers in one triggerer, each with its own ``AsyncVolcanoLocks``)
    do share, which is the point. An entry lives only while waiters use it, and each round is sent with
    the client of the waiter that runs it, so no client is kept alive by the registry.
    """

    _guard: ClassVar[threading.Lock] = threading.Lock()
    _entries: ClassVar[dict[tuple[object, ...], _Shared]] = {}

    @classmethod
    @contextmanager
    def join(cls, scope: object, api_url: str, credential_id: str, key: str) -> Iterator[_Shared]:
        """Use the shared poll of this scope and key for the duration of the block."""
        ident = (scope, api_url, credential_id, key)
        with cls._guard:
            shared = cls._entries.get(ident)
            if shared is None:
                turn: object = threading.Lock() if scope == "thread" else asyncio.Lock()
                shared = cls._entries[ident] = _Shared(turn=turn)
            shared.users += 1
        try:
            yield shared
        finally:
            with cls._guard:
                shared.users -= 1
                if shared.users == 0:
                    cls._entries.pop(ident, None)

    @classmethod
    def active(cls) -> int:
        """How many keys currently have a shared poll (for tests and diagnostics)."""
        with cls._guard:
            return len(cls._entries)


def _check(key: str, ttl: int, timeout: float | None, token: str | None, poll: float) -> str:
    validate_key(key)
    validate_ttl(ttl)
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not (math.isfinite(timeout) and timeout >= 0)
    ):
        raise InvalidRequest(f"invalid timeout {timeout!r}: expected None or seconds >= 0")
    if isinstance(poll, bool) or not isinstance(poll, int | float) or not (math.isfinite(poll) and poll > 0):
        raise InvalidRequest(f"invalid poll {poll!r}: expected seconds > 0")
    return str(uuid.uuid4()) if token is None else validate_token(token)


def _defer(shared: _Shared, delay: float) -> None:
    shared.next_check_at = time.monotonic() + delay


def _round(shared: _Shared, waiter: _Waiter) -> Generator[str, object, LockLease | None]:
    """One look at the lock: yields ``"get"``/``"acquire"``, receives the result or the error raised."""
    now = datetime.now(UTC)
    if not waiter.direct:
        outcome = yield "get"
        if isinstance(outcome, LockState):
            shared.last_state = waiter.holder = outcome
            if outcome.held:
                _defer(shared, poll_delay(outcome, poll=waiter.poll, now=now, draw=waiter.rng()))
                return None
        else:
            _failed(shared, waiter, outcome, now)
            return None
    outcome = yield "acquire"
    if isinstance(outcome, LockLease):
        waiter.direct = False
        waiter.request_id = None
        _defer(shared, poll_delay(None, poll=waiter.poll, now=now, draw=waiter.rng()))
        return outcome
    # Uncertain (no answer twice, or 503s): the next try goes straight to acquire with the same token and
    # request id, which recovers the lease if the server did grant it. Anything else was a definite answer.
    waiter.direct = isinstance(outcome, TransportError | Unavailable)
    if not waiter.direct:
        waiter.request_id = None
    if isinstance(outcome, LockContention):
        shared.last_state = waiter.holder = outcome.holder or shared.last_state or LockState(held=True)
        _defer(shared, poll_delay(outcome.holder, poll=waiter.poll, now=now, draw=waiter.rng()))
        return None
    _failed(shared, waiter, outcome, now)
    return None


def _failed(shared: _Shared, waiter: _Waiter, outcome: object, now: datetime) -> None:
    if isinstance(outcome, RateLimited):
        delay = outcome.retry_after
        if delay is None:
            delay = poll_delay(None, poll=waiter.poll, now=now, draw=waiter.rng())
        logger.info(
            "wait_acquire rate limited; next look in %.2f s (request id %s)", delay, outcome.request_id
        )
        _defer(shared, delay)
        return
    if isinstance(outcome, TransportError | Unavailable):
        logger.warning("wait_acquire look failed (%s); trying again", outcome)
        _defer(shared, poll_delay(None, poll=waiter.poll, now=now, draw=waiter.rng()))
        return
    if isinstance(outcome, BaseException):
        raise outcome
    raise TypeError(f"unexpected round outcome {type(outcome).__name__}")  # pragma: no cover


def _timeout(waiter: _Waiter, shared: _Shared, timeout: float | None) -> WaitTimeout:
    return WaitTimeout(
        f"lock still held after waiting {timeout:g} s",
        code="wait_timeout",
        holder=shared.last_state or waiter.holder,
    )


def wait_acquire(
    client: VolcanoLocks,
    key: str,
    ttl: int,
    *,
    timeout: float | None = None,
    token: str | None = None,
    poll: float = 1.0,
    request_id: str | None = None,
) -> LockLease:
    """Acquire ``key`` with ``client``, waiting out contention up to ``timeout`` seconds (sync).

    Raises:
        WaitTimeout: Still held when the timeout ran out; ``holder`` is the last state seen.
    """
    waiter = _Waiter(key, ttl, _check(key, ttl, timeout, token, poll), float(poll), request_id)
    deadline = None if timeout is None else time.monotonic() + timeout
    with SharedPolls.join("thread", client.api_url, client.credential_id, key) as shared:
        turn = shared.turn
        assert isinstance(turn, type(threading.Lock()))
        lease = _drive_sync(client, _round(shared, waiter), waiter)  # the first try goes straight to acquire
        if lease is not None:
            return lease
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise _timeout(waiter, shared, timeout)
            if not turn.acquire(timeout=-1 if remaining is None else remaining):
                continue
            try:
                wait_for = shared.next_check_at - time.monotonic()
                if wait_for <= 0:
                    lease = _drive_sync(client, _round(shared, waiter), waiter)
                    if lease is not None:
                        return lease
                    continue
            finally:
                turn.release()
            time.sleep(wait_for if remaining is None else max(0.0, min(wait_for, remaining)))


def _drive_sync(
    client: VolcanoLocks, flow: Generator[str, object, LockLease | None], waiter: _Waiter
) -> LockLease | None:
    try:
        step = next(flow)
        while True:
            outcome: object
            try:
                if step == "get":
                    outcome = client.get(waiter.key)
                else:
                    waiter.request_id = waiter.request_id or new_request_id()
                    outcome = client.acquire(
                        waiter.key, waiter.ttl, token=waiter.token, request_id=waiter.request_id
                    )
            except VolcanoError as exc:
                outcome = exc
            step = flow.send(outcome)
    except StopIteration as stop:
        result: LockLease | None = stop.value
        return result


async def async_wait_acquire(
    client: AsyncVolcanoLocks,
    key: str,
    ttl: int,
    *,
    timeout: float | None = None,
    token: str | None = None,
    poll: float = 1.0,
    request_id: str | None = None,
) -> LockLease:
    """Acquire ``key`` with ``client``, waiting out contention up to ``timeout`` seconds (cancellable).

    A cancellation that lands while an acquisition is in flight lets that request finish in the
    background and releases the lease if it was granted (best effort: the client must stay open).

    Raises:
        WaitTimeout: Still held when the timeout ran out; ``holder`` is the last state seen.
    """
    waiter = _Waiter(key, ttl, _check(key, ttl, timeout, token, poll), float(poll), request_id)
    deadline = None if timeout is None else time.monotonic() + timeout
    loop = asyncio.get_running_loop()
    with SharedPolls.join(loop, client.api_url, client.credential_id, key) as shared:
        turn = shared.turn
        assert isinstance(turn, asyncio.Lock)
        lease = await _drive_async(
            client, _round(shared, waiter), waiter
        )  # the first try goes straight to acquire
        if lease is not None:
            return lease
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise _timeout(waiter, shared, timeout)
            try:
                async with asyncio.timeout(remaining):
                    await turn.acquire()
            except TimeoutError:
                continue
            try:
                wait_for = shared.next_check_at - time.monotonic()
                if wait_for <= 0:
                    lease = await _drive_async(client, _round(shared, waiter), waiter)
                    if lease is not None:
                        return lease
                    continue
            finally:
                turn.release()
            await asyncio.sleep(wait_for if remaining is None else max(0.0, min(wait_for, remaining)))


async def _drive_async(
    client: AsyncVolcanoLocks, flow: Generator[str, object, LockLease | None], waiter: _Waiter
) -> LockLease | None:
    try:
        step = next(flow)
        while True:
            outcome: object
            try:
                if step == "get":
                    outcome = await client.get(waiter.key)
                else:
                    waiter.request_id = waiter.request_id or new_request_id()
                    outcome = await _acquire_or_undo(client, waiter)
            except VolcanoError as exc:
                outcome = exc
            step = flow.send(outcome)
    except StopIteration as stop:
        result: LockLease | None = stop.value
        return result


_undoing: set[asyncio.Task[None]] = set()  # strong refs so pending clean-ups are not collected mid-flight


async def _acquire_or_undo(client: AsyncVolcanoLocks, waiter: _Waiter) -> LockLease:
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


def _release_won(client: AsyncVolcanoLocks, done: asyncio.Future[LockLease]) -> None:
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
