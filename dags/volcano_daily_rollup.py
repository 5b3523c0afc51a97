"""Leader-only daily rollup: whichever worker gets the lock computes the day; the others skip.

Run it on several schedulers/deployments at once: only the lock holder writes, and its write goes
through a fencing check, so a holder that lost its lease can never overwrite a newer rollup.
"""

from __future__ import annotations

import hashlib
import time

import pendulum
from airflow.sdk import DAG, Param

from airflow_provider_volcano import VolcanoLockOperator
from volcano_locks.fencing import FencedTable


def rollup(day: str, volcano_lease: dict, run_id: str, hold_seconds: float = 0.0) -> dict:
    """Compute the day's rollup and store it through the fencing check."""
    value = f"rollup {day}: {hashlib.sha256(day.encode()).hexdigest()[:12]}"
    FencedTable.from_env().write_or_raise(
        f"rollup:{day}", volcano_lease["lock_key"], volcano_lease["fencing_token"], value, writer=run_id
    )
    time.sleep(float(hold_seconds))  # a real rollup takes a while; the lock is held throughout
    return {"day": day, "fencing_token": volcano_lease["fencing_token"]}


with DAG(
    dag_id="volcano_daily_rollup",
    schedule="@daily",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    params={
        "lock_key": Param("daily-rollup", type="string"),
        "hold_seconds": Param(0, type="number", minimum=0),
    },
    tags=["volcano", "example"],
) as dag:
    VolcanoLockOperator(
        task_id="rollup",
        lock_key="{{ params.lock_key }}",
        on_contention="skip",
        ttl=30,
        python_callable=rollup,
        op_kwargs={"day": "{{ ds }}", "hold_seconds": "{{ params.hold_seconds }}"},
    )
