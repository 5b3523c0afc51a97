"""The lease keeper: when to renew, the local deadline, and what counts as loss.

The decisions live in :class:`RenewalSchedule`, a sans-I/O state machine fed with the time
(``now``, a monotonic reading) and with the outcome of each renewal attempt. Two small drivers run
it: :class:`LeaseKeeper` on a named daemon thread and :class:`AsyncLeaseKeeper` as a named task.
Both take their clock and their waits as arguments, so timing tests run in microseconds.

Timing, for a lease whose successful request was sent at ``s`` with TTL ``t``:

* ``local_deadline = min(s + t, s + (expires_at - wall clock at s), absolute_deadline)`` on the lease
  clock (:mod:`volcano_locks.clock`, which keeps counting while the machine sleeps): after it the holder
  must assume the lease is gone. The server's ``expires_at`` wins when it is the earlier one.
* the *safe window* ends at ``local_deadline - margin (1 s) - request_timeout``: the last moment a renewal
  can start and still reach the server, even after a full request timeout, a second before expiry
  (the contract's "renew must arrive 1 s early").
* a renewal is due at ``s + min(t/3, 60 s) * (1 ± 10 %)``, never after the safe window ends.
* the renewal request timeout is ``min(client timeout, t/3)`` so that short TTLs keep a safe window.
* transient failures (no response, 503, 429 with ``Retry-After``) are retried with jittered exponential
  backoff (or exactly ``Retry-After``) while an attempt can still finish before ``local_deadline - margin``.
* loss, final and reported once with its first reason: ``OwnershipLost`` from the server, any other
  failed renewal, the window running out, a renewal still pending at the local deadline, the 90-day
  absolute deadline, or the keeper itself failing unexpectedly.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from volcano_locks._steps import Lose, Send, Wait
from volcano_locks.clock import lease_clock
from volcano_locks.errors import (
    ErrorCode,
    OwnershipLost,
    RateLimited,
    TransportError,
    Unavailable,
    VolcanoError,
)
from volcano_locks.models import LockLease
from volcano_locks.telemetry import record

__all__ = [
    "STOP_JITTER",
    "STOP_REACH",
    "AsyncLeaseKeeper",
    "KeeperTiming",
    "LeaseKeeper",
    "Lose",
    "RenewalSchedule",
    "Send",
    "Wait",
    "backoff_delay",
    "renewal_due",
    "renewal_interval",
    "renewal_timeout",
    "safe_window_end",
]

logger = logging.getLogger("volcano_locks.renewal")

MAX_RENEWAL_INTERVAL = 60.0
"""Renew at least this often (seconds), whatever the TTL."""

STOP_REACH = 0.88
"""``KeeperTiming.reach`` of a hold that stops its body on loss; with :data:`STOP_JITTER`, renewals at
84-92 % of a third of the TTL (about an eighth more renewals), leaving at least 7.6 % of that third for
the round trip and the interrupt."""
STOP_JITTER = 0.05
"""``KeeperTiming.jitter`` of a hold that stops its body on loss."""

LOSS_LOCAL_DEADLINE = ErrorCode.LOCAL_DEADLINE_PASSED
LOSS_RENEWAL_STALLED = ErrorCode.RENEWAL_STALLED
LOSS_WINDOW_EXHAUSTED = ErrorCode.RENEWAL_WINDOW_EXHAUSTED
LOSS_ABSOLUTE_DEADLINE = ErrorCode.ABSOLUTE_DEADLINE_REACHED
LOSS_RENEWAL_FAILED = ErrorCode.RENEWAL_FAILED
LOSS_KEEPER_FAILED = ErrorCode.KEEPER_FAILED


@dataclass(frozen=True)
class KeeperTiming:
    """Tunables of the keeper, in seconds (``jitter``: a fraction)."""

    request_timeout: float
    """The renewal request's timeout (:func:`renewal_timeout`)."""
    margin: float = 1.0
    """How early a renewal must reach the server before the local deadline (the contract's 1 s)."""
    jitter: float = 0.1
    """The spread of the renewal time around a third of the TTL (10 %: either side)."""
    reach: float = 1.0
    """The renewal interval as a fraction of a third of the TTL. A hold that stops its body on loss
    uses :data:`STOP_REACH` (and :data:`STOP_JITTER`) so that its jittered interval, the renewal's round
    trip and the interrupt fit inside a third of the TTL: a loss stops the body within a third of the TTL
    of the loss."""
    backoff_initial: float = 0.25
    """The delay before the first retry of a transient failure; it doubles with each."""
    backoff_max: float = 4.0
    """The longest delay between retries."""
    min_attempt: float = 0.2
    """The shortest request timeout worth an attempt; with less of the window left, the lease is lost."""

    def interval(self, ttl: int) -> float:
        """Seconds between this keeper's renewals of a ``ttl`` lease, before jitter: ``reach`` times
        :func:`renewal_interval`."""
        return renewal_interval(ttl) * self.reach


