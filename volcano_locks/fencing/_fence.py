"""What a fenced store needs from a lease (:class:`Fence`), and the one refusal (:class:`StaleFencingToken`).

A fenced write needs two public facts: the lock key (fencing tokens compare only within one key) and the
fencing token. :func:`fence_of` takes them from whatever form the lease reaches the user's code in, so
nobody copies a token by hand: a :class:`~volcano_locks.LockLease`, a ``with_lock`` guard, the core's
:class:`~volcano_locks.LeaseFacts` (Prefect's ``current_lease()``), a Prefect ``LockedResult``, or the
``volcano_lease`` mapping an Airflow callable receives (and XCom holds). The ownership token is never read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from volcano_locks.errors import ErrorCode, VolcanoError
from volcano_locks.protocol import validate_key

__all__ = ["Fence", "StaleFencingToken", "fence_of", "validate_resource"]

_MAX_TOKEN = 2**63 - 1
_MAX_RESOURCE = 512


class Stored(Protocol):
    """What a fenced store remembers of the last accepted write: its lock key and fencing token."""

    @property
    def lock_key(self) -> str: ...

    @property
    def fencing_token(self) -> int: ...


@dataclass(frozen=True)
class Fence:
    """The public facts a fenced write is checked on: the lock key and the fencing token."""

    lock_key: str
    fencing_token: int

    def __post_init__(self) -> None:
        validate_key(self.lock_key)
        token = self.fencing_token
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token <= _MAX_TOKEN:
            raise TypeError(f"fencing_token must be a non-negative 64-bit int, got {token!r}")


def fence_of(lease: object) -> Fence:
    """The :class:`Fence` of ``lease``, in any of the forms a lease reaches user code.

    Raises:
        TypeError: ``lease`` is none of them (the message names its type, never its contents), or it is
            a guard that holds no lease.
    """
    if isinstance(lease, Fence):
        return lease
    if isinstance(lease, Mapping):
        if "lock_key" in lease and "fencing_token" in lease:
            return Fence(lease["lock_key"], lease["fencing_token"])
        raise TypeError(
            "a lease mapping needs 'lock_key' and 'fencing_token' (the volcano_lease XCom form), "
            f"got keys {sorted(map(str, lease))}"
        )
    token = getattr(lease, "fencing_token", None)
    key = getattr(lease, "lock_key", None)
    if key is None:
        key = getattr(lease, "key", None)  # LockLease spells it `key`
    if isinstance(key, str) and token is not None:
        return Fence(key, token)
    inner = getattr(lease, "lease", None)  # a with_lock guard, a Prefect LockedResult
    if inner is not None and inner is not lease:
        return fence_of(inner)
    if hasattr(lease, "lease"):
        raise TypeError(f"{type(lease).__name__} holds no lease: a fenced write needs a held lock")
    raise TypeError(
        "expected a lease (LockLease, a with_lock guard, LeaseFacts, current_lease(), a LockedResult or "
        f"a volcano_lease mapping), got {type(lease).__name__}"
    )


def validate_resource(resource: object) -> str:
    """Check a fenced resource's name: a non-empty string of at most 512 characters."""
    if not isinstance(resource, str) or not resource or len(resource) > _MAX_RESOURCE:
        shown = resource if isinstance(resource, str) and len(resource) <= 80 else type(resource).__name__
        raise ValueError(
            f"resource must be a non-empty string of at most {_MAX_RESOURCE} characters: {shown!r}"
        )
    return resource


class StaleFencingToken(VolcanoError, RuntimeError):
    """A write carried a fencing token older than the stored one: its writer lost the lock.

    Part of the one error tree (a :class:`~volcano_locks.errors.VolcanoError` with code
    ``stale_fencing_token``); still a ``RuntimeError`` for code written before it was. ``resource``,
    ``fencing_token``, ``lock_key`` (the refused writer's, when known) and ``stored`` (what the store
    holds: its ``lock_key`` and ``fencing_token``, or ``None``) say what was refused and why.
    """

    def __init__(
        self, resource: str, fencing_token: int, stored: Stored | None, *, lock_key: str | None = None
    ) -> None:
        held = f"fencing token {stored.fencing_token} of lock {stored.lock_key!r}" if stored else "nothing"
        other_key = stored is not None and lock_key is not None and stored.lock_key != lock_key
        why = (
            f"it was written under another lock ({held}; tokens of lock {lock_key!r} do not compare)"
            if other_key
            else f"fencing token {fencing_token} is older than the stored {held}"
        )
        super().__init__(
            f"stale write to {resource!r} rejected: {why}; the writer no longer holds the lock",
            code=ErrorCode.STALE_FENCING_TOKEN,
        )
        self.resource = resource
        self.fencing_token = fencing_token
        self.lock_key = lock_key
        self.stored = stored

    @property
    def stored_token(self) -> int | None:
        """The fencing token the store holds (``None`` when it holds nothing)."""
        return None if self.stored is None else self.stored.fencing_token
