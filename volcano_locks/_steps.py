"""The steps of the core's sans-I/O flows, and what their shells need to drive one.

``with_lock``'s entry (:mod:`volcano_locks.guard`), the lease keeper's schedule
(:mod:`volcano_locks.renewal`) and the wait engine decide in pure code and tell their sync and async
shells what to do next with one of three steps: :class:`Wait` until a time, :class:`Send` one client
call, or :class:`Lose` the lease. A shell performs the step and hands its outcome back (the call's
result, or the :class:`~volcano_locks.errors.VolcanoError` it raised: :func:`outcome`,
:func:`async_outcome`); :func:`advance` sends the outcome into a flow and tells the next step from
the flow's end.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Literal, TypeVar

from volcano_locks.errors import OwnershipLost, VolcanoError
from volcano_locks.models import LeaseRef, LockLease

__all__ = ["Lose", "Op", "Send", "Step", "Wait", "advance", "async_outcome", "outcome"]

S = TypeVar("S")
R = TypeVar("R")

Op = Literal["acquire", "wait_acquire", "get", "renew", "release", "lookup"]
"""The calls a step can ask for (``wait_acquire``: acquire, waiting out contention; ``lookup``: the
run-once ledger's record of the business key, not a client call)."""


@dataclass(frozen=True)
class Wait:
    """Do nothing until the lease-clock time ``until``, unless woken (a waiter) or stopped (a keeper)."""

    until: float


@dataclass(frozen=True)
class Send:
    """Make the client call ``op``; its outcome (the result, or the ``VolcanoError``) comes back.

    ``lease`` is the lease to renew or release; ``timeout`` bounds a renewal's request (``None``: the
    client's own); a call with no outcome by the lease-clock time ``deadline`` has stalled.
    """

    op: Op
    lease: LockLease | LeaseRef | None = None
    timeout: float | None = None
    deadline: float = math.inf


@dataclass(frozen=True)
class Lose:
    """Ownership is lost; ``loss`` is the first reason."""

    loss: OwnershipLost


Step = Wait | Send | Lose


def advance(flow: Generator[S, object, R], sent: object) -> tuple[S | None, R | None]:
    """Send ``sent`` into ``flow``: its next step, or ``None`` and what the flow returned."""
    try:
        return flow.send(sent), None
    except StopIteration as stop:
        return None, stop.value


def outcome(call: Callable[[], object], caught: type[Exception] = VolcanoError) -> object:
    """What ``call()`` gave: its result, or the ``caught`` error it raised (others propagate).

    ``caught`` is ``VolcanoError`` for client calls; a run-once ledger's look-up passes ``Exception`` (its
    store's errors are not the client's, and the flow must release the lock before any leaves).
    """
    try:
        return call()
    except caught as exc:
        return exc


async def async_outcome(call: Awaitable[object], caught: type[Exception] = VolcanoError) -> object:
    """What awaiting ``call`` gave: its result, or the ``caught`` error it raised."""
    try:
        return await call
    except caught as exc:
        return exc
