"""A local Volcano-compatible project-locks server: the contract's rules over SQLite or PostgreSQL.

Its libraries come with the ``server`` extra (``pip install 'volcano-locks[server]'``); without them,
importing this package raises :class:`volcano_locks.extras.MissingExtra`, which names the extra.
"""

from volcano_locks.extras import require as _require

_require("server", "the local Volcano-compatible locks server")

from .clock import Clock, ManualClock, system_clock  # noqa: E402  (after the check, so a missing library is named)
from .errors import ApiError, StoreUnavailable  # noqa: E402
from .harness import InProcessServer, LocalServer  # noqa: E402
from .service import LockService  # noqa: E402

__all__ = [
    "ApiError",
    "Clock",
    "InProcessServer",
    "LocalServer",
    "LockService",
    "ManualClock",
    "StoreUnavailable",
    "system_clock",
]
