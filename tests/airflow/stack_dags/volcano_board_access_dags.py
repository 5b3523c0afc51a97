"""DAGs only the lock board's access tests parse (tests/airflow/test_board_stack.py); they never run.

``board_a`` names the lock ``VOLCANO_BOARD_KEY_A`` and ``board_b`` the lock ``VOLCANO_BOARD_KEY_B``
(environment): a literal ``lock_key`` puts a lock on the board of whoever may read the DAG naming it.
"""

from __future__ import annotations

import os
from datetime import datetime

from airflow.sdk import DAG

from airflow_provider_volcano.operators.lock import VolcanoLockOperator


def _never() -> None:
    raise AssertionError("the access tests never run these DAGs")


for name in ("a", "b"):
    with DAG(dag_id=f"board_{name}", schedule=None, start_date=datetime(2026, 1, 1)):
        VolcanoLockOperator(
            task_id="hold",
            lock_key=os.environ.get(f"VOLCANO_BOARD_KEY_{name.upper()}", f"board-{name}"),
            ttl=30,
            python_callable=_never,
        )
