"""A task's first refusal frees a handoff stranded by a user action (issue 28), against the real server.

No trigger, no waiter in a slot, no scheduler: the next task of the line starting (or the cleared
try's own next start) looks at the lock's handoff record when the lock is refused, frees the lease if
its try can no longer use it, and acquires. The owner's task state is injected where a real Airflow
would answer (``test_waits_stack.py`` asks a real one).
"""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_volcano.operators.lock import VolcanoLockOperator
from tests.airflow.test_handoff import OWNER, _releases, _stranded
from tests.airflow.versions import TaskDeferred


def _ti(task_id: str, try_number: int = 1) -> Any:
    ti = type("TI", (), {"xcom_push": lambda self, key, value: None})()
    ti.dag_id, ti.task_id, ti.run_id, ti.map_index, ti.try_number = (
        "etl",
        task_id,
        "manual__1",
        -1,
        try_number,
    )
    return ti


def _op(key: str, task_id: str) -> VolcanoLockOperator:
    return VolcanoLockOperator(task_id=task_id, lock_key=key, python_callable=lambda: "ran", deferrable=True)


@pytest.mark.parametrize("state", ["failed", None, "up_for_retry"])  # marked failed, cleared, died
def test_the_next_task_frees_a_dead_handoff_at_its_first_refusal_instead_of_deferring(
    volcano_conn, outside, unique_key, monkeypatch, capfd, state: str | None
) -> None:
    _lease, token = _stranded(volcano_conn, outside, monkeypatch, unique_key, state)
    assert _op(unique_key, "next").execute({"ti": _ti("next")}) == "ran"  # no TaskDeferred: no wait
    assert _releases(volcano_conn, unique_key, token) == [204]
    out = capfd.readouterr()
    assert "which can no longer use it" in out.out + out.err
    assert not outside.get(unique_key).held  # the task released after its body


def test_the_cleared_tries_own_next_start_frees_its_predecessors_handoff(
    volcano_conn, outside, unique_key, monkeypatch
) -> None:
    # Airflow reports the task instance's state, which is the new try's: queued, not a dead state.
    _lease, token = _stranded(volcano_conn, outside, monkeypatch, unique_key, "queued")
    assert _op(unique_key, OWNER.task_id).execute({"ti": _ti(OWNER.task_id, try_number=2)}) == "ran"
    assert _releases(volcano_conn, unique_key, token) == [204]


def test_a_handoff_whose_try_may_still_resume_is_waited_for(
    volcano_conn, outside, unique_key, monkeypatch
) -> None:
    lease, token = _stranded(volcano_conn, outside, monkeypatch, unique_key, "queued")
    with pytest.raises(TaskDeferred):
        _op(unique_key, "next").execute({"ti": _ti("next")})
    assert _releases(volcano_conn, unique_key, token) == []
    assert outside.get(unique_key).fencing_token == lease.fencing_token
    outside.release(unique_key, lease)


def test_a_refusal_with_no_handoff_record_defers_as_before(volcano_conn, outside, unique_key) -> None:
    lease = outside.acquire(unique_key, 60)
    with pytest.raises(TaskDeferred):
        _op(unique_key, "next").execute({"ti": _ti("next")})
    assert outside.get(unique_key).fencing_token == lease.fencing_token
    outside.release(unique_key, lease)
