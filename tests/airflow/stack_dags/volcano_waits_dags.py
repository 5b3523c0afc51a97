"""A DAG only the waits full-stack tests run (tests/airflow/test_waits_stack.py), not an example.

``volcano_waits_gated``: the handoff DAG's lock task in the pool ``waits_gate``. A deferred task holds
no pool slot, so it defers while the pool has one; the test then sets the pool to none, and the task
a trigger acquires for cannot be queued: it stays ``scheduled``, at the handoff, with the real
scheduler running, for as long as the test needs to mark it failed or clear it.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG, Param

from airflow_provider_volcano.operators.lock import VolcanoLockOperator
from tests.airflow.stack_dags.parts import WAITS_DEFERRED

GATE = "waits_gate"

with DAG(
    dag_id="volcano_waits_gated",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    params={"lock_key": Param("waits", type="string")},
):
    VolcanoLockOperator(
        task_id="hold",
        ttl=10,
        python_callable=lambda: "ran",
        pool=GATE,
        **WAITS_DEFERRED,
    )
