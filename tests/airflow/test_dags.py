"""Every example DAG in dags/ runs with dag.test() against the local Volcano server."""

from __future__ import annotations

import ast
import hashlib
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from volcano_locks.fencing import FencedTable

DAGS = Path(__file__).resolve().parents[2] / "dags"
TESTED = {
    "volcano_daily_rollup",
    "volcano_fenced_lake",
    "volcano_migration",
    "volcano_once_totals",
    "volcano_regional_refresh",
    "volcano_taskflow_pipeline",
    "volcano_warehouse_swap",
}


@pytest.fixture(scope="module")
def dagbag(airflow_db):
    # The bundle-aware bag puts dags/ on sys.path, as the dag processor and workers do.
    from tests.airflow.versions import bundle_dag_bag

    return bundle_dag_bag(DAGS)


@pytest.fixture
def examples_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    db = tmp_path / "examples.sqlite"
    monkeypatch.setenv("VOLCANO_EXAMPLES_DB", str(db))
    return db


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


# -- one lock across a task group: dags/volcano_warehouse_swap.py ------------------------------------

SWAP = "volcano_warehouse_swap"
ACQUIRE, RELEASE = "rebuild.volcano_lock_acquire", "rebuild.volcano_lock_release"


def _swap_conf(key: str, **overrides: object) -> dict[str, object]:
    # Every param, every time: the module's DAG object is shared and dag.test() keeps a run's conf.
    return {"lock_key": key, "table": key, "steps": 2, "step_seconds": 0.0, "fail_at": "", **overrides}


def _on_key(volcano_conn, key: str) -> list[tuple[str, int, str]]:
    """The lease requests (acquire, renew, release) on ``key``: op, status, token digest."""
    return [
        (r["op"], r["status"], r.get("token_sha256"))
        for r in volcano_conn.requests()
        if r.get("path", "").endswith(f"/locks/{key}/lease")
    ]


def test_warehouse_swap_runs_every_task_under_one_lease_and_releases_it(
    dagbag, volcano_conn, outside, examples_db, unique_key
) -> None:
    dag = dagbag.get_dag(SWAP)
    assert dag.get_task(ACQUIRE).is_setup and dag.get_task(RELEASE).is_teardown
    assert {t.task_id for t in dag.get_task(ACQUIRE).downstream_list} >= {"rebuild.extract"}
    assert {t.task_id for t in dag.get_task(RELEASE).upstream_list} >= {"rebuild.swap", ACQUIRE}
    dr = dag.test(run_conf=_swap_conf(unique_key))
    assert _states(dr) == dict.fromkeys(
        (ACQUIRE, "rebuild.extract", "rebuild.load", "rebuild.swap", RELEASE), "success"
    )
    fencing = _xcoms(dr, ACQUIRE)["return_value"]["fencing_token"]
    assert _xcoms(dr, "rebuild.load")["volcano_lease"]["fencing_token"] == fencing
    assert _xcoms(dr, "rebuild.swap")["return_value"] == fencing
    writes = FencedTable.from_env().history()
    assert [(w.resource, w.fencing_token, w.accepted) for w in writes] == [
        (f"staging:{unique_key}", fencing, True),
        (f"staging:{unique_key}", fencing, True),
        (f"live:{unique_key}", fencing, True),
    ]
    assert not outside.get(unique_key).held  # released by the teardown
    # One owner all along: the setup acquired, each member re-acquired the same lease, the teardown
    # released it; the ownership token never changed.
    ops = _on_key(volcano_conn, unique_key)
    assert len({digest for _, _, digest in ops}) == 1
    assert [(op, status) for op, status, _ in ops if op != "renew"] == [
        ("acquire", 201),
        ("acquire", 201),
        ("acquire", 201),
        ("release", 204),
    ]
    group = _xcoms(dr, ACQUIRE)["volcano_lock_group"]
    assert set(group) == {
        "lock_key",
        "fencing_token",
        "acquired_at",
        "expires_at",
        "ttl",
        "owner",
        "kind",
        "seal",
    }
    assert group["kind"] == "group"
    assert volcano_conn.service_key not in repr(group)


def test_warehouse_swap_releases_the_lock_when_a_task_fails(
    dagbag, volcano_conn, outside, examples_db, unique_key
) -> None:
    dr = dagbag.get_dag(SWAP).test(run_conf=_swap_conf(unique_key, fail_at="swap"))
    states = _states(dr)
    assert states["rebuild.swap"] == "failed" and states[RELEASE] == "success", states
    assert dr.state == "failed"
    assert not outside.get(unique_key).held
    assert [w.resource for w in FencedTable.from_env().history()] == [f"staging:{unique_key}"] * 2
    assert _on_key(volcano_conn, unique_key)[-1][:2] == ("release", 204)


