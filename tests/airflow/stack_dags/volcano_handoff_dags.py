"""DAGs only the handoff full-stack tests run (tests/airflow/test_handoff_stack.py), not examples.

``volcano_handoff``: a deferrable lock task whose every start, resumes included, runs a
``pre_execute`` hook that fails while the file named by ``params.break_file`` exists: a resumed try
that fails before its body. The body holds the lock ``params.seconds`` seconds.
"""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, Param

from airflow_provider_volcano.operators.lock import VolcanoLockOperator
from tests.airflow.stack_dags.parts import WAITS_DEFERRED


def _break_when_flagged(context: Any) -> None:
    flag = context["params"]["break_file"]
    if flag and Path(flag).exists():
        raise RuntimeError(f"this try fails before its body ({flag} exists)")


def _hold(seconds: float, volcano_lease: dict[str, Any]) -> int:
    time.sleep(float(seconds))
    return int(volcano_lease["fencing_token"])


with DAG(
    dag_id="volcano_handoff",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    params={
        "lock_key": Param("handoff", type="string"),
        "seconds": Param(2.0, type="number"),
        "break_file": Param("", type="string"),
    },
):
    VolcanoLockOperator(
        task_id="hold",
        ttl=10,
        pre_execute=_break_when_flagged,
        python_callable=_hold,
        op_kwargs={"seconds": "{{ params.seconds }}"},
        **WAITS_DEFERRED,
    )
