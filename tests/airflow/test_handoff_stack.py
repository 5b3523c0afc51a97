"""A lease taken for a task ends when the task can no longer use it: real Airflow processes.

One stack (api-server with the public REST API and the simple auth manager, dag processor, scheduler
with LocalExecutor, triggerer) on SQLite serves three scenarios. In each, two runs of
``volcano_handoff`` wait deferred for a lock the test holds; the test releases it, one run's trigger
acquires it for the handoff (``handoff_ttl`` 300 s) and then that run can no longer use it:

* marked failed through the REST API while it is ``scheduled`` (the scheduler is stopped with SIGSTOP
  so the task cannot resume: the handoff is caught exactly between the trigger's acquisition and the
  resume);
* cleared through the REST API in the same window (its next try then runs too);
* its resumed try fails before its body (a ``pre_execute`` hook that raises).

Each time the stranded lease is freed within ``BOUND`` seconds of the moment the owner could no longer
use it (not the 300 s of ``handoff_ttl``), by the other run's trigger or, after an action through the
REST API, by the API server (whichever is first says so in its log), and the other run runs.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time
import urllib.error
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_volcano._handoff import LOOK_EVERY
from tests.airflow.helpers import (
    STACK_DAGS,
    STACK_HANG_BOUND,
    Stack,
    VolcanoConn,
    dag_stack,
    deferred_and_waiting,
    until,
)
from volcano_locks import VolcanoLocks

pytestmark = [pytest.mark.slow, STACK_HANG_BOUND]

DAG_ID = "volcano_handoff"
USER, PASSWORD = "ops", "handoff-test-password"
BOUND = LOOK_EVERY + 10.0
"""Seconds from "the owner can no longer use its handoff" to the next waiter's lease: one look at the
handoff record (every 5 s), the owner's state, the release, the woken acquire, plus slack for a
two-core machine shared with other test runs."""
MEASURED: dict[str, float] = {}


@pytest.fixture(scope="module")
def stack(airflow_db: Path, session_conn: VolcanoConn, tmp_path_factory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("handoff")
    dags = [STACK_DAGS / "volcano_handoff_dags.py"]
    with dag_stack(airflow_db, session_conn, root, dags, [DAG_ID], users={USER: ("admin", PASSWORD)}) as s:
        yield s
    if MEASURED:
        print("handoff freed after (s):", json.dumps({k: round(v, 2) for k, v in MEASURED.items()}))


def _token(stack: Stack) -> str:
    return str(stack.rest("POST", "/auth/token", {"username": USER, "password": PASSWORD})["access_token"])


def _ti_state(stack: Stack, run_id: str) -> tuple[str | None, int]:
    rows = stack.query(
        "SELECT state, try_number FROM task_instance WHERE dag_id = ? AND run_id = ?", DAG_ID, run_id
    )
    return (rows[0][0], int(rows[0][1])) if rows else (None, 0)


def _two_waiters(  # type: ignore[type-arg]
    stack: Stack, outside: VolcanoLocks, key: str, tag: str, break_file: str = "", seconds: float = 2.0
) -> tuple:
    """The test holds ``key``; run ``<tag>_w`` defers first, then ``<tag>_c``, each to hold ``seconds``.

    Returns (lease, runs).
    """
    # Long enough that a slow set-up (two runs deferring on a loaded machine) never lets it lapse first.
    held = outside.acquire(key, 600)
    first, second = f"{tag}_w", f"{tag}_c"
    for run_id, flag in ((first, break_file), (second, "")):
        conf = json.dumps({"lock_key": key, "seconds": seconds, "break_file": flag})
        stack.cli("dags", "trigger", DAG_ID, "--run-id", run_id, "--conf", conf)
        # Deferred, the scheduler has processed the deferring exit (a resume before that is Airflow's race,
        # the README's Known limits, not what these tests are about), and its trigger is running in the
        # triggerer (first come, first served on the key).
        deferred_and_waiting(stack, DAG_ID, run_id, key)
    return held, (first, second)


def _holder(outside: VolcanoLocks, key: str) -> int | None:
    state = outside.get(key)
    return state.fencing_token if state.held else None


def _finish(stack: Stack, run_ids: tuple[str, ...], timeout: float = 240) -> dict[str, str]:
    def done() -> dict[str, str] | None:
        states = dict(stack.query("SELECT run_id, state FROM dag_run WHERE dag_id = ?", DAG_ID))
        ours = {r: states.get(r) for r in run_ids}
        return ours if all(s in ("success", "failed") for s in ours.values()) else None  # type: ignore[return-value]

    return until(f"{run_ids} finished", done, timeout, stack=stack)


def _stop_between_writes(stack: Stack) -> None:
    """SIGSTOP the scheduler at a moment it holds no lock on the SQLite metadata database.

    Stopped inside a transaction it would block every other process's writes: the triggerer could not
    record its event and the dag processor exits with "database is locked". So: stop it, try to take the
    database exclusively for a moment, and if that fails let it run on briefly and try again.
    """
    scheduler = stack.procs["scheduler"]
    for _ in range(100):
        os.killpg(scheduler.pid, signal.SIGSTOP)
        db = sqlite3.connect(stack.home / "airflow.db", timeout=2, isolation_level=None)
        try:
            db.execute("BEGIN EXCLUSIVE")
            db.execute("ROLLBACK")
            return
        except sqlite3.OperationalError:
            os.killpg(scheduler.pid, signal.SIGCONT)
            time.sleep(0.2)
        finally:
            db.close()
    raise AssertionError("the scheduler never left the metadata database unlocked")


def _at_the_handoff(stack: Stack, outside: VolcanoLocks, key: str, held, runs) -> tuple[str, str, int]:  # type: ignore[no-untyped-def]
    """Stop the scheduler, release the test's lease: a trigger takes it, its run stays scheduled."""
    _stop_between_writes(stack)
    outside.release(key, held)
    # Not ``stack=stack``: the scheduler is stopped on purpose.
    fencing = until("the trigger's acquisition", lambda: _holder(outside, key), 60)
    owner = until(
        "the handoff (a scheduled run)",
        lambda: next((r for r in runs if _ti_state(stack, r)[0] == "scheduled"), None),
        60,
    )
    other = next(r for r in runs if r != owner)
    return owner, other, fencing


