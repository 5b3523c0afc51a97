"""DAGs only the fleet full-stack tests run (tests/airflow/test_fleet_stack.py), not examples.

``volcano_slow_resume``: a task whose every start, resumes included, takes ``start_delay`` seconds
before its code runs (a ``pre_execute`` hook that sleeps: what a worker pod's start or a long queue
looks like from the lock's side, the time between the trigger's acquisition and the task's code).
With ``ttl=5`` and a start delay of 8 s, every resume is slower than the TTL; ``handoff_ttl=60``
lets the lease the trigger took wait for it. ``volcano_slow_resume_lapse`` is the same task with no
handoff allowance beyond its TTL, so its handoff lapses. ``volcano_sigterm`` holds a lock and writes
its process id to a file, for a test that sends that process a real SIGTERM.
"""

from __future__ import annotations

import os
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, Param

from airflow_provider_volcano.operators.lock import VolcanoLockOperator
from tests.airflow.stack_dags.parts import FAILS_WHEN_HELD, WAITS_DEFERRED, lock_params
from volcano_locks.fencing import FencedTable


def _slow_start(context: Any) -> None:
    time.sleep(float(context["params"]["start_delay"]))


def _fenced_steps(resource: str, steps: int, volcano_lease: dict, run_id: str) -> int:
    table = FencedTable.from_env()
    for step in range(int(steps)):
        time.sleep(1.0)
        table.write_or_raise(
            resource,
            volcano_lease["lock_key"],
            volcano_lease["fencing_token"],
            f"{run_id} step {step + 1}",
            writer=run_id,
        )
    return int(volcano_lease["fencing_token"])


def _hold_until_killed(pid_file: str, volcano_lease: dict) -> None:
    Path(pid_file).write_text(f"{os.getpid()} {volcano_lease['fencing_token']}")
    for _ in range(1200):  # short steps: the kill's interrupt lands between them
        time.sleep(0.1)
    raise AssertionError("never killed")


SLOW_PARAMS = {
    "lock_key": Param("fleet-slow", type="string"),
    "resource": Param("fleet-slow", type="string"),
    "steps": Param(2, type="integer"),
    "start_delay": Param(8.0, type="number"),
}

for dag_id, handoff_ttl in (("volcano_slow_resume", 60), ("volcano_slow_resume_lapse", 5)):
    with DAG(dag_id=dag_id, schedule=None, start_date=datetime(2026, 1, 1), params=SLOW_PARAMS):
        VolcanoLockOperator(
            task_id="hold",
            ttl=5,
            handoff_ttl=handoff_ttl,
            pre_execute=_slow_start,
            python_callable=_fenced_steps,
            op_kwargs={"resource": "{{ params.resource }}", "steps": "{{ params.steps }}"},
            **WAITS_DEFERRED,
        )

with DAG(
    dag_id="volcano_sigterm",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    params=lock_params("fleet-sigterm", "pid_file"),
):
    VolcanoLockOperator(
        task_id="hold",
        ttl=10,
        python_callable=_hold_until_killed,
        op_kwargs={"pid_file": "{{ params.pid_file }}"},
        **FAILS_WHEN_HELD,
    )
