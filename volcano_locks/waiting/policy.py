"""How often a waiting key is looked at: the backoff's bounds, the jitter and the next look's delay.

See :mod:`volcano_locks.waiting` for the arithmetic of a line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from volcano_locks.errors import InvalidRequest
from volcano_locks.models import LockState

__all__ = [
    "FLOOR",
    "GRACE",
    "JITTER",
    "Contention",
    "OnWaiting",
    "WaitMode",
    "WaitPolicy",
    "poll_delay",
    "until_ended",
]

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

WaitMode = Literal["in_slot", "deferred", "event_woken"]
"""How a waiter waits, as the lock metrics tell waiters apart: holding its worker slot and polling
(``in_slot``), deferred to a poller that stands for many (``deferred``: the Airflow triggerer), or woken
by the orchestrator's release events with polling as the safety net (``event_woken``: Prefect)."""

Contention = Literal["wait", "raise"]
"""What a waiter does when the lock is held: wait it out, or raise the refusal (see :func:`wait_acquire`)."""


@dataclass(frozen=True)
class WaitPolicy:
    """How often a waiting key is looked at (see the package docstring for the arithmetic).

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
        mode: How the waiter waits (:data:`WaitMode`); only the lock metrics read it.
        at_expiry: Releases are announced to the waiter (it is woken, :func:`wake`, and told of new
            holders, :func:`inform`): looks are only the safety net for a holder that ends without a
            release (a crash). A holder whose expiry is known is looked at when it ends, at
            ``expires_at`` plus the grace, renewing or not, and not before (a line passing costs no
            looks), but no later than about ``cap`` from the last look (a holder whose release is
            announced nowhere, such as another client's, may release a long lease early); a waiter
            told it is not first in line (:func:`inform`) leaves a renewing holder's expiry to the
            first and backs off to ``cap``. The backoff is for an unknown expiry only.
    """

    poll: float = 1.0
    factor: float = 1.6
    cap: float = 20.0
    report_every: float = 60.0
    follow_turnover: bool = False
    mode: WaitMode = "in_slot"
    at_expiry: bool = False

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
    if holder is not None and not renewing:
        until_free = until_ended(holder, now=now, draw=draw)
        if until_free is not None:
            delay = min(delay, until_free)
    return max(floor, delay)


def until_ended(holder: LockState, *, now: datetime, draw: float) -> float | None:
    """Seconds from ``now`` until ``holder``'s lease can be taken over unrenewed (``None``: unknown).

    ``expires_at`` plus the server's :data:`GRACE`, plus a little spread (a fifth of a second times
    ``draw``) that keeps waiters in different processes from arriving together.
    """
    if holder.expires_at is None:
        return None
    return (holder.expires_at - now).total_seconds() + GRACE + 0.2 * draw


def _policy(poll: float, policy: WaitPolicy | None) -> WaitPolicy:
    """``policy`` (default: :class:`WaitPolicy`) with ``poll`` as its first interval."""
    base = policy or WaitPolicy()
    return dataclasses.replace(base, poll=float(poll), cap=max(base.cap, float(poll)))


def _raising(contention: str) -> bool:
    """Whether ``contention`` raises a refusal (``"raise"``) rather than waiting it out."""
    if contention not in ("wait", "raise"):
        raise InvalidRequest(f"invalid contention {contention!r}: expected 'wait' or 'raise'")
    return contention == "raise"