def _freed(outside: VolcanoLocks, key: str, fencing: int, since: float) -> float:
    """Seconds from ``since`` until the lock is held by a newer lease than ``fencing``."""
    until(
        "the next waiter's lease", lambda: (_holder(outside, key) or 0) > fencing, 120
    )  # scheduler may be stopped
    return time.monotonic() - since


def _released_line(stack: Stack, run_id: str, key: str, fencing: int, reason: str) -> None:
    """The line of whoever freed the handoff: the waiter (its task log) or, after a user's action through
    the REST API, the API server (``plugins/actions.py``), whichever was first."""
    line = f"Released lock {key!r} (fencing token {fencing}): it was held for the handoff to {DAG_ID}.hold"
    freed_by = [text for text in (stack.logs(run_id), stack.output("api-server")) if line in text]
    assert freed_by and reason in freed_by[0], (stack.logs(run_id) + stack.output("api-server"))[-3000:]


def test_marked_failed_at_the_handoff_the_next_waiter_runs_within_seconds(
    stack: Stack, volcano_conn, outside: VolcanoLocks, unique_key: str
) -> None:
    held, runs = _two_waiters(stack, outside, unique_key, "failed")
    scheduler = stack.procs["scheduler"]
    try:
        owner, other, fencing = _at_the_handoff(stack, outside, unique_key, held, runs)
        # The handoff record, as the REST API shows it: whose handoff, which lease, nothing secret.
        token = _token(stack)
        variable = stack.rest("GET", f"/api/v2/variables/volcano_lock_handoff:{unique_key}", token=token)
        record = json.loads(variable["value"])
        assert record["fencing_token"] == fencing and record["owner"]["run_id"] == owner, record
        assert volcano_conn.service_key not in variable["value"]
        stack.rest(
            "PATCH",
            f"/api/v2/dags/{DAG_ID}/dagRuns/{owner}/taskInstances/hold",
            {"new_state": "failed"},
            token=token,
        )
        assert _ti_state(stack, owner)[0] == "failed"
        took = _freed(outside, unique_key, fencing, time.monotonic())
    finally:
        os.killpg(scheduler.pid, signal.SIGCONT)
    MEASURED["marked failed"] = took
    assert took < BOUND, took
    assert _finish(stack, runs) == {owner: "failed", other: "success"}
    _released_line(stack, other, unique_key, fencing, "(its task instance is failed)")


def test_cleared_at_the_handoff_the_next_waiter_and_the_cleared_task_both_run(
    stack: Stack, outside: VolcanoLocks, unique_key: str
) -> None:
    # The cleared task's next try defers behind the other run: that run holds 20 s, so the scheduler has
    # processed the deferring exit long before the try resumes (Airflow's race: the README's Known limits).
    held, runs = _two_waiters(stack, outside, unique_key, "cleared", seconds=20.0)
    scheduler = stack.procs["scheduler"]
    try:
        owner, other, fencing = _at_the_handoff(stack, outside, unique_key, held, runs)
        stack.rest(
            "POST",
            f"/api/v2/dags/{DAG_ID}/clearTaskInstances",
            {"dag_run_id": owner, "task_ids": ["hold"], "dry_run": False, "only_failed": False},
            token=_token(stack),
        )
        took = _freed(outside, unique_key, fencing, time.monotonic())
    finally:
        os.killpg(scheduler.pid, signal.SIGCONT)
    MEASURED["cleared"] = took
    assert took < BOUND, took
    # The cleared task's next try runs too (after the other run), under a newer lease.
    assert _finish(stack, runs) == dict.fromkeys(runs, "success"), stack.report(*runs)
    assert _ti_state(stack, owner)[1] == 2
    _released_line(stack, other, unique_key, fencing, "(its task instance was cleared)")
    assert not outside.get(unique_key).held
    # No record outlives its handoff: the freed one was deleted, the later ones by their resumed tasks.
    with pytest.raises(urllib.error.HTTPError) as missing:
        stack.rest("GET", f"/api/v2/variables/volcano_lock_handoff:{unique_key}", token=_token(stack))
    assert missing.value.code == 404


def test_a_resumed_try_that_fails_before_its_body_frees_its_handoff(
    stack: Stack, outside: VolcanoLocks, unique_key: str, tmp_path: Path
) -> None:
    flag = tmp_path / "break"
    held, runs = _two_waiters(stack, outside, unique_key, "prebody", break_file=str(flag))
    owner, other = runs
    flag.write_text("the resumed try of the first run fails in pre_execute")
    outside.release(unique_key, held)
    fencing = until("the trigger's acquisition", lambda: _holder(outside, unique_key), 60, stack=stack)
    until(f"{owner} failed", lambda: _ti_state(stack, owner)[0] == "failed", 120, stack=stack)
    took = _freed(outside, unique_key, fencing, time.monotonic())
    MEASURED["resumed try failed before its body"] = took
    assert took < BOUND, took
    assert _finish(stack, runs) == {owner: "failed", other: "success"}
    assert "fails before its body" in stack.logs(owner)
    _released_line(stack, other, unique_key, fencing, "(its task instance is failed)")
