"""The CeleryExecutor: kill -9 of a Celery worker's processes leaves no lock behind its orphaned task.

Real processes: api-server, dag processor, scheduler (CeleryExecutor), triggerer and two Celery workers
(``worker_a`` serves the queue ``volcano_a``, ``worker_b`` the queue ``volcano_b``), metadata on a
PostgreSQL database of the test's own, Redis (database 7) as broker and result backend. The holder runs
on ``worker_a``; a waiter on ``worker_b`` waits deferred. The test kills every process of ``worker_a``'s
tree but the task process (the worker and its pool child, the task's Task SDK supervisor) with SIGKILL:
the orphaned task notices its supervisor is gone, stops its body and gives up its lease (within its TTL
plus the server's grace second, in fact at once), the waiter runs, the holder's task log says why it
stopped, and Airflow's own view agrees (it fails the holder when its heartbeats stop).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.airflow.helpers import Stack, running_celery_stack, volcano_conn_json
from tests.support import pg_select
from volcano_locks import VolcanoLocks

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

STACK_DAGS = Path(__file__).resolve().parent / "stack_dags"
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
def celery(airflow_db: Path, volcano_server, volcano_keys, tmp_path_factory) -> Iterator[Stack]:
    if reason := _services_missing():  # skipped on a laptop without them; CI requires both
        pg_select.unavailable(reason, os.environ.get(pg_select.REQUIRE_ENV) == "1")
    service_key, anon_key = volcano_keys
    root = tmp_path_factory.mktemp("celery")
    dags = root / "dags"
    dags.mkdir()
    shutil.copy(STACK_DAGS / "volcano_celery_dags.py", dags)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(
            "AIRFLOW_CONN_VOLCANO_DEFAULT",
            volcano_conn_json(volcano_server.url, service_key, anon_key=anon_key),
        )
        with running_celery_stack(
            airflow_db, root, dags, {"worker_a": "volcano_a", "worker_b": "volcano_b"}
        ) as stack:
            for dag_id in (HOLDER, WAITER):
                stack.unpause_when_parsed(dag_id, timeout=240)
            yield stack


@pytest.fixture
def outside(volcano_conn) -> Iterator[VolcanoLocks]:
    with VolcanoLocks(volcano_conn.url, volcano_conn.anon_key, volcano_conn.service_key) as client:
        yield client


def _until(stack: Stack | None, what: str, check, timeout: float):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        if stack is not None:
            stack.alive()
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _ti_state(stack: Stack, dag_id: str, run_id: str) -> str | None:
    rows = stack.query("SELECT state FROM task_instance WHERE dag_id = ? AND run_id = ?", dag_id, run_id)
    return rows[0][0] if rows else None


def test_kill_9_of_the_celery_worker_ends_the_orphaned_tasks_lease_and_the_waiter_runs(
    celery: Stack, volcano_conn, outside: VolcanoLocks, unique_key: str, tmp_path: Path
) -> None:
    state_file = tmp_path / "holder.state"
    conf = {"lock_key": unique_key, "state_file": str(state_file)}
    celery.cli("dags", "trigger", HOLDER, "--run-id", "holder", "--conf", json.dumps(conf))
    _until(celery, "the holder's lock", lambda: state_file.exists() and state_file.read_text().strip(), 240)
    task_pid, supervisor_pid, fencing = (int(x) for x in state_file.read_text().split())
    worker = psutil.Process(celery.procs["worker_a"].pid)
    tree = [worker, *worker.children(recursive=True)]
    assert task_pid in {p.pid for p in tree} and supervisor_pid in {p.pid for p in tree}

    celery.cli(
        "dags", "trigger", WAITER, "--run-id", "waiter", "--conf", json.dumps({"lock_key": unique_key})
    )
    _until(celery, "the waiter deferred", lambda: _ti_state(celery, WAITER, "waiter") == "deferred", 240)

    # kill -9 of every process of worker_a but the task process: the worker and its pool child (the
    # task's supervisor). The task process is in a process group of its own and survives it.
    victims = [p for p in tree if p.pid != task_pid]
    killed = time.monotonic()
    for p in victims:
        os.kill(p.pid, signal.SIGKILL)
    celery.procs.pop("worker_a").wait(10)  # gone on purpose: the stack's liveness checks skip it
    psutil.wait_procs(victims, timeout=10)

    took = _until(
        None, "the waiter's lease", lambda: (outside.get(unique_key).fencing_token or 0) > fencing, 60
    )
    freed = time.monotonic() - killed
    assert took and freed < TTL + GRACE, freed
    print(f"lease of the orphaned task freed {freed:.2f} s after kill -9 of its worker")
    _until(celery, "the waiter's success", lambda: _ti_state(celery, WAITER, "waiter") == "success", 180)
    _until(
        None,
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
    _until(celery, "Airflow failing the holder", lambda: _ti_state(celery, HOLDER, "holder") == "failed", 180)
    # The server's log: the orphan released its lease (once), then the waiter took the lock.
    ops = [
        (r["op"], r["status"])
        for r in volcano_conn.requests()
        if r.get("path", "").endswith(f"/locks/{unique_key}/lease")
    ]
    assert ("release", 204) in ops, ops
