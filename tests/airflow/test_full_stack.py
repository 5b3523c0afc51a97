"""Real Airflow processes (api-server, scheduler with LocalExecutor, dag processor, triggerer) on SQLite.

Two runs of the migration DAG contend for one key: one waits deferred in the triggerer while the
other runs, both succeed one after the other, the fenced table has no stale write, and neither
the service key nor any ownership token is in trigger rows, XCom rows, next_kwargs or task logs.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.airflow.helpers import Stack, owner_tokens, running_stack
from volcano_locks.fencing import FencedTable

pytestmark = pytest.mark.slow

DAG_ID = "volcano_migration"
STEPS = 12  # of 2 s each, per run


@pytest.fixture
def stack(airflow_db: Path, volcano_conn, tmp_path: Path) -> Iterator[Stack]:
    with running_stack(airflow_db, tmp_path) as s:
        yield s


def test_two_runs_contend_one_defers_both_succeed_nothing_secret_stored(
    stack: Stack, volcano_conn, unique_key
) -> None:
    resource = f"schema-{unique_key}"
    stack.unpause_when_parsed(DAG_ID, timeout=300)  # a hang catcher: parsing waits for a busy machine
    # Each run holds the lock ~24 s: the second run's start (two CLI triggers, a worker start) takes
    # well over ten seconds on a busy machine, and it must defer long before the first releases. A
    # shorter hold lets the trigger fire before the scheduler has
    # processed the executor's event for the deferring exit; Airflow 3.3.2's LocalExecutor then
    # forgets the resumed workload and the scheduler fails the running task (an Airflow race).
    conf = json.dumps({"lock_key": unique_key, "steps": STEPS, "step_seconds": 2.0, "resource": resource})
    for run_id in ("contend_a", "contend_b"):
        stack.cli("dags", "trigger", DAG_ID, "--run-id", run_id, "--conf", conf)

    trigger_rows: list[str] = []
    seen_deferred: set[str] = set()
    deadline = time.monotonic() + 240
    while True:
        stack.alive()
        for (run_id,) in stack.query(
            "SELECT run_id FROM task_instance WHERE dag_id = ? AND state = 'deferred'", DAG_ID
        ):
            seen_deferred.add(run_id)
        trigger_rows += [json.dumps(row, default=str) for row in stack.query("SELECT * FROM trigger")]
        states = dict(stack.query("SELECT run_id, state FROM dag_run WHERE dag_id = ?", DAG_ID))
        if len(states) == 2 and all(s in ("success", "failed") for s in states.values()):
            break
        assert time.monotonic() < deadline, f"runs did not finish: {states}"
        time.sleep(0.3)

    assert states == {"contend_a": "success", "contend_b": "success"}, stack.report("contend_a", "contend_b")
    assert len(seen_deferred) == 1, seen_deferred  # one waited in the triggerer while the other ran
    assert trigger_rows, "the waiting run's trigger row was never seen"

    # The fenced table: the runs' steps did not interleave, and no stale write landed.
    history = FencedTable(stack.env["VOLCANO_EXAMPLES_DB"]).history(resource)
    writes = [(w.fencing_token, w.value, w.accepted) for w in history]
    assert len(writes) == 2 * STEPS and all(accepted for _, _, accepted in writes)
    tokens = [t for t, _, _ in writes]
    assert tokens == sorted(tokens) and len(set(tokens)) == 2
    runs = [v.split(" step ")[0] for _, v, _ in writes]
    first, second = runs[:STEPS], runs[STEPS:]
    assert first == [first[0]] * STEPS and second == [second[0]] * STEPS and first[0] != second[0]
    assert second[0] in seen_deferred  # the deferred run went second, with the higher fencing token

    # Nothing secret in the metadata database or the task logs. The tokens are derived from the
    # owner nonces the runs logged (public), exactly as the operator and trigger derive them.
    rows = stack.query(
        "SELECT dag_id, task_id, run_id, map_index, try_number FROM task_instance WHERE dag_id = ?", DAG_ID
    )
    tokens = owner_tokens(volcano_conn.service_key, unique_key, rows, stack.logs())
    digests = {hashlib.sha256(t.encode()).hexdigest()[:12] for t in tokens}
    seen = {r["token_sha256"] for r in volcano_conn.requests() if unique_key in r.get("path", "")}
    assert len(seen - {None}) == 2 and seen - {None} <= digests  # two owners, both found
    secrets = {volcano_conn.service_key, volcano_conn.anon_key, *tokens}
    stored = {
        "trigger rows": "\n".join(
            trigger_rows + [json.dumps(r, default=str) for r in stack.query("SELECT * FROM trigger")]
        ),
        "xcom rows": json.dumps(stack.query("SELECT * FROM xcom"), default=str),
        "next_kwargs": json.dumps(
            stack.query("SELECT next_method, next_kwargs FROM task_instance")
            + stack.query("SELECT next_method, next_kwargs FROM task_instance_history"),
            default=str,
        ),
        "rendered fields": json.dumps(
            stack.query("SELECT * FROM rendered_task_instance_fields"), default=str
        ),
        "task logs": stack.logs(),
    }
    assert "volcano_lease" in stored["xcom rows"] and "fencing_token" in stored["xcom rows"]
    assert "deferring until it is free" in stored["task logs"]
    assert "Holding lock" in stored["task logs"]
    for where, text in stored.items():
        for secret in secrets:
            assert secret not in text, f"a secret leaked into {where}"
