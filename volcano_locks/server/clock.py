"""Wall clocks for the server: the real one, a manual one for timing tests, and a skewable one for faults.

The server takes every "now" (lease expiry, the grace second, quota windows, key expiry) from one injected
clock. `ManualClock` only moves when a test says so. `SkewedClock` follows another clock with an offset
and a rate that can change while the server runs: the chaos suite steps it forward and back and runs it
fast and slow (`serve --clock-offset/--clock-rate`, and `PUT /__admin/clock` behind the admin key).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

__all__ = [
    "MAX_RATE",
    "Clock",
    "ManualClock",
    "SkewedClock",
    "check_clock_offset",
    "check_clock_rate",
    "system_clock",
]

Clock = Callable[[], float]
"""A wall clock: seconds since the Unix epoch as a float (like `time.time`)."""

MAX_RATE = 100.0
"""The fastest a skewed clock may run (and 1 / MAX_RATE the slowest), times real time."""

_MAX_OFFSET = 10 * 365 * 86400.0  # ten years either way: far enough for any test, short of overflow


def system_clock() -> float:
    """Return the real wall-clock time in seconds since the epoch."""
    return time.time()


def check_clock_rate(rate: float) -> float:
    """Return `rate` if a skewed clock can run at it, else raise ValueError naming it."""
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not math.isfinite(rate):
        raise ValueError(f"clock rate {rate!r} is not a finite number")
    if not 1 / MAX_RATE <= rate <= MAX_RATE:
        raise ValueError(f"clock rate {rate!r} is outside {1 / MAX_RATE:g}..{MAX_RATE:g} (times real time)")
    return float(rate)


def check_clock_offset(seconds: float) -> float:
    """Return `seconds` if it is a usable clock offset or step, else raise ValueError naming it."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not math.isfinite(seconds):
        raise ValueError(f"clock offset {seconds!r} is not a finite number of seconds")
    if abs(seconds) > _MAX_OFFSET:
        raise ValueError(f"clock offset {seconds!r} is more than ten years")
    return float(seconds)


class ManualClock:
    """A wall clock that only moves when told to (thread-safe), for timing tests without sleeping."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        """Start the clock at `start` seconds since the epoch (default: a whole minute in 2027)."""
        self._now = float(start)
        self._lock = threading.Lock()

    def __call__(self) -> float:
        """Return the current fake time."""
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> float:
        """Move the clock forward by `seconds` and return the new time."""
        with self._lock:
            self._now += seconds
            return self._now

    def set(self, now: float) -> None:
        """Set the clock to `now` seconds since the epoch."""
        with self._lock:
            self._now = float(now)


class SkewedClock:
    """`base` moved by an offset and run at a rate, both changeable at any time (thread-safe).

    It reads ``anchor + rate * (base() - base_anchor)``: a step (`jump`) moves the anchor, a new rate
    starts from the current reading, so the clock never moves except by the steps it is told to take.
    """

    def __init__(self, base: Clock = system_clock, *, offset: float = 0.0, rate: float = 1.0) -> None:
        """Follow `base`, `offset` seconds ahead (negative: behind), running `rate` times as fast."""
        self._base = base
        self._lock = threading.Lock()
        self._base_anchor = base()
        self._anchor = self._base_anchor + check_clock_offset(offset)
        self._rate = check_clock_rate(rate)

    def _read(self, base_now: float) -> float:
        return self._anchor + self._rate * (base_now - self._base_anchor)

    def __call__(self) -> float:
        """Return the skewed time."""
        base_now = self._base()
        with self._lock:
            return self._read(base_now)

    def jump(self, seconds: float) -> float:
        """Step the clock by `seconds` (negative: back) and return the new reading."""
        seconds = check_clock_offset(seconds)
        base_now = self._base()
        with self._lock:
            self._anchor = self._read(base_now) + seconds
            self._base_anchor = base_now
            return self._anchor

    def set_rate(self, rate: float) -> float:
        """Run at `rate` times real time from now on (1: normal) and return the current reading."""
        rate = check_clock_rate(rate)
        base_now = self._base()
        with self._lock:
            self._anchor = self._read(base_now)
            self._base_anchor = base_now
            self._rate = rate
            return self._anchor

    def state(self) -> dict[str, float]:
        """The clock now: its reading, its offset from `base` and its rate."""
        base_now = self._base()
        with self._lock:
            now = self._read(base_now)
            return {"now": now, "offset": now - base_now, "rate": self._rate}
