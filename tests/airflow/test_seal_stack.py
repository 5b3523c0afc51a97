"""Records anyone can write never free a live lease, and a key rotation strands nothing: real Airflow.

One stack (api-server with the public REST API and the simple auth manager, dag processor, scheduler
with LocalExecutor, triggerer) and the real local lock server. The DAGs (``volcano_seal_dags.py``) use
the connection ``volcano_seal``, created here through the REST API; every lock body appends its
interval to a file, and each test asserts that no two intervals overlap.

* A lock group's member holds the group's lease while a deferred waiter waits. A REST user writes the
  handoff record naming the group's acquire task (its real owner identity, nonce included, read from
  its XCom; the live fencing token; the key id of a genuine seal, the MAC guessed), then another DAG's
  task writes one through the Task SDK (unsealed). Neither releases the group's lease: the waiter runs
  after the group's release task, and the triggerer logs each refused record.
* The service key is rotated (the old key listed in ``previous_service_keys``) while a group's first
  member runs and a deferred waiter waits under the old key: the group's second member and release
  task run under the new key, and the waiter takes over the lease its trigger acquired (same fencing
  token) as soon as the group releases: not after its handoff allowance.
"""

from __future__ import annotations

import itertools
import json
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.airflow.helpers import STACK_DAGS, Stack, VolcanoConn, dag_stack, until
from volcano_locks import VolcanoLocks

pytestmark = pytest.mark.slow

CONN = "volcano_seal"
DAGS = ("volcano_seal_group", "volcano_seal_waiter", "volcano_seal_forger")
USER, PASSWORD = "ops", "seal-test-password"


