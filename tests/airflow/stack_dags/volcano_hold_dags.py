"""DAGs only the hold tests run (tests/airflow/test_hold.py), not examples.

``volcano_hold_member``: a lock group (ttl 6 s, renewed about every 2 s) with one member, ``write``,
that appends a line with the time (``time.monotonic()``) to ``params.trace`` every 50 ms for
``params.seconds`` seconds: a body that keeps writing unless something stops it.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from airflow.sdk import DAG, Param, task

from airflow_provider_volcano.operators.group import VolcanoLockGroup

with (
    DAG(
        dag_id="volcano_hold_member",
        schedule=None,
        start_date=datetime(2026, 1, 1),
        params={
            "lock_key": Param("hold-member", type="string"),
            "trace": Param("", type="string"),
            "seconds": Param(12.0, type="number"),
        },
    ),
    VolcanoLockGroup(lock_key="{{ params.lock_key }}", ttl=6, task_id="hold") as lock,
):

    @task.volcano_lock(lock_group=lock)
    def write(params: dict[str, Any] | None = None) -> str:
        assert params is not None
        end = time.monotonic() + float(params["seconds"])
        with open(params["trace"], "a", encoding="utf-8") as trace:
            while time.monotonic() < end:
                trace.write(f"{time.monotonic()}\n")
                trace.flush()
                time.sleep(0.05)
        return "finished"

    write()
