"""Every example flow in flows/ runs against the harness and the local lock server."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from prefect_volcano import SKIPPED_STATE_NAME, LockedResult
from tests.prefect.helpers import FLOWS_DIR, assert_failed_with, load_flow_module
from volcano_locks import VolcanoLocks
from volcano_locks.fencing import FencedTable, StaleFencingToken

pytestmark = pytest.mark.usefixtures("volcano_env")

TESTED = {
    "leader_rollup",
    "regional_fanout",
    "fenced_pipeline",
    "nightly_pipeline",
    "fenced_lake",
    "once_totals",
}


def test_every_flow_has_a_test() -> None:
    assert {p.stem for p in FLOWS_DIR.glob("*.py")} == TESTED


def test_leader_rollup_runs_and_skips_when_another_leader_holds_it(unique_key: str) -> None:
    module = load_flow_module("leader_rollup")
    state = module.leader_rollup(unique_key)
    assert state.name == "Completed"
    out = state.result()
    assert out["day"] == unique_key and out["fencing_token"] > 0

    with VolcanoLocks() as other_leader, other_leader.with_lock(f"rollup:{unique_key}", 10):
        skipped = module.leader_rollup(unique_key)
    assert skipped.name == SKIPPED_STATE_NAME and f"rollup:{unique_key}" in (skipped.message or "")


def test_nightly_pipeline_holds_one_lease_for_the_flow_run_and_skips_when_held(unique_key: str) -> None:
    module = load_flow_module("nightly_pipeline")
    state = module.nightly_pipeline(unique_key, return_state=True)
    assert state.name == "Completed"
    out = state.result()
    token = out["fencing_token"]
    assert out["summary"]["fencing_token"] == token
    assert [p["fencing_token"] for p in out["parts"]] == [token, token, token]  # mapped, other threads
    with VolcanoLocks() as client:
        assert client.get(f"nightly:{unique_key}").held is False  # released when the flow ended

    with VolcanoLocks() as other, other.with_lock(f"nightly:{unique_key}", 10):
        skipped = module.nightly_pipeline(unique_key, return_state=True)
        assert module.nightly_pipeline(unique_key) is None  # a skipped call's value
    assert skipped.name == SKIPPED_STATE_NAME and skipped.is_completed()
    assert f"nightly:{unique_key}" in (skipped.message or "")


def test_regional_fanout_takes_one_lock_per_region(unique_key: str) -> None:
    module = load_flow_module("regional_fanout")
    regions = [f"{unique_key}-eu", f"{unique_key}-us", f"{unique_key}-apac"]
    results: list[LockedResult[str]] = module.regional_fanout(regions, work_seconds=0.2)
    assert [r.lock_key for r in results] == [f"refresh:{r}" for r in regions]
    assert [r.value for r in results] == [f"{r} refreshed" for r in regions]


def _fenced_pipeline_checks(module: Any, resource: str, table: str) -> None:
    fenced = FencedTable.from_env(table=table)
    first = module.fenced_pipeline(resource, table=table)
    stored = fenced.read(resource)
    assert stored is not None
    assert (stored.fencing_token, stored.value) == (first["fencing_token"], first["value"])
    second = module.fenced_pipeline(resource, table=table)
    assert second["fencing_token"] > first["fencing_token"]

    # A writer that already wrote with a much newer token: our (older) lease's write is refused.
    newer = second["fencing_token"] + 10**9
    fenced.write_or_raise(resource, f"pipeline:{resource}", newer, "from a newer lease")
    state = module.fenced_pipeline(resource, table=table, return_state=True)
    assert_failed_with(state, StaleFencingToken, "rejected")
    stored = fenced.read(resource)
    assert stored is not None and (stored.fencing_token, stored.value) == (newer, "from a newer lease")
    # Two runs and the newer writer landed; every attempt of the third run (the task retries) was refused.
    accepted = [w.accepted for w in fenced.history(resource)]
    assert accepted[:3] == [True, True, True] and accepted[3:] and not any(accepted[3:])


def test_fenced_pipeline_sqlite(unique_key: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = load_flow_module("fenced_pipeline")
    monkeypatch.setenv("VOLCANO_EXAMPLES_DB", str(tmp_path / "pipeline.sqlite"))
    _fenced_pipeline_checks(module, unique_key, "fenced_resource")


@pytest.mark.postgres
def test_fenced_pipeline_postgres(unique_key: str, pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    module = load_flow_module("fenced_pipeline")
    monkeypatch.setenv("VOLCANO_EXAMPLES_DB", pg_dsn)
    table = f"prefect_fenced_{uuid.uuid4().hex[:12]}"
    try:
        _fenced_pipeline_checks(module, unique_key, table)
    finally:
        import psycopg

        with psycopg.connect(pg_dsn) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {table}, {table}_history")


def test_a_flow_runs_as_a_script(
    unique_key: str, tmp_path: Path, prefect_subprocess_env: dict[str, str]
) -> None:
    env = dict(prefect_subprocess_env, VOLCANO_EXAMPLES_DB=str(tmp_path / "script.sqlite"))
    proc = subprocess.run(
        [sys.executable, str(FLOWS_DIR / "fenced_pipeline.py"), unique_key],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "'fencing_token':" in proc.stdout


def test_fenced_lake_publishes_to_the_warehouse_and_the_lake_under_one_lease(
    unique_key: str, example_stores: Any
) -> None:
    module = load_flow_module("fenced_lake")
    day, stores = unique_key, example_stores
    first = module.fenced_lake(day)
    assert first["rows"] == 3 and stores.stored(day) == ({first["fencing_token"]}, first["fencing_token"])
    assert stores.lake(day).read("sales.csv").decode().splitlines()[0] == "region,amount"
    second = module.fenced_lake(day)
    assert second["fencing_token"] > first["fencing_token"]
    assert stores.stored(day) == (
        {second["fencing_token"]},
        second["fencing_token"],
    )  # the day replaced, whole

    # A newer holder of the day's lock publishes to both stores; this lease is now the stale one.
    newer = stores.overtake(day, second["fencing_token"] + 10**9)
    state = module.fenced_lake(day, return_state=True)
    assert_failed_with(state, StaleFencingToken, f"sales:{day}")
    assert stores.stored(day) == ({newer.fencing_token}, newer.fencing_token)  # nothing of the refused run


def test_once_totals_does_a_day_once_and_a_second_deployment_run_is_a_duplicate(
    unique_key: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VOLCANO_EXAMPLES_SQLALCHEMY_URL", f"sqlite:///{tmp_path / 'totals.sqlite3'}")
    module = load_flow_module("once_totals")
    module.ledger.cache_clear()
    first = module.once_totals("2026-12-01", unique_key)
    assert first["duplicate"] is False and first["result"] == {"day": "2026-12-01", "total": 14}
    second = module.once_totals("2026-12-01", unique_key)  # the same day, started again
    assert second["duplicate"] is True and second["result"] == {"day": "2026-12-01", "total": 14}
    assert "prefect flow_run_id=" in second["message"]
    record = module.ledger().lookup("daily-totals:2026-12-01")
    assert record is not None and record.who.orchestrator == "prefect"
    module.ledger.cache_clear()
