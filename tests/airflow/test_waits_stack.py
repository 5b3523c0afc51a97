"""Airflow waits that notice at once (issue 28), in real Airflow processes, with the real scheduler running.

One stack (api-server with the REST API, dag processor, scheduler with LocalExecutor, triggerer) on
SQLite and the session's local lock server:

* **a line behind a long hold**: a task holds the lock ``LONG`` seconds while ``LINE`` runs wait
  deferred; for each handoff the test prints release -> the trigger's acquisition -> the resumed
  task's own acquisition (its body starts right after), and the Volcano requests a minute on the key
  during the long hold. The triggers see the release through the holder's task state (Airflow), not
  by looking at the lock every second.
* **user actions at the handoff**: a run of ``volcano_waits_gated`` (pool ``waits_gate``) defers, the
  pool is set to no slots, and the test releases its lease: the run's trigger acquires for it and the
  run cannot resume (``scheduled``). Then it is marked failed or cleared through the REST API, and the
  lease is freed within ``FREED_BOUND`` (the issue's 10 s) with the gate still closed: by the API server
  that took the action (``plugins/actions.py``), or by a waiter already deferred if its watch is first.
  With no waiter deferred nothing else runs, so it must be the API server.

``PICKUP_BOUND`` is only a hang catcher; the figures the issue asks for are printed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.airflow.helpers import STACK_DAGS, Stack, VolcanoConn, dag_stack, deferred_and_waiting, until
from volcano_locks import LockLease, VolcanoLocks

pytestmark = pytest.mark.slow

LINE_DAG, GATED_DAG = "volcano_handoff", "volcano_waits_gated"
GATE = "waits_gate"
USER, PASSWORD = "ops", "waits-test-password"
LONG = 90.0
"""Seconds the first task of the line holds the lock (the issue: 45-90 s)."""
LINE = 2
PICKUP_BOUND = 10.0
"""Release -> the next trigger's acquisition, at most (aim: about 1 s; a hang catcher here)."""
FREED_BOUND = 10.0
"""A user's action at the handoff -> the lease freed, at most (the issue's aim)."""
WAITERS_A_MINUTE_BEFORE = 13 / 1.5
"""The line's own Volcano requests a minute on the key during the long hold before issue 28's work (4
acquisitions and 9 reads in the 90 s hold, beside 27 renewals: 26.6 a minute in all). The line may
spend no more; the holder's renewals are its keeper's (below)."""
RENEWALS_A_MINUTE = 205 / 10 + 1
"""The holder's renewals a minute, at most: a locked Airflow task renews at 84-92 % of a third of its
TTL (10 s here; ``volcano_locks.renewal.STOP_REACH``, issue 27), about ``205 / ttl`` a minute."""
MEASURED: dict[str, float] = {}