@pytest.mark.parametrize("taken", [False, True], ids=["lapsed", "taken"])
def test_warehouse_swap_a_loss_between_tasks_fails_the_tasks_still_to_run(
    dagbag, volcano_conn, outside, examples_db, unique_key, capfd, taken: bool
) -> None:
    thief: list[Any] = []

    def force_release_once_acquired() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not outside.get(unique_key).held:
            time.sleep(0.05)
        outside.force_release(unique_key)  # while extract runs (it sleeps step_seconds)
        if taken:
            thief.append(outside.acquire(unique_key, 30))  # and someone else takes the lock

    threading.Thread(target=force_release_once_acquired, daemon=True).start()
    dr = dagbag.get_dag(SWAP).test(run_conf=_swap_conf(unique_key, step_seconds=3.0))
    states = _states(dr)
    assert states["rebuild.extract"] == "success"
    assert states["rebuild.load"] == "failed" and states["rebuild.swap"] == "upstream_failed", states
    assert states[RELEASE] == "success"
    assert FencedTable.from_env().history() == []  # nothing written after the loss
    out = capfd.readouterr()
    if taken:
        (other,) = thief
        assert outside.get(unique_key).fencing_token == other.fencing_token  # the teardown left it be
        assert (
            f"was lost before task 'rebuild.load' ran (the lock is now held by another owner "
            f"with fencing token {other.fencing_token}" in out.out + out.err
        )
        assert "worker slot" not in out.out + out.err  # a member never waits for its group's lease
        outside.release(unique_key, other)
    else:
        assert not outside.get(unique_key).held  # the new lease load's check made was given back
        assert "lapsed before task 'rebuild.load' ran" in out.out + out.err


def test_warehouse_swap_waits_deferred_for_a_holder_then_runs_under_a_newer_token(
    dagbag, volcano_conn, outside, examples_db, unique_key
) -> None:
    held = outside.acquire(unique_key, 60)

    def release_once_the_trigger_waits() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            refused = [r for r in _on_key(volcano_conn, unique_key) if r[:2] == ("acquire", 409)]
            if len(refused) >= 2:  # the acquire task's own try, then the trigger's
                break
            time.sleep(0.2)
        outside.release(unique_key, held)

    watcher = threading.Thread(target=release_once_the_trigger_waits, daemon=True)
    watcher.start()
    dr = dagbag.get_dag(SWAP).test(run_conf=_swap_conf(unique_key))
    watcher.join(5)
    assert dr.state == "success", _states(dr)
    fencing = _xcoms(dr, ACQUIRE)["return_value"]["fencing_token"]
    assert fencing > held.fencing_token
    assert {w.fencing_token for w in FencedTable.from_env().history()} == {fencing}
    assert not outside.get(unique_key).held


def test_fenced_lake_writes_the_warehouse_and_the_lake_under_the_tasks_lease(
    dagbag, volcano_conn, unique_key, example_stores
) -> None:
    from volcano_locks.fencing import FencedSQL, StaleFencingToken

    day, stores = unique_key, example_stores
    dr = dagbag.get_dag("volcano_fenced_lake").test(run_conf={"day": day})
    assert dr.state == "success", _states(dr)
    lease = _xcoms(dr, "publish")["volcano_lease"]
    assert lease["lock_key"] == f"sales:{day}"
    assert stores.stored(day) == ({lease["fencing_token"]}, lease["fencing_token"])  # both stores, one lease
    assert _xcoms(dr, "publish")["return_value"]["rows"] == 3

    # A newer holder of the day's lock wrote both stores: the next run's (older) lease is refused.
    newer = stores.overtake(day, lease["fencing_token"] + 10**9)
    dr = dagbag.get_dag("volcano_fenced_lake").test(run_conf={"day": day})
    assert _states(dr) == {"publish": "failed"}
    assert stores.stored(day) == ({newer.fencing_token}, newer.fencing_token)
    with pytest.raises(StaleFencingToken), stores.engine.begin() as conn:  # what the task was refused with
        FencedSQL(stores.engine).claim(conn, f"sales:{day}", lease)


PREFECT_PYTHON = Path(__file__).resolve().parents[2] / ".venv-prefect" / "bin" / "python"


def test_once_totals_a_re_run_of_a_done_day_is_skipped_and_the_flow_on_the_same_key_too(
    dagbag, volcano_conn, volcano_server, unique_key, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sqlalchemy as sa

    url = f"sqlite:///{tmp_path / 'totals.sqlite3'}"
    monkeypatch.setenv("VOLCANO_EXAMPLES_SQLALCHEMY_URL", url)
    dag = dagbag.get_dag("volcano_once_totals")
    first = dag.test(run_conf={"lock_key": unique_key})
    assert _states(first) == {"totals": "success"}
    day = f"{first.logical_date:%Y-%m-%d}"
    again = dag.test(run_conf={"lock_key": unique_key})  # another run of the same day
    assert _states(again) == {"totals": "skipped"}
    assert _xcoms(again, "totals")["return_value"] == _xcoms(first, "totals")["return_value"]
    # The Prefect flow on the same lock and business key, from the Prefect environment: a duplicate.
    env = {
        **os.environ,
        **volcano_server.env(),
        "VOLCANO_EXAMPLES_SQLALCHEMY_URL": url,
        "PREFECT_HOME": str(tmp_path / "prefect-home"),
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "600",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    }
    env.pop("PREFECT_API_URL", None)
    flow = Path(__file__).resolve().parents[2] / "flows" / "once_totals.py"
    proc = subprocess.run(
        [str(PREFECT_PYTHON), str(flow), day, unique_key],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    out = ast.literal_eval(proc.stdout.strip().splitlines()[-1])
    assert out["duplicate"] is True and f"run_id={first.run_id}" in out["message"]
    assert out["result"] == _xcoms(first, "totals")["return_value"]
    with sa.create_engine(url).connect() as conn:
        rows = conn.execute(sa.text("SELECT written_by FROM example_daily_totals")).all()
    assert [r[0] for r in rows] == ["airflow"]  # one effect, by the DAG
