"""The context variable that tells a locked body (and, under `locked_flow`, its tasks) its lease."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from prefect_volcano.results import LeaseInfo
from volcano_locks import OwnershipLost

if TYPE_CHECKING:
    from volcano_locks import AsyncLockGuard, LockGuard, LockLease

__all__ = ["current_lease", "current_once", "lease_scope"]

# Holds the guard of the innermost locked body, so current_lease() reflects renewals (expires_at
# moves) without copying on each one. Prefect copies the context into the threads that run
# submitted tasks, so every task of a locked flow sees the flow's guard.
_active: ContextVar[LockGuard | AsyncLockGuard | None] = ContextVar(
    "prefect_volcano_active_lease", default=None
)


@contextmanager
def lease_scope(guard: LockGuard | AsyncLockGuard) -> Iterator[None]:
    """Make `guard` the lease `current_lease()` reports for the duration of the block."""
    reset = _active.set(guard)
    try:
        yield
    finally:
        _active.reset(reset)


def lease_info(lease: LockLease) -> LeaseInfo:
    """Turn a core lease into its public facts (the core's one conversion)."""
    return lease.facts()


def current_lease() -> LeaseInfo:
    """Return the public facts of the lease the running locked body holds.

    Inside a `locked_task` body that is the task's lease; inside a `locked_flow` (its body and
    every task it runs in threads Prefect starts for it) it is the flow run's one lease.

    Returns:
        The lock key, fencing token, acquisition time, current expiry and TTL.

    Raises:
        RuntimeError: When called outside a locked body.
        OwnershipLost: When the lease was lost: work that asks for its token after a loss stops.
    """
    guard = _active.get()
    if guard is None:
        raise RuntimeError(
            "current_lease() is only available inside the body of a locked_task or locked_flow"
        )
    if guard.lost:
        raise guard.loss or OwnershipLost("the lock's lease was lost")
    lease = guard.lease
    if lease is None:  # a guard only lacks a lease when it did not acquire, and then no body runs
        raise RuntimeError("the lock guard holds no lease")
    return lease_info(lease)


def current_once() -> Any:
    """The running `locked_task(..., once_key=...)`'s business key, bound to its lease.

    Do the effect through it, so the effect and its record commit together: `with current_once().begin()
    as effect:` (a `SQLLedger`: run your statements on `effect.connection`, set `effect.result`),
    `async with` for an `AsyncSQLLedger`, or `current_once().publish(files, result=...)` for an `S3Ledger`.

    Raises:
        RuntimeError: Outside a locked body, or in one without `once_key`.
        OwnershipLost: When the lease was lost.
    """
    current_lease()  # outside a body, or after a loss: its error
    guard = _active.get()
    once = getattr(guard, "once", None)
    if once is None:
        raise RuntimeError("current_once() needs a locked_task with once_key= and ledger=")
    return once
