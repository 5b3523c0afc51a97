"""Releasing a finished hold: a refused or unanswered release never fails the work that was done.

When a locked body has finished, its release is bookkeeping: the work is done, and a lease that is
not released lapses on its own at its expiry. So a release the server refuses for now (429, 503, any
other 5xx) or never answers is retried, on the keeping lane, while the lease still lives (after exactly
``Retry-After`` for a 429, after a jittered backoff otherwise), and when no attempt can start before
the lease's local deadline it is left to lapse, with one warning that says so. What the caller reports
is the body's outcome.

Two answers are not a refusal for now:

* ``OwnershipLost`` (409): the lease was no longer this holder's when the release arrived (it was
  force-released, or lapsed and was taken). The body may have run without the lock for a while, so
  this is raised: safety over liveness, as with a loss the keeper reports.
* an error no retry can mend (401/403, 400, a reply that breaks the contract): not retried; the
  lease is left to lapse with the warning.

:func:`release_flow` decides (sans-I/O, on :mod:`volcano_locks._steps`); :func:`release_or_lapse` and
:func:`async_release_or_lapse` drive it. Every integration calls one of them: ``with_lock`` on exit,
Prefect's hold, the Airflow operator's hold.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Generic, Literal, Protocol, TypeVar

from volcano_locks._steps import Send, Wait, advance, async_outcome, outcome
from volcano_locks.clock import lease_clock
from volcano_locks.errors import (
    OwnershipLost,
    RateLimited,
    ServerError,
    TransportError,
    Unavailable,
    VolcanoError,
)
from volcano_locks.models import LeaseRef, LockLease
from volcano_locks.renewal import KeeperTiming, backoff_delay
from volcano_locks.telemetry import record

__all__ = ["ReleaseOutcome", "async_release_or_lapse", "release_flow", "release_or_lapse"]

logger = logging.getLogger("volcano_locks.releasing")

Log = logging.Logger | logging.LoggerAdapter[Any]

_TRANSIENT = (RateLimited, Unavailable, ServerError, TransportError)
_BACKOFF = KeeperTiming(request_timeout=0.0, backoff_initial=0.5, backoff_max=5.0)
MIN_ATTEMPT = 0.2
"""The shortest request timeout worth a release attempt; with less of the lease left, it lapses."""


L = TypeVar("L", LockLease, LeaseRef)


class _SyncReleaseClient(Protocol):
    @property
    def timeout(self) -> float: ...
    def release_within(self, lease: LockLease | LeaseRef, timeout: float) -> None: ...


class _AsyncReleaseClient(Protocol):
    @property
    def timeout(self) -> float: ...
    async def release_within(self, lease: LockLease | LeaseRef, timeout: float) -> None: ...


@dataclass(frozen=True)
class ReleaseOutcome(Generic[L]):
    """How a release ended: released (at once or on a retry), or left to lapse at the lease's expiry.

    ``lease`` is what was released: the :class:`LockLease` or the :class:`LeaseRef` given.
    """

    lease: L
    released: bool
    attempts: int
    error: VolcanoError | None = field(default=None)
    """The last refusal or failure seen (``None`` when the first attempt released)."""

    @property
    def lapses(self) -> bool:
        """Whether the lease was left to lapse on its own at its expiry."""
        return not self.released

    def describe(self) -> str:
        """One line for the log: what happened to the release and why (no secret: errors carry none)."""
        lease = self.lease
        fencing = f" (fencing token {lease.fencing_token})" if lease.fencing_token is not None else ""
        what = f"release of lock {lease.key!r}{fencing}"
        if self.released:
            if self.error is None:
                return f"{what} succeeded"
            return f"{what} was refused at first ({self.error}); released on attempt {self.attempts}"
        tries = "1 attempt" if self.attempts == 1 else f"{self.attempts} attempts"
        why = f" ({self.error})" if self.error is not None else ""
        expiry = f", {lease.expires_at.isoformat()}" if isinstance(lease, LockLease) else ""
        return (
            f"{what} did not go through after {tries}{why}; the lease is left to lapse at its expiry"
            f"{expiry} (the work already done stands)"
        )


def release_flow(
    lease: L,
    client_timeout: float,
    *,
    clock: Callable[[], float] = lease_clock,
    rng: Callable[[], float] = random.random,
) -> Generator[Send | Wait, object, ReleaseOutcome[L]]:
    """Decide a release, without I/O: send it, retry what may go through later, or leave it to lapse.

    Yields ``Send("release", lease, timeout=...)`` (its outcome is ``None`` or the ``VolcanoError``)
    and ``Wait(until)`` (lease-clock times); returns the :class:`ReleaseOutcome`. A lease is retried
    until its local deadline, a :class:`LeaseRef` until its ``until``; one without gets one attempt.

    Raises:
        OwnershipLost: The server says the lease was no longer this holder's.
    """
    attempts = 0
    error: VolcanoError | None = None
    ref = lease.ref() if isinstance(lease, LockLease) else lease
    deadline = ref.until if ref.until is not None else clock() + client_timeout
    while True:
        if ref.until is None and attempts:
            return ReleaseOutcome(lease, released=False, attempts=attempts, error=error)
        left = deadline - clock()
        timeout = min(client_timeout, left)
        if timeout < MIN_ATTEMPT:
            return ReleaseOutcome(lease, released=False, attempts=attempts, error=error)
        attempts += 1
        answer = yield Send("release", lease, timeout=timeout)
        if not isinstance(answer, VolcanoError):
            return ReleaseOutcome(lease, released=True, attempts=attempts, error=error)
        if isinstance(answer, OwnershipLost):
            _ended(lease, "lost", reason=str(answer.code or "unknown"))
            raise answer
        error = answer
        if not isinstance(answer, _TRANSIENT):
            return ReleaseOutcome(lease, released=False, attempts=attempts, error=error)
        if isinstance(answer, RateLimited) and answer.retry_after is not None:
            pause = float(answer.retry_after)
        else:
            pause = backoff_delay(attempts, _BACKOFF, rng())
        at = clock() + pause
        if ref.until is None or at + MIN_ATTEMPT > deadline:
            return ReleaseOutcome(lease, released=False, attempts=attempts, error=error)
        yield Wait(at)


def _ended(lease: LockLease | LeaseRef, ending: Literal["lapsed", "lost"], reason: str | None = None) -> None:
    if isinstance(lease, LockLease):  # a reference names no tenure this process counted
        record.ended(lease, ending, reason=reason)


def _told(result: ReleaseOutcome[L], log: Log | None) -> ReleaseOutcome[L]:
    if result.lapses:
        _ended(result.lease, "lapsed")
    if result.error is not None:
        (log or logger).warning("%s", result.describe())
    return result


def release_or_lapse(
    client: _SyncReleaseClient,
    lease: L,
    *,
    log: Log | None = None,
    clock: Callable[[], float] = lease_clock,
    sleeper: Callable[[float], object] = time.sleep,
) -> ReleaseOutcome[L]:
    """Release ``lease``, retrying a refusal while the lease lives; else leave it to lapse, with a warning.

    Args:
        client: The sync client (``VolcanoLocks``).
        lease: The lease to release (the latest one, after the keeper stopped), or a
            :class:`~volcano_locks.models.LeaseRef` to it.
        log: Where the one warning goes (default: the ``volcano_locks.releasing`` logger).
        clock: The lease clock (injectable for tests).
        sleeper: Sleeps between attempts.

    Raises:
        OwnershipLost: The lease was no longer this holder's when the release arrived.
    """
    flow = release_flow(lease, client.timeout, clock=clock)
    step, result = advance(flow, None)
    while step is not None:
        if isinstance(step, Wait):
            sleeper(max(0.0, step.until - clock()))
            step, result = advance(flow, None)
        else:
            call = partial(client.release_within, lease, step.timeout or client.timeout)
            step, result = advance(flow, outcome(call))
    assert result is not None
    return _told(result, log)


async def async_release_or_lapse(
    client: _AsyncReleaseClient,
    lease: L,
    *,
    log: Log | None = None,
    clock: Callable[[], float] = lease_clock,
    sleeper: Callable[[float], Awaitable[object]] = asyncio.sleep,
) -> ReleaseOutcome[L]:
    """Release ``lease`` as :func:`release_or_lapse` does, for the async client."""
    flow = release_flow(lease, client.timeout, clock=clock)
    step, result = advance(flow, None)
    while step is not None:
        if isinstance(step, Wait):
            await sleeper(max(0.0, step.until - clock()))
            step, result = advance(flow, None)
        else:
            timeout = step.timeout or client.timeout
            step, result = advance(flow, await async_outcome(client.release_within(lease, timeout)))
    assert result is not None
    return _told(result, log)
