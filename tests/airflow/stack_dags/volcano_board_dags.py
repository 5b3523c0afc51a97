"""DAGs only the lock board's browser test runs (tests/airflow/test_ui_lock_board.py), not examples.

``board_holder`` holds the lock ``VOLCANO_BOARD_KEY`` (environment) for up to four minutes;
``board_waiter_deferred`` waits for it in the triggerer and ``board_waiter_slot`` in its worker slot.
``board_named`` never runs: its literal lock key is on the board because a parsed DAG names it.
``board_short`` holds the lock for two seconds; its runs, before the holder's, give the lock a history
and its waiters an expected start.
"""

from __future__ import annotations

import os
import time
from datetime import datetime

from airflow.sdk import DAG

from airflow_provider_volcano.operators.lock import VolcanoLockOperator

KEY = os.environ.get("VOLCANO_BOARD_KEY", "board-lock")


def _hold() -> None:
    # Ended by the force release the test does from the board. Short sleeps: the loss interrupts the
    # body between bytecodes, so a body inside one long C call would see it only when the call returns.
    for _ in range(240):
        time.sleep(1)


def _done() -> str:
    return "ran"


def _short() -> str:
    time.sleep(2)
    return "held"


with DAG(dag_id="board_holder", schedule=None, start_date=datetime(2026, 1, 1)):
    VolcanoLockOperator(task_id="hold", lock_key=KEY, ttl=6, python_callable=_hold, retries=0)

with DAG(dag_id="board_waiter_deferred", schedule=None, start_date=datetime(2026, 1, 1)):
    VolcanoLockOperator(
        task_id="wait", lock_key=KEY, ttl=6, python_callable=_done, deferrable=True, poll_interval=1.0
    )

with DAG(dag_id="board_waiter_slot", schedule=None, start_date=datetime(2026, 1, 1)):
    VolcanoLockOperator(
        task_id="wait", lock_key=KEY, ttl=6, python_callable=_done, deferrable=False, poll_interval=1.0
    )

with DAG(dag_id="board_named", schedule=None, start_date=datetime(2026, 1, 1)):
    VolcanoLockOperator(task_id="named", lock_key=f"{KEY}-named", ttl=6, python_callable=_done)

with DAG(dag_id="board_short", schedule=None, start_date=datetime(2026, 1, 1), max_active_runs=4):
    VolcanoLockOperator(
        task_id="short", lock_key=KEY, ttl=6, python_callable=_short, deferrable=False, poll_interval=1.0
    )
