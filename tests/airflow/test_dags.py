"""Every example DAG in dags/ runs with dag.test() against the local Volcano server."""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from volcano_locks import VolcanoLocks
from volcano_locks.fencing import FencedTable

DAGS = Path(__file__).resolve().parents[2] / "dags"
TESTED = {
    "volcano_daily_rollup",
    "volcano_migration",
    "volcano_regional_refresh",
    "volcano_taskflow_pipeline",
}


@pytest.fixture(scope="module")
def dagbag(airflow_db):
    # The bundle-aware bag puts dags/ on sys.path, as the dag processor and workers do.
    from airflow.dag_processing.dagbag import BundleDagBag

    return BundleDagBag(dag_folder=str(DAGS), bundle_path=DAGS, bundle_name="dags-folder")


@pytest.fixture
def examples_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    db = tmp_path / "examples.sqlite"
    monkeypatch.setenv("VOLCANO_EXAMPLES_DB", str(db))
    return db


@pytest.fixture
def outside(volcano_conn):
    with VolcanoLocks(volcano_conn.url, volcano_conn.anon_key, volcano_conn.service_key) as client:
        yield client


def _xcoms(dag_run: Any, task_id: str) -> dict[str, Any]:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.query(XComModel).filter_by(
            dag_id=dag_run.dag_id, run_id=dag_run.run_id, task_id=task_id
        )
        return {row.key: XComModel.deserialize_value(row) for row in rows}


def _states(dag_run: Any) -> dict[str, str]:
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        tis = session.query(TaskInstance).filter_by(dag_id=dag_run.dag_id, run_id=dag_run.run_id)
        return {ti.task_id: str(ti.state) for ti in tis}


def test_every_dag_in_dags_folder_loads_and_is_tested(dagbag) -> None:
    assert dagbag.import_errors == {}
    assert set(dagbag.dag_ids) == TESTED


def test_daily_rollup_writes_through_the_fence(dagbag, volcano_conn, examples_db, unique_key) -> None:
    dr = dagbag.get_dag("volcano_daily_rollup").test(run_conf={"lock_key": unique_key})
    assert dr.state == "success", _states(dr)
    lease = _xcoms(dr, "rollup")["volcano_lease"]
    assert lease["lock_key"] == unique_key
    writes = FencedTable.from_env().history(f"rollup:{dr.logical_date:%Y-%m-%d}")
    assert writes and writes[-1].fencing_token == lease["fencing_token"] and writes[-1].accepted
    assert writes[-1].writer == dr.run_id


def test_daily_rollup_skips_while_another_leader_holds_the_lock(
    dagbag, volcano_conn, outside, examples_db, unique_key
) -> None:
    held = outside.acquire(unique_key, 60)
    try:
        dr = dagbag.get_dag("volcano_daily_rollup").test(run_conf={"lock_key": unique_key})
    finally:
        outside.release(unique_key, held)
    assert _states(dr) == {"rollup": "skipped"}


