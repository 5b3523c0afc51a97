"""VolcanoLockTrigger: waits in the triggerer for a Volcano lock and acquires it for its task."""

from __future__ import annotations

import asyncio
import collections
import hashlib
import logging
import random
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_volcano._tokens import TaskIdentity, derive_token

if TYPE_CHECKING:
    from airflow_provider_volcano.hooks.volcano import VolcanoConnectionConfig
    from volcano_locks import AsyncVolcanoLocks, LockLease, LockState

__all__ = ["VolcanoLockTrigger"]

log = logging.getLogger(__name__)

STATUS_ACQUIRED = "acquired"
STATUS_TIMEOUT = "timeout"
STATUS_ERROR = "error"

_MIN_SLEEP = 0.2  # never hammer the API, even when the holder's lease is about to end
_MAX_BACKOFF = 30.0
_TAKEOVER_GRACE = 1.0  # the contract's one extra second after expires_at before takeover


def next_poll_delay(
    poll: float,
    holder_expires_at: datetime | None,
    now: float,
    earliest_deadline: float | None,
    rand: Callable[[float, float], float] = random.uniform,
) -> float:
    """Return how long a poller sleeps before its next look at a held lock.

    The regular interval (with ±10 % jitter), cut short when the holder's lease ends sooner
    (its ``expires_at`` plus the takeover grace second) or a waiter's deadline comes first;
    never below a small floor.

    :param poll: the poll interval in seconds.
    :param holder_expires_at: the holder's expiry as last read, if known.
    :param now: the current wall-clock time (epoch seconds).
    :param earliest_deadline: the earliest waiter deadline (epoch seconds), if any.
    :param rand: the jitter source.
    """
    delay = poll * rand(0.9, 1.1)
    if holder_expires_at is not None:
        delay = min(delay, holder_expires_at.timestamp() + _TAKEOVER_GRACE - now)
    if earliest_deadline is not None:
        delay = min(delay, earliest_deadline - now)
    return max(delay, _MIN_SLEEP)


@dataclass(frozen=True)
class WaitOutcome:
    """How one waiter's wait ended.

    :param status: ``acquired``, ``timeout`` or ``error``.
    :param lease: the lease acquired for the waiter (``acquired`` only).
    :param holder: the last holder seen (``timeout``).
    :param message: what happened, naming the lock (never a key or token).
    """

    status: str
    lease: LockLease | None = None
    holder: LockState | None = None
    message: str = ""


@dataclass(eq=False)
class _Waiter:
    token: str = field(repr=False)
    ttl: int
    deadline: float | None
    poll: float
    future: asyncio.Future[WaitOutcome]
    attempted: bool = False


