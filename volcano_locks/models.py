"""Immutable values returned by the lock calls: :class:`LockLease` and :class:`LockState`."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

__all__ = ["ABSOLUTE_LEASE_SECONDS", "LockLease", "LockState"]

ABSOLUTE_LEASE_SECONDS = 90 * 24 * 3600
"""Every acquisition ends at most 90 days after it started, whatever renewals happen."""


@dataclass(frozen=True)
class LockLease:
    """A held lease; the ``token`` proves ownership and is never shown in its repr.

    Attributes:
        key: The lock key.
        token: The ownership token (a UUID string, kept verbatim). Secret.
        expires_at: When the server will let the lease lapse (aware UTC).
        fencing_token: Rises whenever the lock changes hands; pass it to what the lock protects.
        ttl: The TTL in seconds of the last acquire or renew.
        acquired_at: Wall-clock time the acquisition was sent (aware UTC).
        local_deadline: ``time.monotonic()`` value at which this holder must consider the lease gone:
            when the successful request was sent plus ``ttl``, never past ``absolute_deadline``.
        absolute_deadline: ``time.monotonic()`` value 90 days after the acquisition started.
    """

    key: str
    token: str = field(repr=False)
    expires_at: datetime
    fencing_token: int
    ttl: int
    acquired_at: datetime
    local_deadline: float
    absolute_deadline: float

    def public_dict(self) -> dict[str, str | int]:
        """Return the shareable part of the lease (for XCom, task results and logs): no token."""
        return {
            "lock_key": self.key,
            "fencing_token": self.fencing_token,
            "acquired_at": self.acquired_at.isoformat(),
            "expires_at": self.expires_at.isoformat(),
        }


@dataclass(frozen=True)
class LockState:
    """What ``get`` reports about a lock: held or not, and the holder's expiry and fencing token."""

    held: bool
    expires_at: datetime | None = None
    fencing_token: int | None = None
