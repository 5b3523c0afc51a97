"""Extract, load and swap under one lease: a Volcano lock held across a task group.

The group's acquire task (a setup) takes the lock, waiting deferred in the triggerer while another
run holds it; ``load`` and ``swap`` run under that same lease (one fencing token) and renew it while
they run; the release task (a teardown) gives it back after ``swap``, also when a task failed. A
second run of this DAG (or another deployment) therefore never interleaves its load and swap with
this one's, and a run that lost the lock cannot overwrite a newer one: every write is fenced.
"""

from __future__ import annotations

import time

import pendulum
from airflow.sdk import Param, dag, task
from airflow.sdk.definitions.taskgroup import TaskGroup

from airflow_provider_volcano.operators.group import VolcanoLockGroup
from volcano_locks.fencing import FencedTable


def _maybe_fail(step: str, fail_at: str) -> None:
    if step == fail_at:
        raise RuntimeError(f"{step} failed on purpose (params.fail_at)")


@dag(
    dag_id="volcano_warehouse_swap",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    params={
        "lock_key": Param("warehouse-swap", type="string"),
        "table": Param("orders", type="string"),
        "steps": Param(2, type="integer", minimum=1),
        "step_seconds": Param(0.0, type="number", minimum=0),
        "fail_at": Param("", type="string"),  # "load" or "swap": shows the release after a failure
    },
    tags=["volcano", "example"],
)
def volcano_warehouse_swap() -> None:
    """Rebuild a table in staging and swap it live, alone across the fleet, under one lease."""
    with (
        TaskGroup("rebuild"),
        VolcanoLockGroup(
            lock_key="{{ params.lock_key }}", ttl=60, deferrable=True, wait_timeout=900, poll_interval=1.0
        ) as lock,
    ):

        @task
        def extract(lease: dict, params: dict | None = None) -> list[int]:
            # Any task can read the group's fencing token from the acquire task's XCom.
            assert params is not None
            print(f"extracting for {params['table']} under fencing token {lease['fencing_token']}")
            time.sleep(float(params["step_seconds"]))
            return [3, 1, 4, 1, 5, 9, 2, 6]

        @task.volcano_lock(lock_group=lock)
        def load(
            rows: list[int],
            volcano_lease: dict | None = None,
            params: dict | None = None,
            run_id: str | None = None,
        ) -> int:
            assert volcano_lease is not None and params is not None and run_id is not None
            table = FencedTable.from_env()
            for step in range(int(params["steps"])):
                time.sleep(float(params["step_seconds"]))
                table.write_or_raise(
                    f"staging:{params['table']}",
                    volcano_lease["lock_key"],
                    volcano_lease["fencing_token"],
                    f"{run_id} load {step + 1}: {sum(rows)}",
                    writer=run_id,
                )
            _maybe_fail("load", params["fail_at"])
            return sum(rows)

        @task.volcano_lock(lock_group=lock)
        def swap(
            total: int,
            volcano_lease: dict | None = None,
            params: dict | None = None,
            run_id: str | None = None,
        ) -> int:
            assert volcano_lease is not None and params is not None and run_id is not None
            _maybe_fail("swap", params["fail_at"])
            FencedTable.from_env().write_or_raise(
                f"live:{params['table']}",
                volcano_lease["lock_key"],
                volcano_lease["fencing_token"],
                f"{run_id} swap: {total}",
                writer=run_id,
            )
            return int(volcano_lease["fencing_token"])

        swap(load(extract(lock.lease)))


volcano_warehouse_swap()
