"""DAGs only the seal full-stack tests run (tests/airflow/test_seal_stack.py), not examples.

All use the connection ``volcano_seal``, which the tests create (and rotate) through the REST API.
Every lock body appends its interval (wall clock, fencing token) to ``params.intervals``:

* ``volcano_seal_group``: a lock group whose members ``first`` and ``second`` hold it
  ``params.first_seconds`` and ``params.second_seconds`` seconds (``first`` also writes when it starts,
  and then holds on until the file ``params.hold_until`` exists, if one is named);
* ``volcano_seal_waiter``: a deferrable lock task waiting for the same lock;
* ``volcano_seal_forger``: any task's code, writing Variable ``params.variable`` through the Task SDK.
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime
from typing import Any

from airflow.sdk import DAG, Param, Variable, task

from airflow_provider_volcano.operators.group import VolcanoLockGroup
from airflow_provider_volcano.operators.lock import VolcanoLockOperator
from tests.airflow.stack_dags.parts import WAITS_DEFERRED

CONN = "volcano_seal"


def _body(intervals: str, tag: str, seconds: str, volcano_lease: dict[str, Any], hold_until: str = "") -> int:
    fencing = int(volcano_lease["fencing_token"])
    with open(intervals, "a") as out:
        out.write(json.dumps({"tag": tag, "started": time.time(), "fencing": fencing}) + "\n")
    start = time.time()
    time.sleep(float(seconds))
    # A test's gate: hold until it says so (a fixed body raced a waiter that started late on a busy machine).
    while hold_until and not os.path.exists(hold_until) and time.time() < start + 600:
        time.sleep(0.2)
    with open(intervals, "a") as out:
        out.write(json.dumps({"tag": tag, "start": start, "end": time.time(), "fencing": fencing}) + "\n")
    return fencing


def _params(**more: Param) -> dict[str, Param]:
    return {"lock_key": Param("seal", type="string"), "intervals": Param("", type="string"), **more}


with (
    DAG(
        dag_id="volcano_seal_group",
        schedule=None,
        start_date=datetime(2026, 1, 1),
        params=_params(
            first_seconds=Param(30.0, type="number"),
            second_seconds=Param(1.0, type="number"),
            hold_until=Param("", type="string"),
        ),
    ),
    VolcanoLockGroup(lock_key="{{ params.lock_key }}", ttl=20, volcano_conn_id=CONN) as lock,
):
    first, second = (
        VolcanoLockOperator(
            task_id=name,
            lock_group=lock,
            volcano_conn_id=CONN,
            python_callable=_body,
            op_kwargs={
                "intervals": "{{ params.intervals }}",
                "tag": "{{ run_id }}." + name,
                "seconds": f"{{{{ params.{name}_seconds }}}}",
                "hold_until": "{{ params.hold_until }}" if name == "first" else "",
            },
            retries=0,
        )
        for name in ("first", "second")
    )
    first >> second

with DAG(dag_id="volcano_seal_waiter", schedule=None, start_date=datetime(2026, 1, 1), params=_params()):
    VolcanoLockOperator(
        task_id="wait",
        ttl=10,
        volcano_conn_id=CONN,
        python_callable=_body,
        op_kwargs={"intervals": "{{ params.intervals }}", "tag": "{{ run_id }}.wait", "seconds": "1"},
        **WAITS_DEFERRED,
    )

with DAG(
    dag_id="volcano_seal_forger",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    params={"variable": Param("", type="string"), "value": Param("", type="string")},
):

    @task(retries=0)
    def forge(params: dict[str, Any] | None = None) -> None:
        """Any task's code may write any Variable: here, a handoff record naming another DAG's task."""
        assert params is not None
        Variable.set(params["variable"], params["value"])

    forge()
