"""A schema migration that waits its turn: runs deferred in the triggerer until the lock is free.

Two runs (or two deployments) started together apply their steps one after the other, never
interleaved; each step is written through the fencing check.
"""

from __future__ import annotations

import time

import pendulum
from airflow.sdk import DAG, Param

from airflow_provider_volcano import VolcanoLockOperator
from volcano_locks.fencing import FencedTable


def migrate(steps: int, step_seconds: float, resource: str, volcano_lease: dict, run_id: str) -> dict:
    """Apply ``steps`` migration steps, each a fenced write; the lease is renewed meanwhile."""
    table = FencedTable.from_env()
    for step in range(int(steps)):
        time.sleep(float(step_seconds))
        table.write_or_raise(
            resource,
            volcano_lease["lock_key"],
            volcano_lease["fencing_token"],
            f"{run_id} step {step + 1}",
            writer=run_id,
        )
    return {"steps": int(steps), "fencing_token": volcano_lease["fencing_token"]}


with DAG(
    dag_id="volcano_migration",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    params={
        "lock_key": Param("schema-migration", type="string"),
        "steps": Param(3, type="integer", minimum=0),
        "step_seconds": Param(0.5, type="number", minimum=0),
        "resource": Param("schema", type="string"),
    },
    tags=["volcano", "example"],
) as dag:
    VolcanoLockOperator(
        task_id="migrate",
        lock_key="{{ params.lock_key }}",
        on_contention="wait",
        deferrable=True,
        wait_timeout=600,
        ttl=10,
        python_callable=migrate,
        op_kwargs={
            "steps": "{{ params.steps }}",
            "step_seconds": "{{ params.step_seconds }}",
            "resource": "{{ params.resource }}",
        },
    )
