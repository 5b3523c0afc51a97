"""A LocalExecutor that starts some tasks slowly, to simulate a Celery queue or a Kubernetes pod start.

Used only by bench/bench_airflow.py (``--only handoff``): the scheduler is started with
``AIRFLOW__CORE__EXECUTOR=slow_start_executor.SlowStartLocalExecutor`` and this folder on
``PYTHONPATH``. A worker that picks up a task of a DAG whose id starts with ``BENCH_SLOW_PREFIX``
(default ``bench_slow_``) waits ``BENCH_SLOW_START_S`` seconds before it starts the task's
supervisor, holding its executor slot meanwhile, as a starting pod would. Every other task starts
as with LocalExecutor. Resumes of deferred tasks are task starts too, so they are slowed alike.
"""

from __future__ import annotations

import os
import time
from typing import Any

from airflow.executors.base_executor import BaseExecutor
from airflow.executors.local_executor import LocalExecutor

_run_workload = BaseExecutor.run_workload


def _slow_run_workload(workload: Any, **kwargs: Any) -> int:
    dag_id = str(getattr(getattr(workload, "ti", None), "dag_id", ""))
    if dag_id.startswith(os.environ.get("BENCH_SLOW_PREFIX", "bench_slow_")):
        time.sleep(float(os.environ.get("BENCH_SLOW_START_S", "8")))
    return int(_run_workload(workload, **kwargs))


class SlowStartLocalExecutor(LocalExecutor):
    """LocalExecutor whose workers start the bench's slow DAGs' tasks ``BENCH_SLOW_START_S`` late."""

    def start(self) -> None:
        """Patch the workers' entry point (they are forked by ``start``), then start them."""
        # _run_worker calls BaseExecutor.run_workload by name; the forked workers see this patch.
        BaseExecutor.run_workload = staticmethod(_slow_run_workload)  # type: ignore[method-assign,assignment]
        super().start()