def test_migration_defers_while_held_from_outside_and_resumes_after_release(
    dagbag, volcano_conn, outside, examples_db, unique_key
) -> None:
    held = outside.acquire(unique_key, 60)
    released = threading.Event()

    def release_once_the_trigger_waits() -> None:
        # The worker's acquire is refused once; the trigger's first own attempt is the second refusal.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            refused = [
                r
                for r in volcano_conn.requests()
                if unique_key in r.get("path", "") and r.get("op") == "acquire" and r.get("status") == 409
            ]
            if len(refused) >= 2:
                break
            time.sleep(0.2)
        time.sleep(1.0)
        outside.release(unique_key, held)
        released.set()

    watcher = threading.Thread(target=release_once_the_trigger_waits, daemon=True)
    watcher.start()
    dr = dagbag.get_dag("volcano_migration").test(
        run_conf={"lock_key": unique_key, "steps": 2, "step_seconds": 0.1, "resource": f"schema-{unique_key}"}
    )
    watcher.join(5)
    assert released.is_set()
    assert dr.state == "success", _states(dr)
    # The task try is one owner: one token besides the outside holder's, refused on the worker,
    # refused then granted in the trigger, granted again (idempotently, same lease) to the resumed
    # task, then released.
    outsider = hashlib.sha256(held.token.encode()).hexdigest()[:12]
    on_key = [r for r in volcano_conn.requests() if unique_key in r.get("path", "") and r.get("token_sha256")]
    (digest,) = {r["token_sha256"] for r in on_key} - {outsider}
    mine = [(r["op"], r["status"]) for r in on_key if r["token_sha256"] == digest]
    acquires = [status for op, status in mine if op == "acquire"]
    assert acquires[:2] == [409, 409] and acquires[-2:] == [201, 201], mine
    assert mine[-1] == ("release", 204), mine
    lease = _xcoms(dr, "migrate")["volcano_lease"]
    assert lease["fencing_token"] > held.fencing_token
    writes = FencedTable.from_env().history(f"schema-{unique_key}")
    assert [w.fencing_token for w in writes] == [lease["fencing_token"]] * 2


def test_taskflow_pipeline_passes_the_fencing_token_downstream(
    dagbag, volcano_conn, examples_db, unique_key
) -> None:
    dr = dagbag.get_dag("volcano_taskflow_pipeline").test(run_conf={"lock_key": unique_key})
    assert dr.state == "success", _states(dr)
    load = _xcoms(dr, "load")
    verify = _xcoms(dr, "verify")
    assert load["return_value"]["fencing_token"] == load["volcano_lease"]["fencing_token"]
    assert verify["return_value"] == load["volcano_lease"]["fencing_token"]


def test_migration_fails_and_names_the_loss_when_force_released(
    dagbag, volcano_conn, outside, examples_db, unique_key, capfd
) -> None:
    def force_release_when_held() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not outside.get(unique_key).held:
            time.sleep(0.1)
        outside.force_release(unique_key)

    threading.Thread(target=force_release_when_held, daemon=True).start()
    dr = dagbag.get_dag("volcano_migration").test(
        run_conf={"lock_key": unique_key, "steps": 40, "step_seconds": 0.25, "resource": f"loss-{unique_key}"}
    )
    assert _states(dr) == {"migrate": "failed"}
    out = capfd.readouterr()
    assert "Lost ownership of lock" in out.out + out.err


def test_mapped_tasks_lock_per_map_index(dagbag, volcano_conn, outside, examples_db, unique_key) -> None:
    """`lock_key` is templated per mapped task instance: each map index holds its own lock."""
    held = outside.acquire(f"{unique_key}:1", 60)  # another deployment is refreshing map index 1 ("us")
    try:
        dr = dagbag.get_dag("volcano_regional_refresh").test(run_conf={"lock_prefix": unique_key})
    finally:
        outside.release(f"{unique_key}:1", held)

    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        states = {
            ti.map_index: str(ti.state)
            for ti in session.query(TaskInstance).filter_by(dag_id=dr.dag_id, run_id=dr.run_id)
        }
        results = {
            row.map_index: XComModel.deserialize_value(row)
            for row in session.query(XComModel).filter_by(
                dag_id=dr.dag_id, run_id=dr.run_id, task_id="refresh", key="return_value"
            )
        }
    assert states == {0: "success", 1: "skipped", 2: "success"}
    assert {i: (r["region"], r["lock_key"]) for i, r in results.items()} == {
        0: ("eu", f"{unique_key}:0"),
        2: ("apac", f"{unique_key}:2"),
    }
    written = {w.resource: w.fencing_token for w in FencedTable.from_env().history() if w.accepted}
    assert written == {"region:eu": results[0]["fencing_token"], "region:apac": results[2]["fencing_token"]}
    assert all(not outside.get(f"{unique_key}:{i}").held for i in range(3))  # every lease released