@pytest.fixture(scope="module")
def stack(airflow_db: Path, session_conn: VolcanoConn, tmp_path_factory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("seal")
    dags = [STACK_DAGS / "volcano_seal_dags.py"]
    with dag_stack(airflow_db, session_conn, root, dags, DAGS, users={USER: ("admin", PASSWORD)}) as s:
        yield s


def _token(stack: Stack) -> str:
    return str(stack.rest("POST", "/auth/token", {"username": USER, "password": PASSWORD})["access_token"])


def _connection(stack: Stack, conn: VolcanoConn, key: str, previous: list[str] | None = None) -> None:
    """Create or rotate the DAGs' connection through the REST API (a stored connection, as in the UI)."""
    body = {
        "connection_id": CONN,
        "conn_type": "volcano",
        "host": conn.url,
        "password": key,
        "extra": json.dumps({} if previous is None else {"previous_service_keys": previous}),
    }
    token = _token(stack)
    try:
        stack.rest("PATCH", f"/api/v2/connections/{CONN}", body, token=token)
    except OSError:  # not there yet (urllib's HTTPError is an OSError)
        stack.rest("POST", "/api/v2/connections", body, token=token)


def _trigger(stack: Stack, dag_id: str, run_id: str, **conf: object) -> None:
    stack.cli("dags", "trigger", dag_id, "--run-id", run_id, "--conf", json.dumps(conf))


def _trigger_held_group(stack: Stack, run_id: str, key: str, intervals: Path, gate: Path) -> None:
    """A run of the group whose first member holds the lock until the test creates ``gate``."""
    _trigger(
        stack,
        "volcano_seal_group",
        run_id,
        lock_key=key,
        intervals=str(intervals),
        first_seconds=1,
        hold_until=str(gate),
    )


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _started(path: Path, tag: str) -> float | None:
    return next((e["started"] for e in _lines(path) if e["tag"] == tag and "started" in e), None)


def _intervals(path: Path) -> dict[str, dict[str, Any]]:
    return {e["tag"]: e for e in _lines(path) if "end" in e}


def _no_overlap(intervals: dict[str, dict[str, Any]]) -> None:
    ordered = sorted(intervals.values(), key=lambda e: e["start"])
    for a, b in itertools.pairwise(ordered):
        assert a["end"] <= b["start"], f"two bodies under one lock: {a} and {b}"


def _run_states(stack: Stack, *run_ids: str) -> dict[str, str | None]:
    rows = dict(
        stack.query(
            "SELECT run_id, state FROM dag_run WHERE run_id IN ({})".format(",".join("?" * len(run_ids))),
            *run_ids,
        )
    )
    return {r: rows.get(r) for r in run_ids}


def _finished(stack: Stack, *run_ids: str, timeout: float = 300) -> dict[str, str | None]:
    def done() -> dict[str, str | None] | None:
        states = _run_states(stack, *run_ids)
        return states if all(s in ("success", "failed") for s in states.values()) else None

    return until(f"{run_ids} finished", done, timeout, stack=stack)


def _waiting(stack: Stack, run_id: str, key: str) -> None:
    until(
        f"{run_id} waiting deferred",
        lambda: f"Still waiting for lock {key!r}" in stack.logs(run_id),
        stack=stack,
    )


def _group_xcom(stack: Stack, run_id: str) -> dict[str, Any]:
    path = (
        f"/api/v2/dags/volcano_seal_group/dagRuns/{urllib.parse.quote(run_id)}/taskInstances/"
        "volcano_lock_acquire/xcomEntries/volcano_lock_group?deserialize=true"
    )
    value = stack.rest("GET", path, token=_token(stack))["value"]
    return json.loads(value) if isinstance(value, str) else dict(value)


@pytest.mark.timeout(1200)  # the stack's start and three DAG runs on a busy two-core machine
def test_no_variable_anyone_writes_releases_a_groups_live_lease(
    stack: Stack, session_conn: VolcanoConn, outside: VolcanoLocks, unique_key: str, tmp_path: Path
) -> None:
    _connection(stack, session_conn, session_conn.service_key)
    intervals = tmp_path / "intervals.jsonl"
    group, waiter, forger = "seal_group", "seal_waiter", "seal_forger"
    gate = tmp_path / "attacked"  # the group's first member holds until both attacks were made
    _trigger_held_group(stack, group, unique_key, intervals, gate)
    until("the group's first member's body", lambda: _started(intervals, f"{group}.first"), stack=stack)
    _trigger(stack, "volcano_seal_waiter", waiter, lock_key=unique_key, intervals=str(intervals))
    _waiting(stack, waiter, unique_key)

    xcom = _group_xcom(stack, group)
    live = outside.get(unique_key)
    assert live.held and live.fencing_token == xcom["fencing_token"]
    facts = {
        "lock_key": unique_key,
        "fencing_token": live.fencing_token,
        "expires_at": live.expires_at.isoformat() if live.expires_at else None,
        "owner": xcom["owner"],  # the acquire task's real identity, nonce included
        "kind": "task",  # what would make a waiter decide on that (finished) task's state
        "release_task_id": None,
    }
    version, key_id, _mac = str(xcom["seal"]).split(".")
    variable = f"volcano_lock_handoff:{unique_key}"
    attacked_at = time.time()
    # 1. A REST user with Variable edit, the genuine key id copied, the MAC guessed.
    body = {"key": variable, "value": json.dumps({**facts, "seal": f"{version}.{key_id}.{'0' * 64}"})}
    stack.rest("POST", "/api/v2/variables", body, token=_token(stack))
    until(
        "the REST user's record refused",
        lambda: "does not match its facts" in stack.output("triggerer"),
        60,
        stack=stack,
    )
    # 2. Another DAG's task code, through the Task SDK, unsealed.
    _trigger(stack, "volcano_seal_forger", forger, variable=variable, value=json.dumps(facts))
    assert _finished(stack, forger, timeout=180) == {forger: "success"}
    until(
        "the task's record refused",
        lambda: "it carries no seal" in stack.output("triggerer"),
        60,
        stack=stack,
    )
    attacks_done = time.time()
    state = outside.get(unique_key)
    assert state.held and state.fencing_token == xcom["fencing_token"]  # still the group's lease
    gate.touch()

    assert _finished(stack, group, waiter, timeout=400) == {group: "success", waiter: "success"}
    spans = _intervals(intervals)
    assert set(spans) == {f"{group}.first", f"{group}.second", f"{waiter}.wait"}
    _no_overlap(spans)
    first = spans[f"{group}.first"]
    assert first["start"] <= attacked_at and attacks_done <= first["end"], (
        "the attacks ran while the member held"
    )
    assert spans[f"{waiter}.wait"]["fencing"] > xcom["fencing_token"]
    triggerer = stack.output("triggerer")
    assert f"Ignoring Variable {variable!r}" in triggerer
    assert session_conn.service_key not in triggerer + stack.logs(waiter) + stack.logs(group)


@pytest.mark.timeout(900)  # two DAG runs on a busy two-core machine
def test_a_key_rotation_mid_line_strands_no_waiter_and_fails_no_group(
    stack: Stack, session_conn: VolcanoConn, outside: VolcanoLocks, unique_key: str, tmp_path: Path
) -> None:
    old_key = session_conn.service_key
    new_key = str(session_conn.server.mint_key(ttl_seconds=86_400))
    _connection(stack, session_conn, old_key)
    intervals = tmp_path / "intervals.jsonl"
    group, waiter = "rotation_group", "rotation_waiter"
    gate = tmp_path / "rotated"  # the group's first member holds until the rotation is done
    _trigger_held_group(stack, group, unique_key, intervals, gate)
    until("the group's first member's body", lambda: _started(intervals, f"{group}.first"), stack=stack)
    _trigger(stack, "volcano_seal_waiter", waiter, lock_key=unique_key, intervals=str(intervals))
    _waiting(stack, waiter, unique_key)  # its trigger derived its token under the old key

    _connection(stack, session_conn, new_key, [old_key])  # the rotation, the old key listed
    rotated_at = time.time()
    gate.touch()
    assert _finished(stack, group, waiter, timeout=400) == {group: "success", waiter: "success"}
    spans = _intervals(intervals)
    _no_overlap(spans)
    assert spans[f"{group}.first"]["end"] >= rotated_at  # the rotation came while the group held
    assert spans[f"{group}.second"]["start"] > rotated_at  # a member that ran under the new key
    logs = stack.logs(waiter)
    assert "lapsed" not in logs, logs[-3000:]
    # The waiter ran under the very lease its trigger acquired under the old key.
    assert (
        f"Trigger acquired lock {unique_key!r} (fencing token {spans[f'{waiter}.wait']['fencing']})" in logs
    )
    assert old_key not in logs and new_key not in logs
