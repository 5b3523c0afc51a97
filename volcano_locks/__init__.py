"""Volcano project locks: the shared core client, lease keeper and local server.

The clients, their guards and the SDK's front door are imported when first used (PEP 562), so
importing the package for its validators, models and errors (an Airflow DAG file being parsed, a
Prefect flow being loaded) does not import httpx.

Example:
    >>> from volcano_locks import VolcanoLocks                         # doctest: +SKIP
    >>> with VolcanoLocks() as locks, locks.with_lock("daily-rollup", ttl=30) as guard:
    ...     write_rollup(fencing_token=guard.fencing_token)
"""

import typing as _typing

from volcano_locks import errors as _errors
from volcano_locks.__about__ import __version__ as __version__
from volcano_locks._lazy import lazy_names as _lazy_names
from volcano_locks.errors import *  # noqa: F403  (the exception tree; errors.__all__ is its one list)
from volcano_locks.models import LeaseFacts as LeaseFacts
from volcano_locks.models import LeaseRef as LeaseRef
from volcano_locks.models import LockLease as LockLease
from volcano_locks.models import LockState as LockState
from volcano_locks.protocol import validate_key as validate_key
from volcano_locks.protocol import validate_ttl as validate_ttl
from volcano_locks.protocol import validate_wait_timeout as validate_wait_timeout

if _typing.TYPE_CHECKING:
    from volcano_locks.client import AsyncVolcanoLocks as AsyncVolcanoLocks
    from volcano_locks.client import VolcanoLocks as VolcanoLocks
    from volcano_locks.guard import AsyncLockGuard as AsyncLockGuard
    from volcano_locks.guard import LockGuard as LockGuard
    from volcano_locks.sdk import AsyncVolcanoClient as AsyncVolcanoClient
    from volcano_locks.sdk import VolcanoClient as VolcanoClient

_LAZY = {
    "AsyncLockGuard": "volcano_locks.guard",
    "AsyncVolcanoClient": "volcano_locks.sdk",
    "AsyncVolcanoLocks": "volcano_locks.client",
    "LockGuard": "volcano_locks.guard",
    "VolcanoClient": "volcano_locks.sdk",
    "VolcanoLocks": "volcano_locks.client",
}
"""The names whose modules import httpx (or the clients'), loaded on first access."""

__all__ = sorted(
    [
        *_errors.__all__,
        *_LAZY,
        "LeaseFacts",
        "LeaseRef",
        "LockLease",
        "LockState",
        "validate_key",
        "validate_ttl",
        "validate_wait_timeout",
    ]
)


if not _typing.TYPE_CHECKING:  # the type checker sees the imports above; a misspelt name stays an error
    __getattr__ = _lazy_names(__name__, _LAZY, globals())

    def __dir__() -> list[str]:
        return sorted({*globals(), *_LAZY})
