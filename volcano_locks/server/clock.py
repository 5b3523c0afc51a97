"""Wall clocks for the server: the real one and a manual one for timing tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["Clock", "ManualClock", "system_clock"]

Clock = Callable[[], float]
"""A wall clock: seconds since the Unix epoch as a float (like `time.time`)."""


def system_clock() -> float:
    """Return the real wall-clock time in seconds since the epoch."""
    return time.time()


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