def renewal_timeout(client_timeout: float, ttl: int) -> float:
    """Timeout for renewal requests: the client's, capped at a third of the TTL."""
    return min(client_timeout, ttl / 3)


def safe_window_end(lease: LockLease, timing: KeeperTiming) -> float:
    """The last monotonic time a renewal with the full request timeout can start safely."""
    return lease.local_deadline - timing.margin - timing.request_timeout


def renewal_interval(ttl: int) -> float:
    """Seconds between renewals: a third of the TTL, but at least once a minute.

    A long-TTL lease that was lost (force released, taken over after a stall) is noticed within about
    a minute, as Volcano's own Python SDK does; it costs a long-TTL holder one request a minute.
    """
    return min(ttl / 3, MAX_RENEWAL_INTERVAL)


def renewal_due(lease: LockLease, timing: KeeperTiming, draw: float) -> float:
    """When to renew ``lease``: a third of its TTL after it was sent, jittered by ``draw`` in [0, 1).

    ``draw`` 0 gives -jitter, 0.5 the nominal third, values near 1 +jitter. Never after the safe window,
    which is what clamps a lease whose TTL was cut short by the 90-day absolute deadline.
    """
    sent = lease.local_deadline - lease.ttl
    nominal = sent + timing.interval(lease.ttl) * (1 + timing.jitter * (2 * draw - 1))
    return min(nominal, safe_window_end(lease, timing))


def backoff_delay(failures: int, timing: KeeperTiming, draw: float) -> float:
    """Delay before retry number ``failures`` (1-based): exponential, capped, jittered to 75-125 %."""
    base = min(timing.backoff_max, timing.backoff_initial * 2.0 ** max(0, failures - 1))
    return float(base * (0.75 + 0.5 * draw))


def _can_extend(lease: LockLease) -> bool:
    return lease.local_deadline < lease.absolute_deadline


def _local_loss(message: str, code: str, cause: BaseException | None = None) -> OwnershipLost:
    loss = OwnershipLost(message, code=code, request_id=getattr(cause, "request_id", None))
    loss.__cause__ = cause
    return loss


