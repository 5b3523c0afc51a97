"""The per-project request quota: fixed windows aligned to clock minutes, counted in this process."""

from __future__ import annotations

import math
import threading

from .clock import Clock, system_clock

__all__ = ["QuotaLimiter"]

WINDOW_SECONDS = 60


class QuotaLimiter:
    """Count requests per project per clock minute; `limit` 0 disables the quota."""

    def __init__(self, limit: int, clock: Clock = system_clock) -> None:
        """Allow `limit` requests per project per minute, windows taken from `clock`."""
        if limit < 0:
            raise ValueError(f"quota must be >= 0, got {limit}")
        self.limit = limit
        self._clock = clock
        self._lock = threading.Lock()
        self._windows: dict[str, tuple[int, int]] = {}

    def hit(self, project: str) -> int | None:
        """Count one request; return None if allowed, else the whole seconds (>= 1) until the next window."""
        if self.limit == 0:
            return None
        now = self._clock()
        window = math.floor(now / WINDOW_SECONDS)
        with self._lock:
            current, count = self._windows.get(project, (window, 0))
            if current != window:
                count = 0
            count += 1
            self._windows[project] = (window, count)
        if count <= self.limit:
            return None
        left = (window + 1) * WINDOW_SECONDS - now
        return max(1, math.ceil(left))
