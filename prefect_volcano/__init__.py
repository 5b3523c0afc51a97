"""Prefect integration for Volcano project locks: a `VolcanoCredentials` block, `locked_task`, `locked_flow`.

Registered through the `prefect.collections` entry point, so Prefect imports this module at
startup and `prefect block register -m prefect_volcano` registers the block type.
"""

from prefect_volcano._board import ARTIFACT_KEY_PREFIX, artifact_key
from prefect_volcano._context import current_lease, current_once
from prefect_volcano._events import LOCK_EVENTS, LOCK_RESOURCE_PREFIX, lock_resource_id
from prefect_volcano._report import DUPLICATE_TAG, SKIPPED_MESSAGE_PREFIX, SKIPPED_TAG, is_skipped
from prefect_volcano.credentials import VolcanoCredentials
from prefect_volcano.locked import SKIPPED_STATE_NAME, locked_flow, locked_task
from prefect_volcano.results import LeaseInfo, LockedResult
from prefect_volcano.views import refresh_lock_view
from volcano_locks import __version__ as __version__

__all__ = [
    "ARTIFACT_KEY_PREFIX",
    "DUPLICATE_TAG",
    "LOCK_EVENTS",
    "LOCK_RESOURCE_PREFIX",
    "SKIPPED_MESSAGE_PREFIX",
    "SKIPPED_STATE_NAME",
    "SKIPPED_TAG",
    "LeaseInfo",
    "LockedResult",
    "VolcanoCredentials",
    "artifact_key",
    "current_lease",
    "current_once",
    "is_skipped",
    "lock_resource_id",
    "locked_flow",
    "locked_task",
    "refresh_lock_view",
]