@pytest.fixture(scope="module")
def stack(airflow_db: Path, session_conn: VolcanoConn, tmp_path_factory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("waits")
    dags = [STACK_DAGS / "volcano_handoff_dags.py", STACK_DAGS / "volcano_waits_dags.py"]
    users = {USER: ("admin", PASSWORD)}
    # A task's start calls the Execution API: on a loaded two-core machine 5 s (the default) was not
    # always enough, and the task failed before it ran (httpx.ReadTimeout in the executor).
    slow_api = {"AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "30"}
    ids = [LINE_DAG, GATED_DAG]
    with dag_stack(airflow_db, session_conn, root, dags, ids, users=users, extra_env=slow_api) as s:
        s.cli("pools", "set", GATE, "1", "the waits tests' gate")
        yield s
    if MEASURED:
        print("waits (s):", json.dumps({k: round(v, 2) for k, v in MEASURED.items()}))


def _token(stack: Stack) -> str:
    return str(stack.rest("POST", "/auth/token", {"username": USER, "password": PASSWORD})["access_token"])


def _state(stack: Stack, dag_id: str, run_id: str) -> str | None:
    rows = stack.query("SELECT state FROM task_instance WHERE dag_id = ? AND run_id = ?", dag_id, run_id)
    return rows[0][0] if rows else None


def _trigger(stack: Stack, dag_id: str, run_id: str, key: str, **params: object) -> None:
    stack.cli(
        "dags", "trigger", dag_id, "--run-id", run_id, "--conf", json.dumps({"lock_key": key, **params})
    )


def _deferred(stack: Stack, dag_id: str, run_id: str, key: str) -> None:
    deferred_and_waiting(stack, dag_id, run_id, key, timeout=300)  # Airflow's race: the README's Known limits


def _ops(conn: VolcanoConn, key: str, since: float = 0.0) -> list[dict[str, object]]:
    return [
        r
        for r in conn.requests()
        if str(r.get("path", "")).startswith(f"/locks/{key}") and float(r["time"]) >= since  # type: ignore[arg-type]
    ]


def _holder(outside: VolcanoLocks, key: str) -> int | None:
    state = outside.get(key)
    return state.fencing_token if state.held else None


@pytest.mark.timeout(1500)
def test_a_line_behind_a_long_hold_sees_each_release_at_once(
    stack: Stack, volcano_conn: VolcanoConn, unique_key: str
) -> None:
    runs = ["long"] + [f"line_{n}" for n in range(LINE)]
    _trigger(stack, LINE_DAG, runs[0], unique_key, seconds=LONG, break_file="")
    until("the long hold", lambda: "Holding lock" in stack.logs(runs[0]), 300, stack=stack)
    for run_id in runs[1:]:  # all at once: on a loaded machine each start takes tens of seconds
        _trigger(stack, LINE_DAG, run_id, unique_key, seconds=2.0, break_file="")
    for run_id in runs[1:]:
        _deferred(stack, LINE_DAG, run_id, unique_key)
    assert _state(stack, LINE_DAG, runs[0]) == "running", "the hold ended before the line deferred"
    until(
        "the line passed",
        lambda: all(_state(stack, LINE_DAG, r) in ("success", "failed") for r in runs),
        LONG + 600,
        stack=stack,
    )
    ended = {r: _state(stack, LINE_DAG, r) for r in runs}
    assert ended == dict.fromkeys(runs, "success"), stack.report(*runs)

    ops = sorted(_ops(volcano_conn, unique_key), key=lambda r: float(r["time"]))  # type: ignore[arg-type]
    releases = [r for r in ops if r["op"] == "release" and r["status"] == 204]
    pickups: list[float] = []
    for n, release in enumerate(releases[: len(runs) - 1]):
        at = float(release["time"])  # type: ignore[arg-type]
        taken = [
            r
            for r in ops
            if r["op"] == "acquire" and r["status"] == 201 and float(r["time"]) > at  # type: ignore[arg-type]
        ]
        trigger_at, body_at = float(taken[0]["time"]), float(taken[1]["time"])  # type: ignore[arg-type]
        pickups.append(trigger_at - at)
        print(
            f"handoff {n + 1}: release -> trigger acquires {trigger_at - at:.2f} s -> "
            f"task re-acquires, body starts {body_at - trigger_at:.2f} s "
            f"(release -> body {body_at - at:.2f} s)"
        )
        MEASURED[f"long-hold handoff {n + 1} release->trigger"] = trigger_at - at
        MEASURED[f"long-hold handoff {n + 1} release->body"] = body_at - at
    # The requests a minute on the key while the long hold lasted (after the line had deferred).
    first = next(r for r in ops if r["op"] == "acquire" and r["status"] == 201)
    hold_start = float(first["time"])  # type: ignore[arg-type]
    hold_end = float(releases[0]["time"])  # type: ignore[arg-type]
    during = [r for r in ops if hold_start < float(r["time"]) < hold_end]  # type: ignore[arg-type]
    minutes = max((hold_end - hold_start) / 60.0, 1e-9)
    by_op = {op: sum(1 for r in during if r["op"] == op) for op in sorted({str(r["op"]) for r in during})}
    rate = len(during) / minutes
    line = sum(n for op, n in by_op.items() if op != "renew") / minutes
    print(
        f"during the {hold_end - hold_start:.0f} s hold: {rate:.1f} requests a minute {by_op} "
        f"(the line's own: {line:.1f} a minute, before issue 28: {WAITERS_A_MINUTE_BEFORE:.1f})"
    )
    MEASURED["long-hold requests a minute"] = rate
    MEASURED["long-hold line's own requests a minute"] = line
    # Issue 28: the whole line costs no more than before. The waiters' looks are the part it changed
    # (a holder Airflow says runs is looked at once a minute; lines reuse the engine's look).
    assert line <= WAITERS_A_MINUTE_BEFORE, by_op
    assert by_op.get("renew", 0) / minutes <= RENEWALS_A_MINUTE, by_op
    assert len(pickups) == LINE and max(pickups) < PICKUP_BOUND, pickups


def _at_the_handoff(stack: Stack, outside: VolcanoLocks, key: str, run_id: str) -> LockLease:
    """``run_id`` of the gated DAG defers behind the test's lease, then gets it and cannot resume."""
    held = outside.acquire(key, 300)
    stack.cli("pools", "set", GATE, "1", "the waits tests' gate")
    _trigger(stack, GATED_DAG, run_id, key)
    _deferred(stack, GATED_DAG, run_id, key)
    stack.cli("pools", "set", GATE, "0", "the waits tests' gate, closed")
    return held


def _freed_after(stack: Stack, outside: VolcanoLocks, key: str, fencing: int, since: float) -> float:
    # Freed: the lease is no longer the live one (the next task may already have run and released).
    until("the lease freed", lambda: _holder(outside, key) != fencing, 180, stack=stack)
    return time.monotonic() - since


def _act(stack: Stack, action: str, run_id: str) -> None:
    if action == "mark failed":
        stack.rest(
            "PATCH",
            f"/api/v2/dags/{GATED_DAG}/dagRuns/{run_id}/taskInstances/hold",
            {"new_state": "failed"},
            token=_token(stack),
        )
    else:
        stack.rest(
            "POST",
            f"/api/v2/dags/{GATED_DAG}/clearTaskInstances",
            {"dag_run_id": run_id, "task_ids": ["hold"], "dry_run": False, "only_failed": False},
            token=_token(stack),
        )


@pytest.mark.timeout(900)
@pytest.mark.parametrize("waiter", ["deferred waiter", "no deferred waiter"])
@pytest.mark.parametrize("action", ["mark failed", "clear"])
def test_a_user_action_at_the_handoff_frees_the_lease_within_seconds(
    stack: Stack, outside: VolcanoLocks, unique_key: str, action: str, waiter: str
) -> None:
    tag = f"{action.replace(' ', '_')}_{'w' if waiter == 'deferred waiter' else 'n'}"
    owner, other = f"{tag}_owner", f"{tag}_next"
    held = _at_the_handoff(stack, outside, unique_key, owner)
    # After a clear the cleared task's next try and the waiter take turns: whoever goes second may defer
    # behind the first, so the first holds 20 s (Airflow's race: the README's Known limits).
    seconds = 20.0 if action == "clear" else 1.0
    if waiter == "deferred waiter":
        _trigger(stack, LINE_DAG, other, unique_key, seconds=seconds, break_file="")
        _deferred(stack, LINE_DAG, other, unique_key)
    outside.release(unique_key, held)
    fencing = until("the owner's trigger acquiring", lambda: _holder(outside, unique_key), 120, stack=stack)
    until(f"{owner} at the handoff", lambda: _state(stack, GATED_DAG, owner) == "scheduled", 120, stack=stack)
    time.sleep(3)  # it stays there: the gate is closed
    assert _state(stack, GATED_DAG, owner) == "scheduled" and _holder(outside, unique_key) == fencing
    acted = time.monotonic()
    _act(stack, action, owner)
    # The gate stays closed and, with no waiter deferred, nothing else runs: only the API server, which
    # took the action, can free the lease now (plugins/actions.py); a deferred waiter's watch may be first.
    took = _freed_after(stack, outside, unique_key, fencing, acted)
    MEASURED[f"{action}, {waiter}"] = took
    print(f"{action} at the handoff, {waiter}: freed {took:.2f} s after the action")
    assert took < FREED_BOUND, (took, stack.output("api-server")[-3000:])
    api_server = stack.output("api-server")
    if waiter == "no deferred waiter":
        assert "(after a user's action in the API server)" in api_server, api_server[-3000:]
    stack.cli("pools", "set", GATE, "1", "the waits tests' gate")
    if waiter == "no deferred waiter":
        if action == "clear":
            # The next try ends at once; the other run starts after it, so neither defers behind the
            # other's instant hold and resumes at once (Airflow's race: the README's Known limits).
            until(
                f"{owner}'s next try",
                lambda: _state(stack, GATED_DAG, owner) == "success",
                300,
                stack=stack,
            )
        _trigger(stack, LINE_DAG, other, unique_key, seconds=seconds, break_file="")
    until(f"{other} ran", lambda: _state(stack, LINE_DAG, other) == "success", 300, stack=stack)
    logs = stack.logs(other) + stack.logs(owner) + stack.output("api-server")
    assert f"it was held for the handoff to {GATED_DAG}.hold" in logs, logs[-3000:]
