"""A locked task's hold: every kind of locked task stops its body when its lease is lost.

The lease is real (the session's local server over loopback) and lost for real (an admin force
release, as the board or ``volcano-locks force-release`` sends it); the task runs in this process
through its operator's ``execute``.
"""

from __future__ import annotations

import shutil
import threading
import time
from typing import Any

import pytest

from airflow_provider_volcano.exceptions import VolcanoLockLost
from airflow_provider_volcano.operators.group import (
    GROUP_XCOM_KEY,
    VolcanoLockGroupAcquireOperator,
    VolcanoLockGroupReleaseOperator,
)
from airflow_provider_volcano.operators.lock import VolcanoLockOperator
from tests.airflow.helpers import STACK_DAGS, task_context, until

ACQUIRE = "g.volcano_lock_acquire"
TTL = 6  # the keeper renews about every 2 s: a loss is found within one renewal


def _lease_ops(volcano_conn, key: str, since: float) -> list[dict[str, Any]]:
    return [
        r
        for r in volcano_conn.requests()
        if r.get("path", "").endswith(f"/locks/{key}/lease") and (r.get("mono") or 0) >= since
    ]


def _force_release_once(outside, key: str, started: threading.Event, at: list[float]) -> threading.Thread:
    def run() -> None:
        started.wait(60)
        at.append(time.monotonic())
        outside.force_release(key)

    thread = threading.Thread(target=run, name="force-release", daemon=True)
    thread.start()
    return thread


def test_a_group_member_whose_lease_is_force_released_is_stopped_at_the_next_renewal(
    volcano_conn, outside, unique_key
) -> None:
    xcoms: dict[Any, Any] = {}
    acquire = VolcanoLockGroupAcquireOperator(task_id=ACQUIRE, lock_key=unique_key, ttl=TTL)
    fencing = acquire.execute(task_context(ACQUIRE, xcoms))["fencing_token"]
    assert xcoms[(ACQUIRE, GROUP_XCOM_KEY)]["fencing_token"] == fencing
    started, steps, forced_at = threading.Event(), [], []

    def body() -> str:
        started.set()
        for _ in range(40 * TTL):  # 2 TTLs of 50 ms steps: far past the loss if nothing stops it
            steps.append(time.monotonic())
            time.sleep(0.05)
        return "finished"

    member = VolcanoLockOperator(task_id="g.load", python_callable=body, lock_group=ACQUIRE)
    forcer = _force_release_once(outside, unique_key, started, forced_at)
    with pytest.raises(VolcanoLockLost) as info:
        member.execute(task_context("g.load", xcoms))
    forcer.join(10)
    message = str(info.value)
    assert (
        f"Lost ownership of the group's lock {unique_key!r} (fencing token {fencing}) while task 'g.load' ran"
        in message
    )
    assert "its body was stopped" in message and "lock_ownership_lost" in message, message
    assert volcano_conn.service_key not in message
    # The body was stopped by the first renewal after the loss (the keeper's next one, due a third of
    # the TTL after the last): the one refused renewal, then nothing more on the key from the member,
    # and no step of the body began after the refusal reached it (one step may have been under way).
    (force,) = forced_at
    after = _lease_ops(volcano_conn, unique_key, force)
    assert [(r["op"], r["status"]) for r in after] == [("renew", 409)], after
    refused = after[0]["mono_end"] or after[0]["mono"]
    assert len([t for t in steps if t > refused]) <= 1, (refused, steps[-3:])
    assert len(steps) < 40 * TTL
    print(f"member stopped {steps[-1] - force:.2f} s after the force release (ttl {TTL} s)")
    VolcanoLockGroupReleaseOperator(task_id="g.volcano_lock_release", acquire_task_id=ACQUIRE).execute(
        task_context("g.volcano_lock_release", xcoms)
    )
    until("the lock stays free", lambda: not outside.get(unique_key).held, 5)


def test_a_group_member_in_a_dag_run_is_stopped_when_its_lease_is_force_released(
    volcano_conn, outside, unique_key, tmp_path, capfd, airflow_db
) -> None:
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import sync_bag_to_db

    from tests.airflow.versions import bundle_dag_bag

    trace = tmp_path / "trace.txt"
    folder = tmp_path / "dags"
    folder.mkdir()
    shutil.copy(STACK_DAGS / "volcano_hold_dags.py", folder)
    bag = bundle_dag_bag(folder)
    # Stored as the dag processor would store it (under the configured bundle): dag.test() runs that.
    DagBundlesManager().sync_bundles_to_db()
    sync_bag_to_db(bag, "dags-folder", None)
    dag = bag.get_dag("volcano_hold_member")
    forced_at: list[float] = []

    def force_release_once_writing() -> None:
        until("the member writes", lambda: trace.exists() and trace.stat().st_size > 0, 600)
        forced_at.append(time.monotonic())
        outside.force_release(unique_key)

    forcer = threading.Thread(target=force_release_once_writing, name="force-release", daemon=True)
    forcer.start()
    dr = dag.test(run_conf={"lock_key": unique_key, "trace": str(trace), "seconds": 4.0 * TTL})
    forcer.join(10)
    states = _states(dr)
    assert states == {"hold_acquire": "success", "write": "failed", "hold_release": "success"}, states
    (force,) = forced_at
    after = _lease_ops(volcano_conn, unique_key, force)
    assert [(r["op"], r["status"]) for r in after][:1] == [("renew", 409)], after
    refused = after[0]["mono_end"] or after[0]["mono"]
    lines = [float(line) for line in trace.read_text().split()]
    assert len([t for t in lines if t > refused]) <= 1, (refused, lines[-3:])
    out = capfd.readouterr()
    assert "its body was stopped" in out.out + out.err
    print(f"member stopped {lines[-1] - force:.2f} s after the force release (ttl {TTL} s)")


def _states(dag_run: Any) -> dict[str, str]:
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        tis = session.query(TaskInstance).filter_by(dag_id=dag_run.dag_id, run_id=dag_run.run_id)
        return {ti.task_id: str(ti.state) for ti in tis}
