"""The lock store interface: atomic read-decide-write of a (project, key) row and quota counts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from .quota import QuotaCounter

__all__ = ["Decide", "LockRow", "LockStore"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class LockRow:
    """One key's stored state; the row outlives releases so the fencing sequence never resets.

    Times are integer microseconds since the Unix epoch. `token_hash` is the SHA-256 hex digest of the
    ownership token (the token itself is never stored), or None when no lease is recorded.
    """

    token_hash: str | None
    fencing: int
    expires_us: int
    deadline_us: int


Decide = Callable[[LockRow | None], tuple[LockRow | None, T]]
"""Given the current row (None if the key was never used), return (row to write or None, result).

It may raise to abort the change; the store then writes nothing.
"""


class LockStore(Protocol):
    """Storage for lock rows with an atomic read-decide-write per (project, key)."""

    def update(self, project: str, key: str, decide: Decide[T]) -> T:
        """Run `decide` on the row under an exclusive row lock and write its result in one transaction."""
        ...

    def read(self, project: str, key: str) -> LockRow | None:
        """Return the row for (project, key), or None if it was never written."""
        ...

    def quota_counter(self) -> QuotaCounter:
        """A request counter kept where the rows are, so processes sharing the store share the quota."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...
