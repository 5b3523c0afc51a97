"""Immutable values returned by the lock calls: :class:`LockLease` and :class:`LockState`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

__all__ = ["ABSOLUTE_LEASE_SECONDS", "LeaseFacts", "LeaseRef", "LockLease", "LockState"]

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

    def facts(self) -> LeaseFacts:
        """The lease's public facts (for XCom, task results, events and logs): never the token."""
        return LeaseFacts(self.key, self.fencing_token, self.acquired_at, self.expires_at, self.ttl)

    def public_dict(self) -> dict[str, str | int]:
        """Return the public facts as JSON primitives (``self.facts().as_dict()``)."""
        return self.facts().as_dict()

    def ref(self) -> LeaseRef:
        """This lease as a :class:`LeaseRef` (what a release needs), until its local deadline."""
        return LeaseRef(self.key, self.token, self.fencing_token, until=self.local_deadline)


@dataclass(frozen=True)
class LeaseRef:
    """Which lease to release: its key and ownership token, for a holder that has no :class:`LockLease`.

    A release sends only the key and the token, so an owner that kept neither the lease nor its
    deadlines (a lease acquired by another process for it: an Airflow trigger's handoff, a lock
    group's lease) releases through a reference. ``VolcanoLocks.release``, its async twin and
    :func:`volcano_locks.releasing.release_or_lapse` accept one wherever they accept a lease.

    Attributes:
        key: The lock key.
        token: The ownership token. Secret: never in the repr.
        fencing_token: The lease's fencing token when known (for log lines; never sent).
        until: The lease-clock time (:mod:`volcano_locks.clock`) after which the lease is surely
            gone, when known: a refused release is retried until then. ``None``: one attempt.
    """

    key: str
    token: str = field(repr=False)
    fencing_token: int | None = None
    until: float | None = None


@dataclass(frozen=True)
class LeaseFacts:
    """What anyone may know of a lease: the one public form, shared by the core and both integrations.

    Attributes:
        lock_key: The lock key.
        fencing_token: The lease's fencing token; hand it to every write the lock protects.
        acquired_at: When the acquisition was sent (aware UTC).
        expires_at: When the server lets the lease lapse unless renewed (aware UTC, as last renewed).
        ttl: The lease's TTL in seconds.
    """

    lock_key: str
    fencing_token: int
    acquired_at: datetime
    expires_at: datetime
    ttl: int

    def as_dict(self) -> dict[str, str | int]:
        """The facts as JSON primitives (ISO 8601 timestamps): what XCom and task results carry."""
        return {
            "lock_key": self.lock_key,
            "fencing_token": self.fencing_token,
            "acquired_at": self.acquired_at.isoformat(),
            "expires_at": self.expires_at.isoformat(),
            "ttl": self.ttl,
        }

    def public_dict(self) -> dict[str, str | int]:
        """The same as :meth:`as_dict` (the name ``LockLease.public_dict`` uses too)."""
        return self.as_dict()

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> LeaseFacts:
        """Rebuild the facts from :meth:`as_dict` output (e.g. read back from XCom)."""
        return cls(
            lock_key=str(data["lock_key"]),
            fencing_token=int(data["fencing_token"]),  # type: ignore[call-overload]
            acquired_at=datetime.fromisoformat(str(data["acquired_at"])),
            expires_at=datetime.fromisoformat(str(data["expires_at"])),
            ttl=int(data["ttl"]),  # type: ignore[call-overload]
        )


@dataclass(frozen=True)
class LockState:
    """What ``get`` reports about a lock: held or not, and the holder's expiry and fencing token."""

    held: bool
    expires_at: datetime | None = None
    fencing_token: int | None = None
