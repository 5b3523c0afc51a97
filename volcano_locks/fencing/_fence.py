"""What a fenced store needs from a lease (:class:`Fence`), and how a store says no.

A fenced write needs two public facts: the lock key (fencing tokens compare only within one key) and the
fencing token. :func:`fence_of` takes them from whatever form the lease reaches the user's code in, so
nobody copies a token by hand: a :class:`~volcano_locks.LockLease`, a ``with_lock`` guard, the core's
:class:`~volcano_locks.LeaseFacts` (Prefect's ``current_lease()``), a Prefect ``LockedResult``, or the
``volcano_lease`` mapping an Airflow callable receives (and XCom holds). The ownership token is never read.

Every adapter decides a refusal in one place, :func:`refusal` (given the adapter's name), which builds the
one :class:`StaleFencingToken`: a write whose token is older than the stored one, or whose lock key is not
the one the resource is fenced by. :class:`FenceBusy` is the other way a fenced write ends without
writing: the resource's guard stayed held by another transaction (a stalled writer) past the bound.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from volcano_locks.errors import ErrorCode, VolcanoError
from volcano_locks.protocol import validate_key
from volcano_locks.telemetry import record

__all__ = ["ADAPTERS", "Fence", "FenceBusy", "StaleFencingToken", "fence_of", "refusal", "validate_resource"]

ADAPTERS = ("table", "sql", "s3")
"""The fenced stores, as :func:`refusal` names them: ``FencedTable``, ``FencedSQL``/``AsyncFencedSQL``,
``FencedS3Prefix``."""

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
    """A fenced store refused a write: its token is older than the stored one, or of another lock key.

    Part of the one error tree (a :class:`~volcano_locks.errors.VolcanoError` with code
    ``stale_fencing_token``); still a ``RuntimeError`` for code written before it was. ``resource``,
    ``fencing_token``, ``lock_key`` (the refused writer's, when known) and ``stored`` (what the store
    holds: its ``lock_key`` and ``fencing_token``, or ``None``) say what was refused and why;
    ``another_lock`` is true when the resource is fenced by a different lock key (tokens of two keys do
    not compare, so the writer may well still hold its own lock).
    """

    def __init__(
        self, resource: str, fencing_token: int, stored: Stored | None, *, lock_key: str | None = None
    ) -> None:
        another_lock = stored is not None and lock_key is not None and stored.lock_key != lock_key
        if stored is not None and another_lock:
            message = (
                f"write to {resource!r} refused: it is fenced by lock {stored.lock_key!r} (fencing token "
                f"{stored.fencing_token}), and tokens of lock {lock_key!r} do not compare with that lock's; "
                f"a resource keeps the lock key that first wrote it: write {resource!r} under lock "
                f"{stored.lock_key!r}, or give this lock's data a resource name of its own"
            )
        else:
            held = (
                f"fencing token {stored.fencing_token} of lock {stored.lock_key!r}" if stored else "nothing"
            )
            message = (
                f"stale write to {resource!r} rejected: fencing token {fencing_token} is older than the "
                f"stored {held}; the writer no longer holds the lock"
            )
        super().__init__(message, code=ErrorCode.STALE_FENCING_TOKEN)
        self.resource = resource
        self.fencing_token = fencing_token
        self.lock_key = lock_key
        self.stored = stored
        self.another_lock = another_lock

    @property
    def stored_token(self) -> int | None:
        """The fencing token the store holds (``None`` when it holds nothing)."""
        return None if self.stored is None else self.stored.fencing_token


def refusal(adapter: str, resource: str, fence: Fence, stored: Stored | None) -> StaleFencingToken:
    """The refusal of ``fence``'s write to ``resource`` by ``adapter`` (one of :data:`ADAPTERS`).

    The one place every fenced store turns "the stored fence wins" into the error it raises: a count of
    stale writes refused per store belongs here.
    """
    if adapter not in ADAPTERS:
        raise ValueError(f"adapter must be one of {ADAPTERS}, got {adapter!r}")
    record.fence_refused(adapter, fence.lock_key)
    return StaleFencingToken(resource, fence.fencing_token, stored, lock_key=fence.lock_key)


class FenceBusy(VolcanoError, TimeoutError):
    """A fenced write waited its bound for the resource's guard, held by another writer's transaction.

    Nothing was written. The holder of the guard is a writer stalled (paused, partitioned) or slow inside
    its fenced transaction; ``resource``, ``waited`` (how the wait was bounded, e.g. ``"lock_timeout
    30 s"``) and the message's fix say what to do. Retrying later is safe.
    """

    def __init__(self, resource: str, waited: str, fix: str) -> None:
        super().__init__(
            f"the guard of {resource!r} stayed held by another transaction past its bound ({waited}): "
            f"a writer is stalled or slow inside its fenced transaction; nothing was written; {fix}",
            code=ErrorCode.FENCE_BUSY,
        )
        self.resource = resource
        self.waited = waited
