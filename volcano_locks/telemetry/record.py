"""What the core records, one function per event: the client, the keeper, the wait engine, the release
and the fences call these, and nothing else of the telemetry package.

Each function turns an event into records of :data:`~volcano_locks.telemetry.INSTRUMENTS` and hands them
to the sinks (:func:`~volcano_locks.telemetry.sinks.emit`); none of them raises. Times are lease-clock
readings (:func:`volcano_locks.clock.lease_clock`), passed in where the caller already has one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from functools import wraps
from typing import Any, Literal, ParamSpec

from volcano_locks.clock import lease_clock
from volcano_locks.models import LockLease
from volcano_locks.telemetry import traces
from volcano_locks.telemetry.attributes import lock_attributes
from volcano_locks.telemetry.instruments import INSTRUMENTS
from volcano_locks.telemetry.sinks import emit
from volcano_locks.telemetry.tenures import Ended, Tenures

__all__ = [
    "WaitOutcome",
    "acquired",
    "budget_used",
    "ended",
    "fence_refused",
    "renewed",
    "request",
    "wait_ended",
    "wait_started",
    "waiting",
]

logger = logging.getLogger("volcano_locks.telemetry")

P = ParamSpec("P")

WaitOutcome = Literal["acquired", "timed_out", "skipped", "cancelled", "failed"]
"""How a wait ended."""
Ending = Literal["released", "lapsed", "lost"]
"""How a tenure ended: released, left to lapse at its expiry, or lost while held."""

_TENURES = Tenures()


def _never_raises(fn: Callable[P, None]) -> Callable[P, None]:
    @wraps(fn)
    def safe(*args: P.args, **kwargs: P.kwargs) -> None:
        try:
            fn(*args, **kwargs)
        except Exception:
            logger.debug("recording lock metrics failed", exc_info=True)

    return safe


def _emit(name: str, value: float, key: str | None, more: Mapping[str, str] | None = None) -> None:
    emit(INSTRUMENTS[name], value, lock_attributes(key, more))


def _end(ended: Ended | None, ending: Ending, fencing_token: int | None, reason: str | None = None) -> None:
    if ended is None:
        return
    _emit("volcano.lock.hold.duration", ended.held, ended.key, {"volcano.lock.ending": ending})
    _emit("volcano.lock.leases", -1, ended.key)
    event: dict[str, str | int | float] = {"volcano.lock.held_s": round(ended.held, 3)}
    if fencing_token is not None:
        event["volcano.lock.fencing_token"] = fencing_token
    if reason is not None:
        event["volcano.lock.loss.reason"] = reason
    traces.add_event(ended.span, ending, event)
    traces.end(ended.span, {"volcano.lock.ending": ending})


@_never_raises
def acquired(lease: LockLease, now: float | None = None) -> None:
    """``lease`` was acquired: a tenure begins (and a handoff ends, if the key was released here lately)."""
    now = lease_clock() if now is None else now
    for gone in _TENURES.sweep(now):
        _end(gone, "lapsed", None)
    new, handoff = _TENURES.begin(lease.key, lease.fencing_token, lease.local_deadline, now)
    if not new:
        return
    span = traces.start(
        "volcano.lock.hold", {**lock_attributes(lease.key), "volcano.lock.fencing_token": lease.fencing_token}
    )
    _TENURES.attach(lease.key, lease.fencing_token, span)
    _emit("volcano.lock.leases", 1, lease.key)
    if handoff is not None:
        _emit("volcano.lock.handoff.duration", handoff, lease.key)


@_never_raises
def renewed(old: LockLease, new: LockLease, now: float) -> None:
    """The keeper renewed ``old`` into ``new`` at ``now``: the margin it had left is the early warning."""
    span = _TENURES.extend(new.key, new.fencing_token, new.local_deadline)
    margin = max(0.0, old.local_deadline - now)
    _emit("volcano.lock.renewal.margin", margin, old.key)
    traces.add_event(
        span,
        "renewed",
        {"volcano.lock.fencing_token": new.fencing_token, "volcano.lock.margin_s": round(margin, 3)},
    )


@_never_raises
def ended(lease: LockLease, ending: Ending, *, reason: str | None = None, now: float | None = None) -> None:
    """``lease``'s tenure ended (the first end told counts); a loss is counted with its ``reason``."""
    now = lease_clock() if now is None else now
    gone = _TENURES.end(lease.key, lease.fencing_token, now, released=ending == "released")
    if ending == "lost" and (gone is not None or reason is not None):
        _emit("volcano.lock.losses", 1, lease.key, {"volcano.lock.loss.reason": reason or "unknown"})
    _end(gone, ending, lease.fencing_token, reason)


@_never_raises
def request(key: str | None, operation: str, status: int | None) -> None:
    """A request of ``operation`` got ``status`` (``None``: none); a refused acquisition is contention."""
    shown = "no_response" if status is None else str(status)
    _emit(
        "volcano.lock.requests",
        1,
        key,
        {"volcano.request.operation": operation, "volcano.request.status": shown},
    )
    if operation == "acquire" and status == 409:
        _emit("volcano.lock.contentions", 1, key)


@_never_raises
def budget_used(share: float) -> None:
    """This process's requests this minute, as a share of the project's quota."""
    _emit("volcano.lock.budget.used", share, None)


def wait_started(key: str, mode: str) -> Any:
    """A wait for ``key`` starts: its span (``volcano.lock.wait``, or ``None``), for :func:`wait_ended`."""
    try:
        return traces.start("volcano.lock.wait", {**lock_attributes(key), "volcano.lock.wait.mode": mode})
    except Exception:
        logger.debug("starting the wait's span failed", exc_info=True)
        return None


@_never_raises
def wait_ended(key: str, outcome: WaitOutcome, seconds: float, span: Any = None) -> None:
    """A wait for ``key`` ended with ``outcome`` after ``seconds`` (its span, if any, ends too)."""
    _emit("volcano.lock.wait.duration", max(0.0, seconds), key, {"volcano.lock.outcome": outcome})
    traces.end(span, {"volcano.lock.outcome": outcome})


@_never_raises
def waiting(key: str, mode: str, delta: int) -> None:
    """A waiter on ``key`` started (``+1``) or stopped (``-1``) waiting for a held lock."""
    _emit("volcano.lock.waiters", delta, key, {"volcano.lock.wait.mode": mode})


@_never_raises
def fence_refused(store: str, key: str | None = None) -> None:
    """A fenced ``store`` refused a stale write."""
    _emit("volcano.fence.refused", 1, key, {"volcano.fence.store": store})
