"""The CeleryExecutor: kill -9 of a Celery worker's processes leaves no lock behind its orphaned task.

Real processes: api-server, dag processor, scheduler (CeleryExecutor), triggerer and two Celery workers
(``worker_a`` serves the queue ``volcano_a``, ``worker_b`` the queue ``volcano_b``), metadata on a
PostgreSQL database of the test's own, Redis (database 7) as broker and result backend. The holder runs
on ``worker_a``; a waiter on ``worker_b`` waits deferred. The test kills every process of ``worker_a``'s
tree but the task process (the worker and its pool child, the task's Task SDK supervisor) with SIGKILL:
the orphaned task notices its supervisor is gone, stops its body and gives up its lease (within its TTL
plus the server's grace second, in fact at once: the server's log says when), the waiter runs (at its
next look), the holder's task log says why it stopped, and Airflow's own view agrees (it fails the
holder when its heartbeats stop).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.airflow.helpers import (
    STACK_DAGS,
    STACK_HANG_BOUND,
    Stack,
    VolcanoConn,
    dag_stack,
    deferral_processed,
    until,
)
from tests.support import pg_select
from volcano_locks import VolcanoLocks

pytestmark = [pytest.mark.slow, pytest.mark.postgres, STACK_HANG_BOUND]

HOLDER, WAITER = "volcano_celery_holder", "volcano_celery_waiter"
TTL, GRACE = 10, 1.0  # the holder's ttl; the server's takeover grace


def _services_missing() -> str | None:
    """Why the stack cannot run here (its PostgreSQL metadata or its Redis broker does not answer)."""
    if problem := pg_select.connect_problem(pg_select.LOCAL_DSN):
        return f"the Celery stack needs PostgreSQL at 127.0.0.1:5432: {problem}"
    try:
        with socket.create_connection(("127.0.0.1", 6379), timeout=3) as conn:
            conn.sendall(b"PING\r\n")
            if not conn.recv(16).startswith(b"+PONG"):
                return "the Celery stack needs Redis at 127.0.0.1:6379: it did not answer PING"
    except OSError as exc:
        return f"the Celery stack needs Redis at 127.0.0.1:6379: {exc}"
    return None


@pytest.fixture(scope="module")
def celery(airflow_db: Path, session_conn: VolcanoConn, tmp_path_factory) -> Iterator[Stack]:
    if reason := _services_missing():  # skipped on a laptop without them; CI requires both
        pg_select.unavailable(reason, os.environ.get(pg_select.REQUIRE_ENV) == "1")
    with dag_stack(
        airflow_db,
        session_conn,
        tmp_path_factory.mktemp("celery"),
        [STACK_DAGS / "volcano_celery_dags.py"],
        [HOLDER, WAITER],
        celery_queues={"worker_a": "volcano_a", "worker_b": "volcano_b"},
        parse_timeout=240,
    ) as stack:
        yield stack


def _ti_state(stack: Stack, dag_id: str, run_id: str) -> str | None:
    rows = stack.query("SELECT state FROM task_instance WHERE dag_id = ? AND run_id = ?", dag_id, run_id)
    return rows[0][0] if rows else None


def test_kill_9_of_the_celery_worker_ends_the_orphaned_tasks_lease_and_the_waiter_runs(
    celery: Stack, volcano_conn, outside: VolcanoLocks, unique_key: str, tmp_path: Path
) -> None:
    state_file = tmp_path / "holder.state"
    conf = {"lock_key": unique_key, "state_file": str(state_file)}
    celery.cli("dags", "trigger", HOLDER, "--run-id", "holder", "--conf", json.dumps(conf))
    until(
        "the holder's lock", lambda: state_file.exists() and state_file.read_text().strip(), 240, stack=celery
    )
    task_pid, supervisor_pid, fencing = (int(x) for x in state_file.read_text().split())
    worker = psutil.Process(celery.procs["worker_a"].pid)
    tree = [worker, *worker.children(recursive=True)]
    assert task_pid in {p.pid for p in tree} and supervisor_pid in {p.pid for p in tree}

    celery.cli(
        "dags", "trigger", WAITER, "--run-id", "waiter", "--conf", json.dumps({"lock_key": unique_key})
    )
    until("the waiter deferred", lambda: _ti_state(celery, WAITER, "waiter") == "deferred", 240, stack=celery)
    # The kill frees the lock at once: the waiter's trigger must not fire before the scheduler processed
    # its deferring exit (Airflow's race, the README's Known limits).
    deferral_processed(celery, WAITER, "wait", "waiter", 240)

    # kill -9 of every process of worker_a but the task process: the worker and its pool child (the
    # task's supervisor). The task process is in a process group of its own and survives it.
    victims = [p for p in tree if p.pid != task_pid]
    killed = time.monotonic()
    for p in victims:
        os.kill(p.pid, signal.SIGKILL)
    celery.procs.pop("worker_a").wait(10)  # gone on purpose: the stack's liveness checks skip it
    psutil.wait_procs(victims, timeout=10)

    # The waiter sees the release at its next look: a deferred waiter of a renewing holder backs off up
    # to the wait policy's cap (20 s, jittered), since nothing announces releases to a trigger.
    took = until("the waiter's lease", lambda: (outside.get(unique_key).fencing_token or 0) > fencing, 60)
    noticed = time.monotonic() - killed
    # The server's log: the orphan released its lease (before the waiter took the lock).
    lease_ops = [
        r for r in volcano_conn.requests() if r.get("path", "").endswith(f"/locks/{unique_key}/lease")
    ]
    released = [r["mono"] for r in lease_ops if (r["op"], r["status"]) == ("release", 204)]
    assert took and released, [(r["op"], r["status"]) for r in lease_ops]
    freed = released[0] - killed  # the server's own reading of this machine's monotonic clock
    assert 0 < freed < TTL + GRACE, (freed, noticed)
    print(
        f"orphan's lease released {freed:.2f} s after kill -9 of its worker; the waiter's at {noticed:.2f} s"
    )
    until("the waiter's success", lambda: _ti_state(celery, WAITER, "waiter") == "success", 180, stack=celery)
    until(
        "the orphaned task process's end",
        lambda: (
            not psutil.pid_exists(task_pid) or (psutil.Process(task_pid).status() == psutil.STATUS_ZOMBIE)
        ),
        30,
    )

    # The holder's task log says why it stopped; Airflow, hearing no heartbeat, fails the task.
    logs = celery.logs("holder")
    assert f"The task's supervisor (pid {supervisor_pid}) is gone" in logs, logs[-3000:]
    assert f"gives up lock {unique_key!r} (fencing token {fencing})" in logs
    until(
        "Airflow failing the holder",
        lambda: _ti_state(celery, HOLDER, "holder") == "failed",
        180,
        stack=celery,
    )
