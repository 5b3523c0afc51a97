"""One waiter: its key, token and request id, where it stands with the lock, and how it is woken.

A waiter's state is one :class:`WaiterState`, changed only by its named transitions; its place in
its key's queue (head or not, woken or not) is the key's (:class:`~volcano_locks.waiting.registry._KeyWait`).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import math
import threading
import uuid
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from volcano_locks._steps import Op
from volcano_locks.clock import lease_clock
from volcano_locks.protocol import (
    new_request_id,
    validate_key,
    validate_poll,
    validate_token,
    validate_ttl,
    validate_wait_timeout,
)

__all__ = ["WaiterState"]


class WaiterState(enum.Enum):
    """Where a waiter stands with the lock it wants."""

    FIRST = "first"
    """Not tried yet: its first attempt acquires at once, ahead of the queue and of a 429's blackout."""
    WAITING = "waiting"
    """Refused (or rate limited before it was served): it looks at the lock before acquiring again."""
    UNCERTAIN = "uncertain"
    """An acquisition got no definite answer, so the server may hold a lease for it: the next try
    acquires with the same token and request id, and a waiter that gives up abandons that lease."""
    ACQUIRED = "acquired"
    """It holds the lease."""


class _Signal(Protocol):
    def set(self) -> None: ...


def _left(until: float) -> float | None:
    """Seconds from now to the lease-clock time ``until`` (``None``: no bound; 0 or less: due)."""
    remaining = until - lease_clock()
    return remaining if math.isfinite(remaining) else None


class _ThreadSignal:
    def __init__(self) -> None:
        self.event = threading.Event()

    def set(self) -> None:
        self.event.set()

    def wait_until(self, until: float) -> None:
        """Block until the lease-clock time ``until`` or until set, whichever is first."""
        left = _left(until)
        if left is None or left > 0:
            self.event.wait(left)
        self.event.clear()


class _LoopSignal:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.event = asyncio.Event()

    def set(self) -> None:
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting any more
            self.loop.call_soon_threadsafe(self.event.set)

    async def wait_until(self, until: float) -> None:
        """Wait until the lease-clock time ``until`` or until set, whichever is first (cancellable)."""
        left = _left(until)
        if left is None or left > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self.event.wait()
        self.event.clear()


class _Booking(NamedTuple):
    """A request reserved from the governor's waiting budget: ``op``, to be sent at lease-clock ``at``."""

    op: Op
    at: float


@dataclass(eq=False)
class _Waiter:
    key: str
    ttl: int
    token: str = field(repr=False)
    request_id: str | None
    signal: _Signal
    state: WaiterState = WaiterState.FIRST
    booking: _Booking | None = None

    @property
    def first(self) -> bool:
        """Its very first attempt is still to come: straight to acquire, not held by a 429 blackout."""
        return self.state is WaiterState.FIRST

    @property
    def uncertain(self) -> bool:
        """An acquisition got no definite answer: the server may hold a lease for it."""
        return self.state is WaiterState.UNCERTAIN

    @property
    def direct(self) -> bool:
        """It acquires without a look first: the first try, and after an uncertain one."""
        return self.state in (WaiterState.FIRST, WaiterState.UNCERTAIN)

    def sending(self, op: Op) -> None:
        """``op`` is about to be sent: an acquisition carries a request id (kept while uncertain)."""
        if op == "acquire" and self.request_id is None:
            self.request_id = new_request_id()

    def acquired(self) -> None:
        """It got the lease."""
        self.state, self.request_id = WaiterState.ACQUIRED, None

    def refused(self) -> None:
        """A definite refusal: no lease of this token's attempts to recover."""
        self.state, self.request_id = WaiterState.WAITING, None

    def looked(self) -> None:
        """A look was answered: it says nothing of the waiter's own acquisitions."""
        if self.state is WaiterState.FIRST:
            self.state = WaiterState.WAITING

    def rate_limited(self) -> None:
        """Refused before it was served: an uncertain acquisition stays so (the next try learns its fate)."""
        if self.state is not WaiterState.UNCERTAIN:
            self.refused()

    def unanswered(self, op: Op) -> None:
        """``op`` got no definite answer (no response, 503, another 5xx)."""
        if op == "acquire":
            self.state = WaiterState.UNCERTAIN
        else:
            self.looked()


def _check(key: str, ttl: int, timeout: float | None, token: str | None, poll: float) -> str:
    validate_key(key)
    validate_ttl(ttl)
    validate_wait_timeout(timeout, name="timeout")
    validate_poll(poll)
    return str(uuid.uuid4()) if token is None else validate_token(token)


def _new_waiter(
    key: str,
    ttl: int,
    timeout: float | None,
    token: str | None,
    poll: float,
    request_id: str | None,
    signal: _Signal,
) -> _Waiter:
    return _Waiter(key, ttl, _check(key, ttl, timeout, token, poll), request_id, signal)