class RenewalSchedule:
    """The keeper's decisions, without I/O: feed it the time and each attempt's outcome."""

    def __init__(
        self, lease: LockLease, timing: KeeperTiming, rng: Callable[[], float] = random.random
    ) -> None:
        self._timing = timing
        self._rng = rng
        self._lease = lease
        self._due = renewal_due(lease, timing, rng())
        self._retry_at: float | None = None
        self._failures = 0
        self._last_error: BaseException | None = None
        self._loss: OwnershipLost | None = None

    @property
    def lease(self) -> LockLease:
        """The latest lease."""
        return self._lease

    @property
    def loss(self) -> OwnershipLost | None:
        """The first reason ownership was lost, or ``None``."""
        return self._loss

    @property
    def failures(self) -> int:
        """Consecutive failed renewal attempts of the current lease."""
        return self._failures

    def lose(self, loss: OwnershipLost) -> OwnershipLost:
        """Record a loss (the first one wins) and return the loss in force."""
        if self._loss is None:
            self._loss = loss
        return self._loss

    def next_action(self, now: float) -> Wait | Send | Lose:
        """What to do at ``now``: wait, send a renewal (``Send("renew", ...)``), or give up."""
        if self._loss is not None:
            return Lose(self._loss)
        lease, timing = self._lease, self._timing
        if now >= lease.local_deadline:
            if not _can_extend(lease):
                return Lose(
                    self.lose(
                        _local_loss("lease reached its 90-day absolute deadline", LOSS_ABSOLUTE_DEADLINE)
                    )
                )
            return Lose(
                self.lose(
                    _local_loss("local deadline passed before a renewal succeeded", LOSS_LOCAL_DEADLINE)
                )
            )
        if not _can_extend(lease) and lease.local_deadline - now <= MAX_RENEWAL_INTERVAL:
            # The 90-day cap is within the minute: a renewal can neither extend the lease nor tell
            # of a loss sooner than the deadline itself will.
            return Wait(lease.local_deadline)
        due = self._due if self._retry_at is None else self._retry_at
        if now < due:
            return Wait(min(due, lease.local_deadline))
        timeout = min(timing.request_timeout, lease.local_deadline - timing.margin - now)
        if timeout < timing.min_attempt:
            return Lose(self.lose(self._window_exhausted()))
        return Send("renew", lease, timeout=timeout, deadline=lease.local_deadline)

    def _window_exhausted(self) -> OwnershipLost:
        err = self._last_error
        last = err.message if isinstance(err, VolcanoError) else type(err).__name__
        detail = f" after {self._failures} failed renewal(s); last: {last}" if err is not None else ""
        return _local_loss(f"safe renewal window ran out{detail}", LOSS_WINDOW_EXHAUSTED, err)

    def succeeded(self, lease: LockLease, now: float) -> None:
        """A renewal returned ``lease`` at ``now``."""
        if now >= self._lease.local_deadline:
            self.stalled(now)
            return
        record.renewed(self._lease, lease, now)
        self._lease = lease
        self._failures = 0
        self._retry_at = None
        self._last_error = None
        self._due = renewal_due(lease, self._timing, self._rng())
        if not _can_extend(lease):
            # Capped at the 90-day deadline, the lease's TTL no longer tells when it was renewed:
            # keep checking about once a minute from now (a force release is noticed), no faster.
            interval = self._timing.interval(lease.ttl) * (1 - self._timing.jitter)
            self._due = max(self._due, min(now + interval, safe_window_end(lease, self._timing)))
        logger.debug(
            "lease renewed, fencing token %d; next renewal in %.2f s", lease.fencing_token, self._due - now
        )

    def stalled(self, now: float) -> None:
        """The renewal in flight had no outcome by the local deadline."""
        del now
        self.lose(
            _local_loss(
                "renewal did not complete before the local deadline", LOSS_RENEWAL_STALLED, self._last_error
            )
        )

    def failed(self, exc: BaseException, now: float) -> None:
        """A renewal attempt raised ``exc`` at ``now``: retry within the window, or lose."""
        if now >= self._lease.local_deadline:
            self.stalled(now)
            return
        self._last_error = exc
        if isinstance(exc, OwnershipLost):
            self.lose(exc)
            return
        if not isinstance(exc, TransportError | Unavailable | RateLimited):
            text = str(exc) if isinstance(exc, VolcanoError) else type(exc).__name__
            self.lose(_local_loss(f"renewal failed: {text}", LOSS_RENEWAL_FAILED, exc))
            return
        self._failures += 1
        timing = self._timing
        latest = self._lease.local_deadline - timing.margin - timing.min_attempt
        if isinstance(exc, RateLimited) and exc.retry_after is not None:
            retry_at = now + exc.retry_after
            if retry_at > latest:
                self.lose(self._window_exhausted())
                return
        else:
            retry_at = min(now + backoff_delay(self._failures, timing, self._rng()), latest)
        self._retry_at = retry_at
        logger.warning(
            "lease renewal failed (%s); retry %d in %.2f s, %.2f s before the local deadline",
            exc,
            self._failures,
            max(0.0, retry_at - now),
            self._lease.local_deadline - now,
        )

    def crashed(self, exc: BaseException) -> OwnershipLost:
        """The keeper itself failed: that is loss too (a keeper never dies silently)."""
        return self.lose(
            _local_loss(f"lease keeper failed unexpectedly: {type(exc).__name__}", LOSS_KEEPER_FAILED, exc)
        )


def _renewal(step: Send) -> tuple[LockLease, float]:
    """The lease a renewal step renews and its request timeout (the schedule's renewals carry both)."""
    assert isinstance(step.lease, LockLease) and step.timeout is not None
    return step.lease, step.timeout