class SharedKeyPoller:
    """One poller per lock key and event loop, serving every trigger waiting on that key.

    Waiters are served first come, first served: while the lock is held the poller reads it once
    per interval for all of them; when it is free it acquires for the first waiter only, with
    that waiter's own ownership token, so one release wakes one task, not the whole herd.

    :param client: the async core client (owned: closed when the poller ends).
    :param key: the lock key.
    :param clock: wall-clock time source (epoch seconds), injectable for tests.
    :param sleep: the sleeper, injectable for tests.
    :param on_done: called when the last waiter has left.
    """

    def __init__(
        self,
        client: AsyncVolcanoLocks,
        key: str,
        *,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        on_done: Callable[[], None] | None = None,
    ) -> None:
        self.client = client
        self.key = key
        self._clock = clock
        self._sleep = sleep
        self._on_done = on_done
        self._waiters: collections.deque[_Waiter] = collections.deque()
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self.holder: LockState | None = None

    @property
    def waiting(self) -> int:
        """How many waiters are still waiting."""
        return sum(1 for w in self._waiters if not w.future.done())

    async def wait(self, token: str, ttl: int, deadline: float | None, poll: float) -> WaitOutcome:
        """Wait until the lock is acquired with ``token``, ``deadline`` passes or an error ends it."""
        loop = asyncio.get_running_loop()
        waiter = _Waiter(token, ttl, deadline, poll, loop.create_future())
        self._waiters.append(waiter)
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run(), name=f"volcano-lock-poller:{self.key}")
        self._wake.set()
        try:
            return await asyncio.shield(waiter.future)
        finally:
            if not waiter.future.done():
                waiter.future.cancel()  # the trigger was cancelled: leave the queue

    def _prune(self) -> None:
        now = self._clock()
        for w in list(self._waiters):
            if w.future.done():
                self._waiters.remove(w)
            elif w.deadline is not None and now >= w.deadline:
                self._waiters.remove(w)
                fencing = self.holder.fencing_token if self.holder else None
                w.future.set_result(
                    WaitOutcome(
                        STATUS_TIMEOUT,
                        holder=self.holder,
                        message=f"timed out waiting for lock {self.key!r} "
                        f"(held with fencing token {fencing})",
                    )
                )

    def _fail_all(self, message: str) -> None:
        while self._waiters:
            w = self._waiters.popleft()
            if not w.future.done():
                w.future.set_result(WaitOutcome(STATUS_ERROR, message=message))

    async def _pause(self, delay: float) -> None:
        self._wake.clear()
        sleeper = asyncio.ensure_future(self._sleep(delay))
        waker = asyncio.ensure_future(self._wake.wait())
        try:
            # A new waiter wakes the poller only so its deadline and first attempt are considered.
            await asyncio.wait({sleeper, waker}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            waker.cancel()

    async def _run(self) -> None:
        from volcano_locks import (
            AuthError,
            InvalidRequest,
            LockContention,
            RateLimited,
            VolcanoError,
        )

        backoff = 0.0
        try:
            while True:
                self._prune()
                if not self._waiters:
                    return
                head = self._waiters[0]
                poll = min(w.poll for w in self._waiters)
                deadlines = [w.deadline for w in self._waiters if w.deadline is not None]
                try:
                    if head.attempted:
                        self.holder = await self.client.get(self.key)
                        free = not self.holder.held
                    else:
                        free = True  # a new head tries at once: its own lease may be live already
                    if free:
                        head.attempted = True
                        lease = await self.client.acquire(self.key, head.ttl, token=head.token)
                        self._waiters.popleft()
                        if not head.future.done():
                            head.future.set_result(WaitOutcome(STATUS_ACQUIRED, lease=lease))
                        backoff = 0.0
                        continue
                    backoff = 0.0
                    delay = next_poll_delay(
                        poll,
                        self.holder.expires_at if self.holder else None,
                        self._clock(),
                        min(deadlines) if deadlines else None,
                    )
                except LockContention:
                    # Lost the race for a free lock (or the grace second): look again after a beat.
                    delay = max(_MIN_SLEEP, poll * random.uniform(0.1, 0.3))
                except RateLimited as exc:
                    delay = exc.retry_after if exc.retry_after is not None else poll
                    log.info("Volcano rate limit while waiting for a lock; retrying in %.1f s", delay)
                except (AuthError, InvalidRequest) as exc:
                    self._fail_all(f"cannot wait for lock {self.key!r}: {exc}")
                    return
                except VolcanoError as exc:
                    backoff = min(_MAX_BACKOFF, max(poll, backoff * 2 or poll))
                    delay = backoff
                    log.warning(
                        "Volcano lock API unavailable while waiting for a lock (%s); retrying in %.1f s",
                        type(exc).__name__,
                        delay,
                    )
                if deadlines:
                    delay = max(0.0, min(delay, min(deadlines) - self._clock()))
                await self._pause(delay)
        except asyncio.CancelledError:
            self._fail_all(f"stopped waiting for lock {self.key!r}")
            raise
        except Exception as exc:  # a poller that dies silently would strand every waiter
            log.exception("Volcano lock poller failed")
            self._fail_all(f"waiting for lock {self.key!r} failed: {type(exc).__name__}: {exc}")
        finally:
            if self._on_done is not None:
                self._on_done()
            await self.client.aclose()


# Pollers are scoped to the event loop that runs them (the triggerer runs one loop for all its
# triggers); a WeakKeyDictionary forgets a loop's pollers when the loop is gone.
_POLLERS: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, dict[tuple[str, str, str], SharedKeyPoller]
] = weakref.WeakKeyDictionary()


def shared_poller(config: VolcanoConnectionConfig, key: str) -> SharedKeyPoller:
    """Return this event loop's poller for ``key`` on the API and project the config names."""
    from volcano_locks import AsyncVolcanoLocks

    loop = asyncio.get_running_loop()
    pollers = _POLLERS.setdefault(loop, {})
    # Locks are scoped to the key's project, so the key (hashed, never kept in clear) is part of it.
    fingerprint = hashlib.sha256(config.service_key.encode()).hexdigest()[:16]
    ident = (config.api_url, fingerprint, key)
    poller = pollers.get(ident)
    if poller is None or (poller._task is not None and poller._task.done()):
        client = AsyncVolcanoLocks(
            config.api_url, config.anon_key, config.service_key, timeout=config.timeout
        )
        poller = SharedKeyPoller(client, key, on_done=lambda: _forget(loop, ident))
        pollers[ident] = poller
    return poller


def _forget(loop: asyncio.AbstractEventLoop, ident: tuple[str, str, str]) -> None:
    pollers = _POLLERS.get(loop)
    if pollers is not None:
        pollers.pop(ident, None)


