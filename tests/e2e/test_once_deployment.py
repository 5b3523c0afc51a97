"""A deployment of the run-once example run twice for one day on a real Prefect worker: one effect.

A real ``prefect server start``, a process work pool and a real worker run ``flows/once_totals.py``'s flow
as a deployment, as an automation and a schedule would start it twice for one day. The first run writes
the day's totals and its record in one transaction; the second ends Completed as a duplicate (its task
``Skipped: duplicate run, ...`` naming the first flow run), and its result is the first run's recorded
result. Then both are run at once for another day: one effect again.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import sqlalchemy as sa
from prefect.settings import PREFECT_LOCAL_STORAGE_PATH, temporary_settings

from tests.support.prefect_pool import process_pool
from volcano_locks.once import SQLLedger
from volcano_locks.server.harness import LocalServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

FLOWS = Path(__file__).resolve().parents[2] / "flows"


def test_a_deployment_run_twice_for_one_day_does_its_effect_once(
    volcano_server: LocalServer, tmp_path: Path, unique_key: str
) -> None:
    shutil.copy(FLOWS / "once_totals.py", tmp_path / "once_totals.py")
    url = f"sqlite:///{tmp_path / 'warehouse.sqlite3'}"
    results = tmp_path / "results"  # the runs' results, persisted where this test reads them back
    env = dict(
        volcano_server.env(),
        VOLCANO_EXAMPLES_SQLALCHEMY_URL=url,
        PREFECT_RESULTS_PERSIST_BY_DEFAULT="true",
        PREFECT_LOCAL_STORAGE_PATH=str(results),
    )
    with process_pool(tmp_path, env) as pool, temporary_settings({PREFECT_LOCAL_STORAGE_PATH: results}):
        deployment = pool.deploy("once-totals", "once_totals.py:once_totals", tmp_path)
        first = pool.run(deployment, day="2026-11-10", lock_key=unique_key)
        done = pool.final(first.id)
        assert done.is_completed(), done
        again = pool.run(deployment, day="2026-11-10", lock_key=unique_key)
        duplicate = pool.final(again.id)
        assert duplicate.is_completed(), duplicate
        # The flow returns what its task's state said: a duplicate, the first run's result, its message.
        said = duplicate.result(raise_on_failure=False)
        assert said["duplicate"] is True and said["result"] == {"day": "2026-11-10", "total": 13}, said
        assert "duplicate run" in said["message"] and str(first.id) in said["message"], said
        assert done.result()["duplicate"] is False
        assert "volcano-lock:duplicate" in pool.client.read_flow_run(again.id).tags

        # Two runs at once for another day: the lock takes them in turn, the ledger lets one do it.
        both = [pool.run(deployment, day="2026-11-11", lock_key=unique_key) for _ in range(2)]
        ends = [pool.final(run.id).result() for run in both]
        assert sorted(e["duplicate"] for e in ends) == [False, True], ends
        assert {str(e["result"]) for e in ends} == {str({"day": "2026-11-11", "total": 14})}, ends

    engine = sa.create_engine(url)
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT day, written_by FROM example_daily_totals ORDER BY day")).all()
    assert [tuple(r) for r in rows] == [("2026-11-10", "prefect"), ("2026-11-11", "prefect")]
    records = {r.business_key: r for r in SQLLedger(engine).records(prefix="daily-totals:")}
    assert set(records) == {"daily-totals:2026-11-10", "daily-totals:2026-11-11"}
    assert records["daily-totals:2026-11-10"].who.get("flow_run_id") == str(first.id), records
