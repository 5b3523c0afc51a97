"""The one wait engine, as a package: its parts are split out of :mod:`volcano_locks.waiting.flow` next."""

from __future__ import annotations

from volcano_locks.waiting.flow import (
    FLOOR,
    GRACE,
    JITTER,
    AsyncWaitClient,
    Contention,
    OnWaiting,
    SharedPolls,
    SyncWaitClient,
    WaitPolicy,
    async_wait_acquire,
    poll_delay,
    wait_acquire,
    wake,
)
from volcano_locks.waiting.flow import _Block as _Block
from volcano_locks.waiting.flow import _KeyWait as _KeyWait
from volcano_locks.waiting.flow import _Send as _Send
from volcano_locks.waiting.flow import _wait_flow as _wait_flow
from volcano_locks.waiting.flow import _Waiter as _Waiter

__all__ = [
    "FLOOR",
    "GRACE",
    "JITTER",
    "AsyncWaitClient",
    "Contention",
    "OnWaiting",
    "SharedPolls",
    "SyncWaitClient",
    "WaitPolicy",
    "async_wait_acquire",
    "poll_delay",
    "wait_acquire",
    "wake",
]