class VolcanoLockTrigger(BaseTrigger):
    """Waits without a worker slot until a Volcano lock is free, then acquires it for its task.

    It acquires with the ownership token derived from the service key and the task try's identity
    and random nonce, so nothing secret is stored in the trigger row and the resumed task
    re-acquires that same lease (same fencing token). It acquires for the *handoff*: with
    ``handoff_ttl`` (at least ``ttl``), so the lease outlives a resume that takes longer than the
    task's TTL (executor queueing, pod start, a busy pool); the resumed task's idempotent
    re-acquire then sets the lease to its own ``ttl`` from that moment. Fires one event whose
    ``status`` is ``acquired``, ``timeout`` or ``error``; the payload holds the lock key, the
    fencing token, ``expires_at``, ``acquired_at`` (when the trigger's acquisition was sent), the
    handoff allowance and a message, never a key or an ownership token.

    :param volcano_conn_id: the Volcano connection id.
    :param lock_key: the lock to wait for.
    :param ttl: the task's lease TTL in seconds.
    :param identity: the task instance try with its nonce (``TaskIdentity.as_dict()``).
    :param deadline: give up at this wall-clock time (epoch seconds); ``None`` waits without bound.
    :param poll: seconds between reads of a held lock.
    :param handoff_ttl: the TTL the trigger acquires with, the time its task has to resume (``None``
        or less than ``ttl``: ``ttl``).
    """

    def __init__(
        self,
        *,
        volcano_conn_id: str,
        lock_key: str,
        ttl: int,
        identity: dict[str, Any],
        deadline: float | None = None,
        poll: float = 2.0,
        handoff_ttl: int | None = None,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.volcano_conn_id = volcano_conn_id
        self.lock_key = lock_key
        self.ttl = int(ttl)
        self.identity = TaskIdentity.from_dict(identity).as_dict()
        self.deadline = None if deadline is None else float(deadline)
        self.poll = float(poll)
        self.handoff_ttl = max(self.ttl, int(handoff_ttl or 0))

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """Return the classpath and JSON-primitive kwargs (no key, no token)."""
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "volcano_conn_id": self.volcano_conn_id,
                "lock_key": self.lock_key,
                "ttl": self.ttl,
                "identity": dict(self.identity),
                "deadline": self.deadline,
                "poll": self.poll,
                # Only when it differs: trigger rows written before the handoff allowance existed
                # (no such kwarg) keep deserialising to the same trigger.
                **({"handoff_ttl": self.handoff_ttl} if self.handoff_ttl != self.ttl else {}),
            },
        )

    def _event(self, status: str, message: str, state: Any = None) -> TriggerEvent:
        expires_at = getattr(state, "expires_at", None)
        acquired_at = getattr(state, "acquired_at", None)
        return TriggerEvent(  # type: ignore[no-untyped-call]
            {
                "status": status,
                "lock_key": self.lock_key,
                "fencing_token": getattr(state, "fencing_token", None),
                "expires_at": expires_at.isoformat() if expires_at is not None else None,
                # When the trigger's acquisition was sent: the resumed task measures its resume delay.
                "acquired_at": acquired_at.isoformat() if acquired_at is not None else None,
                "handoff_ttl": self.handoff_ttl,
                "message": message,
                # Echoed so a resumed task can defer again within the same bound, even where the
                # deferral's method kwargs are not carried over (dag.test()).
                "deadline": self.deadline,
                "nonce": self.identity["nonce"],
            }
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Wait for the lock in the shared poller and yield one event."""
        from airflow_provider_volcano.hooks.volcano import VolcanoConnectionError, VolcanoHook

        try:
            config = await VolcanoHook(self.volcano_conn_id).aget_config()
        except VolcanoConnectionError as exc:
            yield self._event(STATUS_ERROR, str(exc))
            return
        token = derive_token(config.service_key, TaskIdentity.from_dict(self.identity), self.lock_key)
        # The handoff allowance, not the task's TTL: the lease must outlive the task's resume.
        outcome = await shared_poller(config, self.lock_key).wait(
            token, self.handoff_ttl, self.deadline, self.poll
        )
        if outcome.status == STATUS_ACQUIRED and outcome.lease is not None:
            self.log.info(
                "Acquired lock %r for the task (fencing token %s); it holds for the handoff "
                "(%s s) until the task resumes and renews it at its own ttl (%s s)",
                self.lock_key,
                outcome.lease.fencing_token,
                self.handoff_ttl,
                self.ttl,
            )
            yield self._event(STATUS_ACQUIRED, f"acquired lock {self.lock_key!r}", outcome.lease)
        else:
            yield self._event(outcome.status, outcome.message, outcome.holder)
