"""No supervisor, no lock: a task process whose supervisor died stops its body and gives up its lease.

Real processes: a stand-in supervisor starts a task process (in a session of its own, as Airflow's
supervisor's child outlives it) that holds a lock through ``VolcanoLockOperator`` on the real local
server; the test kills the supervisor with SIGKILL. The task's log file (Airflow's file task handler
path under ``[logging] base_log_folder``) then says why the task stopped.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

CHILD = Path(__file__).with_name("supervised_task.py")
LOG = Path("dag_id=supervised/run_id=manual__1/task_id=hold/attempt=1.log")


def _start(tmp_path: Path, key: str, mode: str) -> tuple[subprocess.Popen[bytes], Path]:
    state = tmp_path / "state"
    env = {**os.environ, "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(tmp_path / "logs")}
    # The supervisor creates the try's log file (Airflow's does, before it forks the task).
    (tmp_path / "logs" / LOG).parent.mkdir(parents=True)
    (tmp_path / "logs" / LOG).touch()
    supervisor = subprocess.Popen([sys.executable, str(CHILD), "supervisor", key, mode, str(state)], env=env)
    deadline = time.monotonic() + 60
    while not (state.exists() and state.read_text().strip()):
        assert supervisor.poll() is None and time.monotonic() < deadline, "the task never held the lock"
        time.sleep(0.1)
    return supervisor, state


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie until init reaps it: gone for our purpose.
    return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


def _lease_ops(volcano_conn, key: str) -> list[tuple[str, int]]:
    return [
        (r["op"], r["status"])
        for r in volcano_conn.requests()
        if r.get("path", "").endswith(f"/locks/{key}/lease")
    ]


def _log_lines(tmp_path: Path) -> list[str]:
    path = tmp_path / "logs" / LOG
    return [json.loads(line)["event"] for line in path.read_text().splitlines()] if path.exists() else []


def test_a_task_whose_supervisor_is_killed_stops_its_body_and_releases(
    volcano_conn, outside, unique_key, tmp_path
) -> None:
    supervisor, state = _start(tmp_path, unique_key, "steps")
    pid, parent, fencing = (int(x) for x in state.read_text().split())
    assert parent == supervisor.pid
    killed = time.monotonic()
    supervisor.kill()  # SIGKILL: no cleanup, as kill -9 of a Celery worker's pool child
    supervisor.wait(10)
    deadline = killed + 15
    while outside.get(unique_key).held:
        assert time.monotonic() < deadline, "the orphaned task kept the lock"
        time.sleep(0.1)
    freed = time.monotonic() - killed
    while not _gone(pid):
        assert time.monotonic() < deadline + 15, "the orphaned task process is still running"
        time.sleep(0.1)
    assert freed < 5, freed  # the parent is looked at every second; the body stops and releases
    assert _lease_ops(volcano_conn, unique_key)[-1] == ("release", 204)
    (line,) = [e for e in _log_lines(tmp_path) if "supervisor" in e]
    assert f"The task's supervisor (pid {parent}) is gone" in line
    assert f"gives up lock {unique_key!r} (fencing token {fencing})" in line
    # It ended on the interrupt: VolcanoLockLost, or a broken pipe where a log line after the release
    # was written to the dead supervisor's pipe (the release came first, as the server's log shows).
    ended = (tmp_path / "state.ended").read_text()
    assert "VolcanoLockLost: The task's supervisor is gone" in ended or "BrokenPipeError" in ended, ended


def test_a_body_that_cannot_be_interrupted_ends_the_process_and_the_lease_lapses(
    volcano_conn, outside, unique_key, tmp_path
) -> None:
    supervisor, state = _start(tmp_path, unique_key, "stuck")
    pid, _parent, _fencing = (int(x) for x in state.read_text().split())
    killed = time.monotonic()
    os.kill(supervisor.pid, signal.SIGKILL)
    supervisor.wait(10)
    while not _gone(pid):
        assert time.monotonic() < killed + 20, "the stuck task process was not ended"
        time.sleep(0.1)
    ended = time.monotonic() - killed
    assert ended < 1 + 5 + 3, ended  # one look at the parent, the 5 s grace, slack
    while outside.get(unique_key).held:
        # No renewal after the process ended: the lease lapses within its TTL (5 s) plus the grace second.
        assert time.monotonic() < killed + ended + 5 + 1 + 2, "the lease outlived its TTL"
        time.sleep(0.1)
    assert ("release", 204) not in _lease_ops(volcano_conn, unique_key)  # it lapsed: nobody released
    lines = _log_lines(tmp_path)
    assert any("did not stop within 5 s of the interrupt" in e for e in lines), lines
