"""What the stack DAGs' lock tasks share. Not a DAG file: the tests copy only the DAG files to a DAGs folder.

The DAG files import it as ``tests.airflow.stack_dags.parts``: every Airflow process of a stack has
the repository on its path (the editable install), and this folder is a package.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import Param

WAITS_DEFERRED: dict[str, Any] = {
    "lock_key": "{{ params.lock_key }}",
    "on_contention": "wait",
    "deferrable": True,
    "wait_timeout": 600,
    "poll_interval": 0.5,
    "retries": 0,
}
"""A task on ``params.lock_key`` that waits for it in the triggerer (up to ten minutes), never retried."""

FAILS_WHEN_HELD: dict[str, Any] = {"lock_key": "{{ params.lock_key }}", "on_contention": "fail", "retries": 0}
"""A task on ``params.lock_key`` that fails at once when the lock is held, never retried."""


def lock_params(lock_key: str, *paths: str) -> dict[str, Param]:
    """A DAG's params: ``lock_key`` (its default ``lock_key``) and a path param for each name in ``paths``."""
    return {"lock_key": Param(lock_key, type="string"), **{name: Param("", type="string") for name in paths}}
