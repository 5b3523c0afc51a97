"""Public facts about a held lease: what the task body and the task's caller may see.

The facts are the core's one public form of a lease, :class:`volcano_locks.LeaseFacts` (the same
lock key, fencing token, times and TTL that Airflow puts in XCom): never the ownership token.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Generic, TypeVar

from volcano_locks import LeaseFacts

__all__ = ["LeaseInfo", "LockedResult"]

T = TypeVar("T")

LeaseInfo = LeaseFacts
"""What `current_lease()` gives a body: the core's `LeaseFacts` (lock_key, fencing_token, acquired_at,
expires_at, ttl; `as_dict()` / `public_dict()` for JSON)."""


@dataclass(frozen=True)
class LockedResult(Generic[T]):
    """A `locked_task`'s return value together with the lease it was produced under.

    Returned instead of the bare value when the task is decorated with
    `locked_task(..., result="locked_result")`.

    Attributes:
        value: What the task body returned.
        lease: The public facts of the lease the body ran under (expiry as last renewed).
    """

    value: T
    lease: LeaseFacts

    @property
    def lock_key(self) -> str:
        """The lock key, after templating."""
        return self.lease.lock_key

    @property
    def fencing_token(self) -> int:
        """The fencing token of the lease the body ran under."""
        return self.lease.fencing_token

    @property
    def acquired_at(self) -> datetime:
        """When the lease was acquired (aware UTC)."""
        return self.lease.acquired_at

    @property
    def expires_at(self) -> datetime:
        """The lease's expiry as last renewed before release (aware UTC)."""
        return self.lease.expires_at
