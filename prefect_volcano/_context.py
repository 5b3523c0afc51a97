"""The context variable that tells a `locked_task` body which lease it runs under."""

from __future__ import annotations

from contextvars import ContextVar
from typing import TYPE_CHECKING

from prefect_volcano.results import LeaseInfo

if TYPE_CHECKING:
    from volcano_locks import LockLease

__all__ = ["current_lease"]

# Holds a zero-argument callable returning the guard's latest lease, so that
# current_lease() reflects renewals (expires_at moves) without copying on each one.
_active: ContextVar[LeaseSource | None] = ContextVar("prefect_volcano_active_lease", default=None)


class LeaseSource:
    """Where current_lease() reads the latest lease of the running body from."""

    __slots__ = ("_guard",)

    def __init__(self, guard: object) -> None:
        self._guard = guard

    def latest(self) -> LockLease:
        lease: LockLease | None = getattr(self._guard, "lease", None)
        if lease is None:  # the guard only yields without a lease when not acquired
            raise RuntimeError("the lock guard holds no lease")
        return lease


def lease_info(lease: LockLease) -> LeaseInfo:
    """Turn a core lease into its public facts."""
    return LeaseInfo(
        lock_key=lease.key,
        fencing_token=lease.fencing_token,
        acquired_at=lease.acquired_at,
        expires_at=lease.expires_at,
        ttl=lease.ttl,
    )


def current_lease() -> LeaseInfo:
    """Return the public facts of the lease the running `locked_task` body holds.

    Returns:
        The lock key, fencing token, acquisition time, current expiry and TTL.

    Raises:
        RuntimeError: When called outside the body of a `locked_task`.
    """
    source = _active.get()
    if source is None:
        raise RuntimeError("current_lease() is only available inside the body of a locked_task")
    return lease_info(source.latest())
