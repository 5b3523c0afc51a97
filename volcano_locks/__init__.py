"""Volcano project locks: the shared core client, lease keeper and local server.

Example:
    >>> from volcano_locks import VolcanoLocks                         # doctest: +SKIP
    >>> with VolcanoLocks() as locks, locks.with_lock("daily-rollup", ttl=30) as guard:
    ...     write_rollup(fencing_token=guard.fencing_token)
"""

from volcano_locks.__about__ import __version__ as __version__
from volcano_locks.client import AsyncVolcanoLocks, VolcanoLocks
from volcano_locks.errors import (
    AuthError,
    ConflictError,
    ErrorCode,
    InvalidRequest,
    LockContention,
    OwnershipLost,
    ProtocolError,
    RateLimited,
    ServerError,
    TransportError,
    Unavailable,
    VolcanoError,
    WaitTimeout,
)
from volcano_locks.guard import AsyncLockGuard, LockGuard
from volcano_locks.models import LeaseFacts, LockLease, LockState
from volcano_locks.protocol import validate_key, validate_ttl, validate_wait_timeout
from volcano_locks.sdk import AsyncVolcanoClient, VolcanoClient

__all__ = [
    "AsyncLockGuard",
    "AsyncVolcanoClient",
    "AsyncVolcanoLocks",
    "AuthError",
    "ConflictError",
    "ErrorCode",
    "InvalidRequest",
    "LeaseFacts",
    "LockContention",
    "LockGuard",
    "LockLease",
    "LockState",
    "OwnershipLost",
    "ProtocolError",
    "RateLimited",
    "ServerError",
    "TransportError",
    "Unavailable",
    "VolcanoClient",
    "VolcanoError",
    "VolcanoLocks",
    "WaitTimeout",
    "validate_key",
    "validate_ttl",
    "validate_wait_timeout",
]
