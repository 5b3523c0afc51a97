"""The provider's task failures: a lock lost while the task ran, and a lock held by another owner."""

from __future__ import annotations

from airflow.sdk.exceptions import AirflowException

__all__ = ["VolcanoLockContended", "VolcanoLockLost"]


class VolcanoLockLost(AirflowException):
    """The task lost ownership of its Volcano lock while the callable ran."""


class VolcanoLockContended(AirflowException):
    """The lock was held by another owner (``on_contention="fail"``, or the wait timed out)."""
