"""A task process under a stand-in supervisor, for tests/airflow/test_supervision.py.

``python supervised_task.py supervisor <key> <mode> <state_file>`` starts the "task" (this file with
``task``) as its child in a session of its own, as Airflow's supervisor forks a task that outlives it,
and sleeps. The task runs ``VolcanoLockOperator`` on ``<key>`` (ttl 5 s) with a body that either works in
short steps (``mode=steps``) or sits in one long C call (``mode=stuck``), and writes its pid, its parent's
pid and the fencing token to ``<state_file>`` once it holds the lock, and how it ended to
``<state_file>.ended``. Its stdout and stderr are pipes to the supervisor, as in Airflow.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any


def _task(key: str, mode: str, state_file: str) -> None:
    from airflow_provider_volcano.operators.lock import VolcanoLockOperator

    def body(volcano_lease: dict[str, Any]) -> None:
        Path(state_file).write_text(f"{os.getpid()} {os.getppid()} {volcano_lease['fencing_token']}")
        if mode == "stuck":
            time.sleep(120)  # one C call: an interrupt cannot land until it returns
        for _ in range(1200):
            time.sleep(0.1)

    ti = SimpleNamespace(
        dag_id="supervised",
        task_id="hold",
        run_id="manual__1",
        map_index=-1,
        try_number=1,
        xcom_push=lambda key, value: None,
    )
    op = VolcanoLockOperator(task_id="hold", lock_key=key, ttl=5, python_callable=body)
    try:
        op.execute({"ti": ti})  # type: ignore[arg-type]
    except BaseException as exc:
        # Not to stdout or stderr: they are pipes to the supervisor, which is dead by now.
        Path(state_file + ".ended").write_text(f"task ended: {type(exc).__name__}: {exc}")
        raise SystemExit(3) from None


def main() -> None:
    role, key, mode, state_file = sys.argv[1:5]
    if role == "task":
        _task(key, mode, state_file)
        return
    # The task's stdout and stderr are pipes this process reads, as Airflow's supervisor's are: once it
    # is killed, the task's writes to them fail (a broken pipe).
    task = subprocess.Popen(
        [sys.executable, __file__, "task", key, mode, state_file],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    assert task.stdout is not None
    with open(state_file + ".task.out", "wb") as out:
        for line in task.stdout:
            out.write(line)
            out.flush()
    time.sleep(600)


if __name__ == "__main__":
    main()
