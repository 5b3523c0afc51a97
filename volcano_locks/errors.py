"""The one exception tree of volcano-locks, and the stable codes its errors carry.

::

    VolcanoError                      every failure; .status .code .request_id .retry_after
     ├── ConflictError                any 409: the lock is not the caller's (the Volcano SDK's name); .holder
     │    ├── LockContention          409 lock_held: another live lease owns the lock
     │    └── OwnershipLost           409 lock_ownership_lost, or loss detected locally by the lease keeper
     ├── WaitTimeout                  a wait for a lock ran out of time; .holder is the last state seen
     ├── RateLimited                  429 lock_rate_limited; .retry_after in seconds
     ├── AuthError                    401 / 403
     ├── InvalidRequest (ValueError)  400, and client-side validation before any request
     ├── Unavailable                  503: the locks control plane fails closed
     ├── ServerError                  any other 5xx
     ├── TransportError               no response at all (connect, timeout, dropped connection)
     ├── ProtocolError                a response breaking the contract (not JSON, missing or mistyped fields)
     ├── StaleFencingToken            (volcano_locks.fencing) a fenced store refused a write with an old token
     ├── FenceBusy (TimeoutError)     (volcano_locks.fencing) a fenced write waited its bound for the guard
     └── AlreadyDone                  (volcano_locks.once) the business key's effect is recorded; .record

``except LockContention:`` means contention and nothing else; ``except ConflictError:`` catches both
409s, as the Volcano SDK's users know it (an acquisition can meet either: the SDKs report both as
contention). Messages never contain a service key or an ownership token. httpx exceptions become
:class:`TransportError` in exactly one place, :func:`volcano_locks.transport.translate_transport_errors`
(beside the rest of the clients' httpx code, so that this module, and ``import volcano_locks`` for its
errors and validators, never imports httpx). The ``code`` of an error is one of :class:`ErrorCode`
(the server's own codes, and those the client sets itself); compare codes with the constants, never
error texts.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, TypedDict, Unpack

if TYPE_CHECKING:
    from volcano_locks.models import LockState

__all__ = [
    "AuthError",
    "ConflictError",
    "ErrorCode",
    "InvalidRequest",
    "LockContention",
    "OwnershipLost",
    "ProtocolError",
    "RateLimited",
    "ServerError",
    "TransportError",
    "Unavailable",
    "VolcanoError",
    "WaitTimeout",
]


class ErrorCode(StrEnum):
    """The stable machine codes on errors (``exc.code``); each compares equal to its string."""

    LOCK_HELD = "lock_held"
    """409 on acquire: another live lease owns the lock."""
    OWNERSHIP_LOST = "lock_ownership_lost"
    """409: this token's lease lapsed or was taken (on acquire: not yet reclaimable)."""
    RATE_LIMITED = "lock_rate_limited"
    """429: the project's requests for this minute are spent."""
    WAIT_TIMEOUT = "wait_timeout"
    """A wait for a lock ran out of time (``WaitTimeout``)."""
    NO_SAFE_WINDOW = "no_safe_window"
    """A fresh lease had no safe renewal window; ``with_lock`` did not enter its block."""
    INTERRUPTED = "interrupted"
    """The body of a sync ``with_lock`` was interrupted on loss (replaced by the loss itself on exit)."""
    LOCAL_DEADLINE_PASSED = "local_deadline_passed"
    """The keeper's local deadline passed before a renewal succeeded."""
    RENEWAL_STALLED = "renewal_stalled"
    """A renewal was still in flight at the local deadline."""
    RENEWAL_WINDOW_EXHAUSTED = "renewal_window_exhausted"
    """Transient renewal failures used up the safe window."""
    ABSOLUTE_DEADLINE_REACHED = "absolute_deadline_reached"
    """The lease reached its 90-day absolute deadline."""
    RENEWAL_FAILED = "renewal_failed"
    """A renewal failed for good (400, 401, 403, 5xx other than 503, a broken response)."""
    KEEPER_FAILED = "keeper_failed"
    """The lease keeper itself failed unexpectedly."""
    STALE_FENCING_TOKEN = "stale_fencing_token"
    """A fenced store refused a write with an older fencing token (or one of another lock key)."""
    FENCE_BUSY = "fence_busy"
    """A fenced write waited its bound for the resource's guard, held by a stalled or slow writer."""
    ALREADY_DONE = "already_done"
    """A run-once ledger already records the business key's effect (``volcano_locks.once.AlreadyDone``)."""


class VolcanoError(Exception):
    """Base class of every volcano-locks error; carries status, code, request id and retry_after."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        request_id: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.request_id = request_id
        self.retry_after = retry_after

    def __str__(self) -> str:
        details = []
        if self.status is not None:
            details.append(f"status {self.status}")
        if self.code:
            details.append(f"code {self.code}")
        if self.retry_after is not None:
            details.append(f"retry after {self.retry_after:g} s")
        if self.request_id:
            details.append(f"request id {self.request_id}")
        return f"{self.message} ({', '.join(details)})" if details else self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self)!r})"

    def __reduce__(self) -> tuple[object, ...]:
        # Keeps the keyword-only attributes when the error crosses a process boundary (Prefect, Airflow).
        return (_rebuild, (type(self), self.message, dict(self.__dict__)))


def _rebuild(cls: type[VolcanoError], message: str, state: dict[str, object]) -> VolcanoError:
    exc = cls.__new__(cls)
    Exception.__init__(exc, message)
    exc.__dict__.update(state)
    return exc


class _Details(TypedDict, total=False):
    """What every error may carry besides its message (``VolcanoError``'s keyword arguments)."""

    status: int | None
    code: str | None
    request_id: str | None
    retry_after: float | None


class _HolderKnown(VolcanoError):
    """An error that says what is known of the lock's holder (``holder``, a ``LockState`` or ``None``)."""

    def __init__(self, message: str, *, holder: LockState | None = None, **details: Unpack[_Details]) -> None:
        super().__init__(message, **details)
        self.holder = holder


class ConflictError(_HolderKnown):
    """A 409: the lock is not the caller's (the Volcano SDK's name); ``holder`` is what is known of it."""


class LockContention(ConflictError):
    """Another live lease holds the lock (409 ``lock_held``)."""


class OwnershipLost(ConflictError):
    """This holder no longer owns the lease: 409 ``lock_ownership_lost`` or loss detected by the keeper."""


class WaitTimeout(_HolderKnown):
    """A wait for a lock gave up after its timeout; ``holder`` is the last lock state it saw."""


class RateLimited(VolcanoError):
    """429 ``lock_rate_limited``: the project's 600-a-minute budget is spent; see ``retry_after``."""


class AuthError(VolcanoError):
    """401 (missing or invalid credentials) or 403 (not a service key, or no ``locks.manage``)."""


class InvalidRequest(VolcanoError, ValueError):
    """400 from the server, or client-side validation that failed before any request was sent."""


class Unavailable(VolcanoError):
    """503: the control plane backing locks is unavailable and lock operations fail closed."""


class ServerError(VolcanoError):
    """A 5xx response other than 503."""


class TransportError(VolcanoError):
    """No response: connection refused or dropped, or a timeout."""


class ProtocolError(VolcanoError):
    """A response that breaks the HTTP contract (wrong status, not JSON, missing or mistyped fields)."""
