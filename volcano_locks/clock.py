"""The lease clock: monotonic, and still counting while the machine is suspended.

A lease's local deadline is measured on this clock. ``time.monotonic()`` stops while a Linux machine
is suspended (``CLOCK_MONOTONIC``), so a laptop that slept past its TTL would wake up believing its
lease still had time left. Linux's ``CLOCK_BOOTTIME`` keeps counting through suspension, and so does
macOS's ``clock_gettime(CLOCK_MONOTONIC)`` (unlike ``time.monotonic()`` there, which stops): the
lease clock is whichever of those the platform has, else ``time.monotonic``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

__all__ = ["SUSPEND_AWARE", "lease_clock"]


def _pick() -> tuple[Callable[[], float], bool]:
    clock_id = getattr(time, "CLOCK_BOOTTIME", None)
    if clock_id is None and sys.platform == "darwin":  # pragma: no cover - not this platform
        clock_id = getattr(time, "CLOCK_MONOTONIC", None)
    if clock_id is not None:
        try:
            time.clock_gettime(clock_id)
        except OSError:  # pragma: no cover - a kernel without it
            pass
        else:
            return (lambda: time.clock_gettime(clock_id)), True
    return time.monotonic, False  # pragma: no cover - platforms without a suspend-aware clock


lease_clock, SUSPEND_AWARE = _pick()
"""``lease_clock()`` reads the lease clock in seconds; ``SUSPEND_AWARE`` says whether it counts suspension."""
