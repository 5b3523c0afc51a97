"""Prefect integration for Volcano project locks: a `VolcanoCredentials` block, `locked_task`, `locked_flow`.

Registered through the `prefect.collections` entry point, so Prefect imports this module at
startup and `prefect block register -m prefect_volcano` registers the block type.
"""

from prefect_volcano._context import current_lease
from prefect_volcano._events import LOCK_EVENTS, LOCK_RESOURCE_PREFIX, lock_resource_id
from prefect_volcano._report import is_skipped
from prefect_volcano.credentials import VolcanoCredentials
from prefect_volcano.locked import SKIPPED_STATE_NAME, locked_flow, locked_task
from prefect_volcano.results import LeaseInfo, LockedResult

__all__ = [
    "LOCK_EVENTS",
    "LOCK_RESOURCE_PREFIX",
    "SKIPPED_STATE_NAME",
    "LeaseInfo",
    "LockedResult",
    "VolcanoCredentials",
    "current_lease",
    "is_skipped",
    "lock_resource_id",
    "locked_flow",
    "locked_task",
]
