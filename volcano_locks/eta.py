"""When is it my turn? A waiter's expected start, from the lock's observed tenures and its holder's time.

The wait engine sees the lock change hands (its fencing token moves between looks) and keeps how long
each of the last holders held it, as seen from this process (:attr:`TENURES_KEPT` of them): that span
runs from one observed change to the next, so it includes the handoff and the look's own latency,
which is what a waiter's start cadence is made of. From those and how long the current holder has held
so far, :func:`estimate` gives the waiter at ``position`` in this process's line:

* the holder's *remaining* time: the tenures seen that outlast its time so far, less that time (the
  median, and their 10th and 90th percentiles for the interval); a holder that already outlasted
  every tenure seen has no such data (the interval runs to the median tenure, and confidence is low);
* plus one typical tenure (median; 10th and 90th percentile for the interval) per waiter ahead.

Confidence is ``high`` with 8 or more tenures whose 10-90 % spread is within half their median,
``medium`` with 3 or more within one and a half medians, ``low`` otherwise. What it cannot know:
waiters in other processes (they may be ahead), holders that were never seen changing hands, a lock
whose jobs change character. ``bench/bench_eta.py`` measures its error on a line of holds.

:func:`reported` gives the ETA of the engine's report being made, to the ``on_waiting`` callback, and
:func:`reported_holder_age` how old the engine's read of the holder it passes is.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "NO_ESTIMATE",
    "TENURES_KEPT",
    "Confidence",
    "Eta",
    "duration",
    "estimate",
    "expected_start",
    "reported",
    "reported_holder_age",
]

TENURES_KEPT = 20
"""How many of the lock's latest tenures the estimate rests on."""

Confidence = Literal["low", "medium", "high"]
"""How sure the estimate is (see the module docstring)."""

_REPORTED: ContextVar[Eta | None] = ContextVar("volcano_locks_eta", default=None)
_HOLDER_AGE: ContextVar[float | None] = ContextVar("volcano_locks_holder_age", default=None)


@dataclass(frozen=True)
class Eta:
    """A waiter's expected start, in seconds from when it was estimated.

    Attributes:
        expected: The expected wait until this waiter starts.
        earliest: The low end of the interval (about the 10th percentile).
        latest: The high end of the interval (about the 90th percentile).
        confidence: How sure it is.
        position: The waiter's place in this process's line (1: next).
        tenures: How many observed tenures it rests on.
    """

    expected: float
    earliest: float
    latest: float
    confidence: Confidence
    position: int
    tenures: int

    def describe(self) -> str:
        """One phrase for a log line or a view: ``expected to start in about 40 s (25-70 s, medium ...)``."""
        return (
            f"expected to start in about {duration(self.expected)} ({duration(self.earliest)}-"
            f"{duration(self.latest)}, {self.confidence} confidence, {self.position} in line here, "
            f"from {self.tenures} tenure{'s' if self.tenures != 1 else ''} seen)"
        )

    def as_dict(self) -> dict[str, str | int | float]:
        """The estimate as JSON primitives (seconds rounded to tenths)."""
        return {
            "expected_s": round(self.expected, 1),
            "earliest_s": round(self.earliest, 1),
            "latest_s": round(self.latest, 1),
            "confidence": self.confidence,
            "position": self.position,
            "tenures": self.tenures,
        }


def duration(seconds: float) -> str:
    """Seconds as a waiting line says them: ``40 s``, ``12 min``, ``1.5 h``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _quantile(ordered: Sequence[float], q: float) -> float:
    """The ``q`` quantile of sorted values, linearly interpolated."""
    at = q * (len(ordered) - 1)
    low = math.floor(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def estimate(tenures: Sequence[float], holder_elapsed: float | None, position: int = 1) -> Eta | None:
    """The expected start of the waiter at ``position`` (1: next), or ``None`` with no tenure seen yet.

    Args:
        tenures: The lock's observed tenures in seconds, oldest first.
        holder_elapsed: How long the current holder has held the lock so far (``None``: unknown, taken
            as just started).
        position: The waiter's place in line (1: next after the holder).

    Raises:
        ValueError: ``position`` is not a positive integer, or a tenure is negative or not finite.
    """
    if isinstance(position, bool) or not isinstance(position, int) or position < 1:
        raise ValueError(f"position must be a positive integer, got {position!r}")
    if any(not math.isfinite(t) or t < 0 for t in tenures):
        raise ValueError(f"tenures must be finite and non-negative seconds, got {list(tenures)!r}")
    if not tenures:
        return None
    seen = sorted(tenures[-TENURES_KEPT:])
    elapsed = max(0.0, holder_elapsed or 0.0)
    typical, low, high = statistics.median(seen), _quantile(seen, 0.1), _quantile(seen, 0.9)
    left = sorted(t - elapsed for t in seen if t > elapsed)
    outlasted = not left
    if outlasted:
        remaining, remaining_low, remaining_high = typical / 2, 0.0, typical
    else:
        remaining = statistics.median(left)
        remaining_low, remaining_high = _quantile(left, 0.1), _quantile(left, 0.9)
    ahead = position - 1
    spread = (high - low) / typical if typical > 0 else math.inf
    confidence: Confidence = "low"
    if not outlasted and len(seen) >= 8 and spread <= 0.5:
        confidence = "high"
    elif not outlasted and len(seen) >= 3 and spread <= 1.5:
        confidence = "medium"
    return Eta(
        expected=remaining + ahead * typical,
        earliest=remaining_low + ahead * low,
        latest=remaining_high + ahead * high,
        confidence=confidence,
        position=position,
        tenures=len(seen),
    )


def reported() -> Eta | None:
    """The ETA of the wait engine's report being made (inside an ``on_waiting`` callback), or ``None``."""
    return _REPORTED.get()


def reported_holder_age() -> float | None:
    """Inside an ``on_waiting`` callback: seconds since the engine read the holder it passes (``None``:
    unknown, such as a holder known only from a refused acquisition, which does not say its expiry)."""
    return _HOLDER_AGE.get()


NO_ESTIMATE = "no start estimate yet (no change of hands seen)"
"""What a waiting line says when the lock has not changed hands while it was watched."""


def expected_start(eta: Eta | None) -> str:
    """A waiting line's ETA phrase: :meth:`Eta.describe`, or :data:`NO_ESTIMATE`."""
    return eta.describe() if eta is not None else NO_ESTIMATE


@contextmanager
def reporting(eta: Eta | None, *, holder_age: float | None = None) -> Iterator[None]:
    """Within the block, :func:`reported` returns ``eta`` and :func:`reported_holder_age` ``holder_age``
    (the wait engine, around ``on_waiting``)."""
    token, age_token = _REPORTED.set(eta), _HOLDER_AGE.set(holder_age)
    try:
        yield
    finally:
        _HOLDER_AGE.reset(age_token)
        _REPORTED.reset(token)
