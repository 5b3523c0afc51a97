"""Public facts about a held lease: what the task body and the task's caller may see."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

__all__ = ["LeaseInfo", "LockedResult"]

T = TypeVar("T")


@dataclass(frozen=True)
class LeaseInfo:
    """The public facts of the lease a `locked_task` body runs under (never the ownership token).

    Attributes:
        lock_key: The lock key, after templating.
        fencing_token: The lease's fencing token; hand it to every write the body makes.
        acquired_at: When the lease was acquired (aware UTC).
        expires_at: When the lease expires unless renewed again (aware UTC; moves on each renewal).
        ttl: The lease's TTL in seconds.
    """

    lock_key: str
    fencing_token: int
    acquired_at: datetime
    expires_at: datetime
    ttl: int

    def public_dict(self) -> dict[str, Any]:
        """Return the facts as JSON-friendly primitives (ISO 8601 timestamps)."""
        return {
            "lock_key": self.lock_key,
            "fencing_token": self.fencing_token,
            "acquired_at": self.acquired_at.isoformat(),
            "expires_at": self.expires_at.isoformat(),
            "ttl": self.ttl,
        }


@dataclass(frozen=True)
class LockedResult(Generic[T]):
    """A `locked_task`'s return value together with the lease it was produced under.

    Returned instead of the bare value when the task is decorated with
    `locked_task(..., result="locked_result")`.

    Attributes:
        value: What the task body returned.
        lock_key: The lock key, after templating.
        fencing_token: The fencing token of the lease the body ran under.
        acquired_at: When the lease was acquired (aware UTC).
        expires_at: The lease's expiry as last renewed before release (aware UTC).
    """

    value: T
    lock_key: str
    fencing_token: int
    acquired_at: datetime
    expires_at: datetime
