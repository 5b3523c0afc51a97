"""TaskFlow: extract, load while holding the lock, and hand the fencing token downstream via XCom."""

from __future__ import annotations

import pendulum
from airflow.sdk import Param, dag, task

from volcano_locks.fencing import FencedTable


@dag(
    dag_id="volcano_taskflow_pipeline",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    params={"lock_key": Param("warehouse-load", type="string")},
    tags=["volcano", "example"],
)
def volcano_taskflow_pipeline() -> None:
    """Extract rows, load them alone across the fleet, then verify what was stored."""

    @task
    def extract() -> list[int]:
        return [3, 1, 4, 1, 5]

    @task.volcano_lock(lock_key="{{ params.lock_key }}", ttl=15, on_contention="wait", deferrable=True)
    def load(rows: list[int], volcano_lease: dict | None = None) -> dict:
        assert volcano_lease is not None
        FencedTable.from_env().write_or_raise(
            "warehouse:totals", volcano_lease["lock_key"], volcano_lease["fencing_token"], str(sum(rows))
        )
        return {"rows": len(rows), "fencing_token": volcano_lease["fencing_token"]}

    @task
    def verify(loaded: dict) -> int:
        stored = FencedTable.from_env().read("warehouse:totals")
        # The downstream task sees the fencing token its upstream wrote with.
        assert stored is not None and stored.fencing_token >= loaded["fencing_token"], (stored, loaded)
        return loaded["fencing_token"]

    verify(load(extract()))


volcano_taskflow_pipeline()
