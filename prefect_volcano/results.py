"""Public facts about a held lease: what the task body and the task's caller may see.

The facts are the core's one public form of a lease, :class:`volcano_locks.LeaseFacts` (the same
lock key, fencing token, times and TTL that Airflow puts in XCom): never the ownership token.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar, cast, overload

from volcano_locks import LeaseFacts

__all__ = ["LeaseInfo", "LockedResult"]

T = TypeVar("T")
V = TypeVar("V")

LeaseInfo = LeaseFacts
"""What `current_lease()` gives a body: the core's `LeaseFacts` (lock_key, fencing_token, acquired_at,
expires_at, ttl; `as_dict()` / `public_dict()` for JSON)."""


class _FromLease(Generic[V]):
    """A read-only attribute of a :class:`LockedResult`: the fact of the same name of its lease."""

    def __init__(self, doc: str) -> None:
        self.__doc__ = doc
        self._name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, result: None, owner: type) -> _FromLease[V]: ...
    @overload
    def __get__(self, result: LockedResult[Any], owner: type) -> V: ...
    def __get__(self, result: LockedResult[Any] | None, owner: type) -> _FromLease[V] | V:
        if result is None:
            return self
        return cast(V, getattr(result.lease, self._name))


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

    lock_key = _FromLease[str]("The lock key, after templating.")
    fencing_token = _FromLease[int]("The fencing token of the lease the body ran under.")
    acquired_at = _FromLease[datetime]("When the lease was acquired (aware UTC).")
    expires_at = _FromLease[datetime]("The lease's expiry as last renewed before release (aware UTC).")
