"""The tenures this process holds now: when each began, so its end can be timed once, whoever sees it first.

A tenure is one lease's life under one fencing token, from its acquisition to its release, its loss or
its lapse. The keeper may report a loss and the release after it find the lease gone; the first end
counts, the others are ignored. A tenure whose local deadline passed with no end told (a lease acquired
directly and never released) is ended as ``lapsed`` when the table is next swept. Releases are remembered
per key for a while, so the next acquisition of the key here can time the handoff.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

__all__ = ["HANDOFF_HORIZON", "Ended", "Tenures"]

HANDOFF_HORIZON = 600.0
"""A release older than this (seconds) is not paired with the key's next acquisition as a handoff."""
_RELEASES_KEPT = 1024


@dataclass
class _Open:
    began: float  # lease clock
    local_deadline: float
    span: Any = None  # the hold's span, when traces are on


@dataclass(frozen=True)
class Ended:
    """A tenure that ended: its key, how long it was held (seconds) and its span (or ``None``)."""

    key: str
    held: float
    span: Any = None


class Tenures:
    """Open tenures by ``(key, fencing token)``; every method takes the lease-clock time ``now``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[tuple[str, int], _Open] = {}
        self._released: OrderedDict[str, float] = OrderedDict()

    def begin(
        self, key: str, fencing_token: int, local_deadline: float, now: float
    ) -> tuple[bool, float | None]:
        """A lease was acquired: whether it is a new tenure, and the handoff since the key's last release."""
        with self._lock:
            if (key, fencing_token) in self._open:
                return False, None  # the same lease again (an idempotent re-acquire)
            self._open[(key, fencing_token)] = _Open(now, local_deadline)
            released = self._released.pop(key, None)
        handoff = None if released is None or now - released > HANDOFF_HORIZON else now - released
        return True, handoff

    def attach(self, key: str, fencing_token: int, span: Any) -> None:
        """Keep the hold's span with its tenure (ended with it)."""
        with self._lock:
            tenure = self._open.get((key, fencing_token))
            if tenure is not None:
                tenure.span = span

    def extend(self, key: str, fencing_token: int, local_deadline: float) -> Any:
        """A renewal moved the tenure's local deadline; returns the tenure's span (or ``None``)."""
        with self._lock:
            tenure = self._open.get((key, fencing_token))
            if tenure is None:
                return None
            tenure.local_deadline = local_deadline
            return tenure.span

    def end(self, key: str, fencing_token: int, now: float, *, released: bool) -> Ended | None:
        """The tenure ended at ``now``: how long it was held, or ``None`` if its end was already told."""
        with self._lock:
            tenure = self._open.pop((key, fencing_token), None)
            if released:
                self._released[key] = now
                self._released.move_to_end(key)
                while len(self._released) > _RELEASES_KEPT:
                    self._released.popitem(last=False)
        return None if tenure is None else Ended(key, now - tenure.began, tenure.span)

    def sweep(self, now: float) -> list[Ended]:
        """End (and return) the tenures whose local deadline passed with no end told."""
        with self._lock:
            gone = [k for k, t in self._open.items() if t.local_deadline <= now]
            ended = [(k, self._open.pop(k)) for k in gone]
        return [Ended(k[0], now - t.began, t.span) for k, t in ended]

    def held(self) -> int:
        """How many tenures are open."""
        return len(self._open)
