"""The one exception tree of volcano-locks.

::

    VolcanoError                      every failure; .status .code .request_id .retry_after
     ├── LockContention               409 lock_held: another live lease owns the lock   (alias ConflictError)
     │    ├── OwnershipLost           409 lock_ownership_lost, or loss detected locally by the lease keeper
     │    └── WaitTimeout             wait_acquire ran out of time; .holder is the last state seen
     ├── RateLimited                  429 lock_rate_limited; .retry_after in seconds
     ├── AuthError                    401 / 403
     ├── InvalidRequest (ValueError)  400, and client-side validation before any request
     ├── Unavailable                  503: the locks control plane fails closed
     ├── ServerError                  any other 5xx
     ├── TransportError               no response at all (connect, timeout, dropped connection)
     └── ProtocolError                a response breaking the contract (not JSON, missing or mistyped fields)

Messages never contain a service key or an ownership token. httpx exceptions become
:class:`TransportError` in exactly one place, :func:`translate_transport_errors`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import httpx

if TYPE_CHECKING:
    from volcano_locks.models import LockState

__all__ = [
    "AuthError",
    "ConflictError",
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
    "translate_transport_errors",
]


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


class LockContention(VolcanoError):
    """Another live lease holds the lock (409 ``lock_held``); ``holder`` is what the server said of it."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        request_id: str | None = None,
        retry_after: float | None = None,
        holder: LockState | None = None,
    ) -> None:
        super().__init__(message, status=status, code=code, request_id=request_id, retry_after=retry_after)
        self.holder = holder


class OwnershipLost(LockContention):
    """This holder no longer owns the lease: 409 ``lock_ownership_lost`` or loss detected by the keeper."""


class WaitTimeout(LockContention):
    """``wait_acquire`` gave up after its timeout; ``holder`` is the last lock state it saw."""


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


ConflictError = LockContention
"""The Volcano Python SDK's name for :class:`LockContention`."""


@contextmanager
def translate_transport_errors(op: str, request_id: str) -> Iterator[None]:
    """Turn httpx's transport exceptions raised inside the block into :class:`TransportError`."""
    try:
        yield
    except httpx.TimeoutException as exc:
        raise TransportError(f"{op} timed out ({type(exc).__name__})", request_id=request_id) from exc
    except httpx.TransportError as exc:
        raise TransportError(f"{op} got no response ({type(exc).__name__})", request_id=request_id) from exc
    except httpx.StreamError as exc:
        raise TransportError(
            f"{op} response stream failed ({type(exc).__name__})", request_id=request_id
        ) from exc
