"""A local Volcano-compatible project-locks server: the contract's rules over SQLite or PostgreSQL."""

from .clock import Clock, ManualClock, system_clock
from .errors import ApiError, StoreUnavailable
from .harness import InProcessServer, LocalServer
from .service import LockService

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