def _event_wait(event: threading.Event, timeout: float) -> bool:
    return event.wait(timeout)


def _thread_spawn(target: Callable[[], None], name: str) -> None:
    threading.Thread(target=target, name=name, daemon=True).start()


class _KeeperBase:
    def __init__(
        self,
        lease: LockLease,
        timing: KeeperTiming,
        on_loss: Callable[[OwnershipLost], object] | None,
        clock: Callable[[], float],
        rng: Callable[[], float],
    ) -> None:
        self._schedule = RenewalSchedule(lease, timing, rng)
        self._on_loss = on_loss
        self._clock = clock
        self._loss_lock = threading.Lock()
        self._reported: OwnershipLost | None = None
        self._lost_event = threading.Event()
        self._stopping = False
        self.name = f"volcano-lock-keeper:{lease.key}"

    @property
    def lease(self) -> LockLease:
        """The latest lease."""
        return self._schedule.lease

    @property
    def loss(self) -> OwnershipLost | None:
        """The first reason ownership was lost, or ``None``."""
        return self._reported

    @property
    def lost(self) -> bool:
        """Whether ownership was lost."""
        return self._reported is not None

    def _next_step(self) -> Wait | Send | None:
        """The schedule's next step, or ``None`` once stopping or lost (the loss is reported)."""
        if self._stopping:
            return None
        step = self._schedule.next_action(self._clock())
        if isinstance(step, Lose):
            self._report(step.loss)
            return None
        return step

    def _settle(self, outcome: LockLease | BaseException | Literal["stalled"]) -> None:
        """Tell the schedule how a renewal ended: a new lease, an error, or no outcome by the deadline."""
        now = self._clock()
        if outcome == "stalled":
            self._schedule.stalled(now)
        elif isinstance(outcome, LockLease):
            self._schedule.succeeded(outcome, now)
        else:
            self._schedule.failed(outcome, now)

    def _report(self, loss: OwnershipLost) -> None:
        with self._loss_lock:
            if self._reported is not None:
                return
            self._reported = loss
        self._lost_event.set()
        record.ended(self._schedule.lease, "lost", reason=str(loss.code or "unknown"))
        logger.error("lock ownership lost: %s", loss)
        if self._on_loss is not None:
            try:
                self._on_loss(loss)
            except Exception:
                logger.exception("on_loss callback failed")


