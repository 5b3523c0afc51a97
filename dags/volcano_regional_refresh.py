"""Mapped fan-out: one task per region, each holding its own lock, templated per map index.

Another deployment refreshing the same region (the same map index of the same lock prefix) is skipped
while this one holds it; the other regions go on in parallel.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, Param

from airflow_provider_volcano import VolcanoLockOperator
from volcano_locks.fencing import FencedTable

REGIONS = ["eu", "us", "apac"]


def refresh(region: str, volcano_lease: dict, run_id: str) -> dict:
    """Refresh one region's data, fenced by that region's lease."""
    FencedTable.from_env().write_or_raise(
        f"region:{region}",
        volcano_lease["lock_key"],
        volcano_lease["fencing_token"],
        "refreshed",
        writer=run_id,
    )
    return {
        "region": region,
        "lock_key": volcano_lease["lock_key"],
        "fencing_token": volcano_lease["fencing_token"],
    }


with DAG(
    dag_id="volcano_regional_refresh",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    params={"lock_prefix": Param("refresh", type="string")},
    tags=["volcano", "example"],
) as dag:
    VolcanoLockOperator.partial(
        task_id="refresh",
        lock_key="{{ params.lock_prefix }}:{{ ti.map_index }}",
        ttl=15,
        on_contention="skip",
        python_callable=refresh,
    ).expand(op_kwargs=[{"region": region} for region in REGIONS])
