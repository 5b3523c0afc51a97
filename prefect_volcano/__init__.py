"""Prefect integration for Volcano project locks: the `VolcanoCredentials` block and `locked_task`.

Registered through the `prefect.collections` entry point, so Prefect imports this module at
startup and `prefect block register -m prefect_volcano` registers the block type.
"""

from prefect_volcano._context import current_lease
from prefect_volcano.credentials import VolcanoCredentials
from prefect_volcano.locked import SKIPPED_STATE_NAME, locked_task
from prefect_volcano.results import LeaseInfo, LockedResult

__all__ = [
    "SKIPPED_STATE_NAME",
    "LeaseInfo",
    "LockedResult",
    "VolcanoCredentials",
    "current_lease",
    "locked_task",
]