class LeaseKeeper(_KeeperBase):
    """Renews a lease on a named daemon thread (``volcano-lock-keeper:<key>``) until stopped or lost.

    The thread never blocks on I/O: each renewal runs on its own short-lived thread while the keeper
    waits for its outcome no longer than the local deadline, so a stalled request is loss on time.

    Args:
        lease: The lease to keep.
        renew: ``renew(lease, timeout) -> new lease``; must use a fresh request id.
        timing: See :class:`KeeperTiming`.
        on_loss: Called once, from the keeper thread, with the first reason.
        clock: Monotonic clock.
        wait: ``wait(event, timeout) -> bool``, an interruptible wait (``Event.wait``).
        spawn: ``spawn(fn, name)`` runs one renewal attempt (a daemon thread by default).
        rng: Uniform [0, 1) draws for jitter.
    """

    def __init__(
        self,
        lease: LockLease,
        renew: Callable[[LockLease, float], LockLease],
        *,
        timing: KeeperTiming,
        on_loss: Callable[[OwnershipLost], object] | None = None,
        clock: Callable[[], float] = lease_clock,
        wait: Callable[[threading.Event, float], bool] = _event_wait,
        spawn: Callable[[Callable[[], None], str], None] = _thread_spawn,
        rng: Callable[[], float] = random.random,
    ) -> None:
        super().__init__(lease, timing, on_loss, clock, rng)
        self._renew = renew
        self._wait = wait
        self._spawn = spawn
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def wait_lost(self, timeout: float | None = None) -> bool:
        """Block up to ``timeout`` seconds for loss; return whether ownership is lost."""
        return self._lost_event.wait(timeout)

    def start(self) -> None:
        """Start the keeper thread."""
        self._thread = threading.Thread(target=self.run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop renewing and join the keeper thread (it only ever waits on an event)."""
        self._stopping = True
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def run(self) -> None:
        """The keeper loop (what the thread runs); returns when stopped or lost."""
        try:
            self._loop()
        except BaseException as exc:
            self._report(self._schedule.crashed(exc))

    def _loop(self) -> None:
        while (step := self._next_step()) is not None:
            if isinstance(step, Wait):
                self._wake.clear()
                delay = step.until - self._clock()
                if delay > 0 and not self._stopping:
                    self._wait(self._wake, delay)
                continue
            outcome = self._attempt(step)
            if outcome is None:
                return
            self._settle(outcome)

    def _attempt(self, step: Send) -> LockLease | BaseException | Literal["stalled"] | None:
        """Renew on a thread of its own; the outcome, ``"stalled"`` at the deadline, ``None`` if stopped."""
        box: list[LockLease | BaseException] = []
        lease, timeout = _renewal(step)

        def work() -> None:
            try:
                box.append(self._renew(lease, timeout))
            except BaseException as exc:
                box.append(exc)
            finally:
                self._wake.set()

        self._wake.clear()
        self._spawn(work, f"volcano-lock-renew:{lease.key}")
        while True:
            self._wake.clear()
            if box:
                return box[0]
            if self._stopping:
                return None
            remaining = step.deadline - self._clock()
            if remaining <= 0:
                return "stalled"
            self._wait(self._wake, remaining)


class AsyncLeaseKeeper(_KeeperBase):
    """Renews a lease in a named task (``volcano-lock-keeper:<key>``) until stopped or lost.

    Args:
        lease: The lease to keep.
        renew: ``await renew(lease, timeout) -> new lease``; must use a fresh request id.
        timing: See :class:`KeeperTiming`.
        on_loss: Called once, from the keeper task, with the first reason.
        clock: Monotonic clock.
        sleep: ``await sleep(seconds)``; the keeper is stopped by cancelling its task.
        rng: Uniform [0, 1) draws for jitter.
    """

    def __init__(
        self,
        lease: LockLease,
        renew: Callable[[LockLease, float], Awaitable[LockLease]],
        *,
        timing: KeeperTiming,
        on_loss: Callable[[OwnershipLost], object] | None = None,
        clock: Callable[[], float] = lease_clock,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: Callable[[], float] = random.random,
    ) -> None:
        super().__init__(lease, timing, on_loss, clock, rng)
        self._renew = renew
        self._sleep = sleep
        self._task: asyncio.Task[None] | None = None
        self._lost_async: asyncio.Event | None = None

    def start(self) -> None:
        """Start the keeper task on the running loop."""
        self._lost_async = asyncio.Event()
        if self._reported is not None:
            self._lost_async.set()
        self._task = asyncio.get_running_loop().create_task(self.run(), name=self.name)

    async def wait_lost(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds for loss; return whether ownership is lost."""
        if self._reported is not None or self._lost_async is None:
            return self._reported is not None
        try:
            async with asyncio.timeout(timeout):
                await self._lost_async.wait()
        except TimeoutError:
            pass
        return self._reported is not None

    async def stop(self) -> None:
        """Stop renewing: cancel the task and wait for it to end."""
        self._stopping = True
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task])

    def _report(self, loss: OwnershipLost) -> None:
        if self._lost_async is not None:
            self._lost_async.set()
        super()._report(loss)

    async def run(self) -> None:
        """The keeper loop (what the task runs); returns when stopped or lost."""
        try:
            await self._loop()
        except asyncio.CancelledError:
            if not self._stopping:
                self._report(self._schedule.crashed(asyncio.CancelledError("keeper task cancelled")))
            raise
        except BaseException as exc:
            self._report(self._schedule.crashed(exc))

    async def _loop(self) -> None:
        while (step := self._next_step()) is not None:
            if isinstance(step, Wait):
                delay = step.until - self._clock()
                if delay > 0:
                    await self._sleep(delay)
                continue
            self._settle(await self._attempt(step))

    async def _attempt(self, step: Send) -> LockLease | BaseException | Literal["stalled"]:
        """Renew within the step's deadline; the outcome, or ``"stalled"`` when the deadline came first."""
        lease, timeout = _renewal(step)
        try:
            async with asyncio.timeout(max(0.0, step.deadline - self._clock())):
                return await self._renew(lease, timeout)
        except TimeoutError:
            return "stalled"
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return exc
