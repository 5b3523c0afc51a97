"""DAGs only the Celery full-stack test runs (tests/airflow/test_celery_stack.py), not examples.

``volcano_celery_holder`` runs on the Celery queue ``volcano_a``: it holds a lock (ttl 10 s) and works
in short steps for two minutes, after writing its pid, its parent's pid (its Task SDK supervisor, a
Celery pool process) and the fencing token to ``params.state_file``. ``volcano_celery_waiter`` runs on
the queue ``volcano_b``: it waits for the same lock deferred in the triggerer and then returns its
fencing token.
"""

from __future__ import annotations

import os
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from airflow.sdk import DAG

from airflow_provider_volcano.operators.lock import VolcanoLockOperator
from tests.airflow.stack_dags.parts import FAILS_WHEN_HELD, WAITS_DEFERRED, lock_params

START = datetime(2026, 1, 1)


def _hold(state_file: str, volcano_lease: dict[str, Any]) -> None:
    Path(state_file).write_text(f"{os.getpid()} {os.getppid()} {volcano_lease['fencing_token']}")
    for _ in range(1200):
        time.sleep(0.1)


def _took(volcano_lease: dict[str, Any]) -> int:
    return int(volcano_lease["fencing_token"])


with DAG(
    dag_id="volcano_celery_holder",
    schedule=None,
    start_date=START,
    params=lock_params("celery", "state_file"),
):
    VolcanoLockOperator(
        task_id="hold",
        queue="volcano_a",
        ttl=10,
        python_callable=_hold,
        op_kwargs={"state_file": "{{ params.state_file }}"},
        **FAILS_WHEN_HELD,
    )

with DAG(dag_id="volcano_celery_waiter", schedule=None, start_date=START, params=lock_params("celery")):
    VolcanoLockOperator(task_id="wait", queue="volcano_b", ttl=10, python_callable=_took, **WAITS_DEFERRED)
