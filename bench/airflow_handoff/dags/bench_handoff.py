"""DAGs of the Airflow handoff benchmark (bench/bench_airflow.py --only handoff); not examples.

Each DAG maps ``BENCH_HANDOFF_TASKS`` task instances that all want one resource, so they run one
at a time and hand it over. ``bench_handoff_lock`` serialises them with a Volcano lock (the
waiters deferred to the trigger), ``bench_handoff_pool`` with an Airflow pool of one slot. The
``bench_slow_handoff_*`` twins are the same DAGs, started by an executor that takes
``BENCH_SLOW_START_S`` seconds to start each of their tasks (slow_start_executor.py); the slow
lock DAG's TTL is ``BENCH_SLOW_TTL`` and its handoff allowance ``BENCH_SLOW_HANDOFF_TTL`` (default:
the operator's).

Every task appends ``{"dag", "i", "start", "end", "fencing_token", "first", "batch"}`` (wall clock) to the
JSON-lines file ``BENCH_HANDOFF_RECORDS``.

The long-hold and crash-takeover rows (issue 28) pass ``first_marker`` (a path) in the run's conf: the
first task whose body starts creates it and is the run's *first*: it holds ``first_hold`` seconds, and
with ``crash_first`` it writes its record and kills its own task process with SIGKILL instead of
ending (``end`` is then the kill), as a worker that dies mid-hold does.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG, Param

from airflow_provider_volcano import VolcanoLockOperator

TASKS = int(os.environ.get("BENCH_HANDOFF_TASKS", "6"))
POOL = os.environ.get("BENCH_HANDOFF_POOL", "bench_handoff_one")


def _record(
    dag_id: str, i: int, start: float, lease: dict[str, Any] | None, first: bool = False, batch: str = ""
) -> None:
    line = json.dumps(
        {
            "dag": dag_id,
            "i": i,
            "start": start,
            "end": time.time(),
            "fencing_token": None if lease is None else lease["fencing_token"],
            "first": first,
            "batch": batch,  # the run's first_marker: rows that share a DAG tell their records apart
        }
    )
    # One short O_APPEND write per task: lines from concurrent tasks never interleave.
    with open(os.environ["BENCH_HANDOFF_RECORDS"], "a", encoding="utf-8") as out:
        out.write(line + "\n")


def _is_first(marker: str) -> bool:
    """Whether this task's body started first in its run (it creates ``marker``; no marker: never)."""
    if not marker:
        return False
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def _work(dag_id: str, i: int, hold: Any, first: dict[str, Any], lease: dict[str, Any] | None) -> None:
    start = time.time()
    marker = str(first.get("first_marker") or "")
    is_first = _is_first(marker)
    time.sleep(float(first["first_hold"]) if is_first and first.get("first_hold") else float(hold))
    _record(dag_id, int(i), start, lease, is_first, marker)
    if is_first and str(first.get("crash_first")) == "True":
        os.kill(os.getpid(), signal.SIGKILL)  # the task process dies mid-hold: no release, no renewal


def _lock_work(dag_id: str) -> Callable[..., None]:
    def work(i: int, hold: float, volcano_lease: dict[str, Any], **first: Any) -> None:
        _work(dag_id, i, hold, first, volcano_lease)

    return work


def _pool_work(dag_id: str) -> Callable[..., None]:
    def work(i: int, hold: float, **first: Any) -> None:
        _work(dag_id, i, hold, first, None)

    return work


FIRST_PARAMS: dict[str, Any] = {
    "first_marker": Param("", type="string"),
    "first_hold": Param(0.0, type="number"),
    "crash_first": Param(False, type="boolean"),
}
FIRST_KWARGS = {name: "{{ params.%s }}" % name for name in FIRST_PARAMS}  # noqa: UP031


for slow in ("", "slow_"):
    ttl = int(os.environ.get("BENCH_SLOW_TTL" if slow else "BENCH_HANDOFF_TTL", "10"))
    # The operator's handoff allowance (handoff_ttl) unless the bench sets one for the slow DAG.
    allowance = os.environ.get("BENCH_SLOW_HANDOFF_TTL") if slow else None
    extra: dict[str, Any] = {"handoff_ttl": int(allowance)} if allowance else {}
    with DAG(
        dag_id=f"bench_{slow}handoff_lock",
        schedule=None,
        start_date=datetime(2026, 1, 1),
        catchup=False,
        params={
            "lock_key": Param("bench-handoff", type="string"),
            "hold": Param(4.0, type="number"),
            **FIRST_PARAMS,
        },
        tags=["volcano", "bench"],
    ):
        VolcanoLockOperator.partial(
            task_id="hold",
            lock_key="{{ params.lock_key }}",
            ttl=ttl,
            on_contention="wait",
            deferrable=True,
            wait_timeout=900,
            python_callable=_lock_work(f"bench_{slow}handoff_lock"),
            **extra,
        ).expand(op_kwargs=[{"i": i, "hold": "{{ params.hold }}", **FIRST_KWARGS} for i in range(TASKS)])

    with DAG(
        dag_id=f"bench_{slow}handoff_pool",
        schedule=None,
        start_date=datetime(2026, 1, 1),
        catchup=False,
        params={"hold": Param(4.0, type="number"), **FIRST_PARAMS},
        tags=["volcano", "bench"],
    ):
        PythonOperator.partial(
            task_id="hold",
            pool=POOL,
            python_callable=_pool_work(f"bench_{slow}handoff_pool"),
        ).expand(op_kwargs=[{"i": i, "hold": "{{ params.hold }}", **FIRST_KWARGS} for i in range(TASKS)])
