"""The per-project request quota: fixed windows aligned to the clock's minutes, counted by the store.

Where the count lives follows where the locks live, so server processes that share a store share the
quota: PostgreSQL counts in its database (one statement per request, asynchronous commit), and SQLite
in its file too, because two processes on one SQLite file are a tested deployment and the cost is
small: one upsert, about 15 µs per request on the 2-core dev machine against roughly 200 µs of server
CPU per request, with no change beyond noise in bench/bench_server.py. MemoryQuotaCounter counts in
this process only (the limiter's default, for a store used by one process alone).
"""

from __future__ import annotations

import logging
import math
import threading
from typing import Protocol

from .clock import Clock, system_clock
from .errors import StoreUnavailable

__all__ = ["WINDOW_SECONDS", "MemoryQuotaCounter", "QuotaCounter", "QuotaLimiter"]

WINDOW_SECONDS = 60

log = logging.getLogger("volcano_locks.server")


class QuotaCounter(Protocol):
    """Request counts per (project, window); windows are whole minutes since the epoch."""

    def increment(self, project: str, window: int) -> int:
        """Count one request of `project` in `window`; return the window's count so far."""
        ...

    def prune(self, before: int) -> None:
        """Forget the counts of windows before `before`."""
        ...


class MemoryQuotaCounter:
    """Counts in this process only (for a store that one process uses alone)."""

    def __init__(self) -> None:
        """Start with no counts."""
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, int], int] = {}

    def increment(self, project: str, window: int) -> int:
        """Count one request of `project` in `window`; return the window's count so far."""
        with self._lock:
            count = self._counts.get((project, window), 0) + 1
            self._counts[(project, window)] = count
        return count

    def prune(self, before: int) -> None:
        """Forget the counts of windows before `before`."""
        with self._lock:
            for old in [k for k in self._counts if k[1] < before]:
                del self._counts[old]


class QuotaLimiter:
    """Allow `limit` requests per project per clock minute (0 disables the quota)."""

    def __init__(self, limit: int, clock: Clock = system_clock, counter: QuotaCounter | None = None) -> None:
        """Allow `limit` requests per project per minute, windows taken from `clock`, counted by `counter`."""
        if limit < 0:
            raise ValueError(f"quota must be >= 0, got {limit}")
        self.limit = limit
        self._clock = clock
        self.counter: QuotaCounter = counter if counter is not None else MemoryQuotaCounter()
        self._lock = threading.Lock()
        self._pruned_to: int | None = None

    def hit(self, project: str) -> int | None:
        """Count one request; return None if allowed, else the whole seconds (>= 1) until the next window.

        Raises StoreUnavailable when the count cannot be kept (the request then fails closed).
        """
        if self.limit == 0:
            return None
        now = self._clock()
        window = math.floor(now / WINDOW_SECONDS)
        count = self.counter.increment(project, window)
        self._prune(window)
        if count <= self.limit:
            return None
        left = (window + 1) * WINDOW_SECONDS - now
        return max(1, math.ceil(left))

    def _prune(self, window: int) -> None:
        # Once per new window per process; the previous window is kept for processes slightly behind.
        with self._lock:
            if self._pruned_to is not None and window <= self._pruned_to:
                return
            self._pruned_to = window
        try:
            self.counter.prune(window - 1)
        except StoreUnavailable as exc:
            log.warning("could not prune old quota windows (will retry): %s", exc)
            with self._lock:
                self._pruned_to = None
