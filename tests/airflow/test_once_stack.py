"""Run once on a real Airflow stack: a cleared run, a backfill over done days, and a flow on the same key.

Real api-server, scheduler (LocalExecutor), dag processor and triggerer (PostgreSQL metadata) run the example
``dags/volcano_once_totals.py`` (its lock key made this test's own); its ledger and totals live in a
SQLite warehouse the Prefect example ``flows/once_totals.py`` shares, run from the Prefect environment as
its README says. Each day's totals must be written exactly once, whoever ran it and however often:

* a DAG run cleared and run again: the task is skipped, its log names the first run, and the first
  run's result is its ``return_value``;
* a backfill over days already done (``--reprocess-behavior completed``): the done day is skipped, the
  others are done once each;
* the flow for a day the DAG did ends as a duplicate naming the Airflow run; the DAG for a day the flow
  did is skipped naming the flow run.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.airflow.helpers import STACK_HANG_BOUND, Stack, running_stack, until

pytestmark = [pytest.mark.slow, pytest.mark.postgres, STACK_HANG_BOUND]

ROOT = Path(__file__).resolve().parents[2]
DAG_ID = "volcano_once_totals"
PREFECT_PYTHON = ROOT / ".venv-prefect" / "bin" / "python"


@pytest.fixture
def warehouse(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'warehouse.sqlite3'}"


@pytest.fixture
def stack(
    airflow_db: Path, volcano_conn: Any, tmp_path: Path, unique_key: str, warehouse: str
) -> Iterator[Stack]:
    dags = tmp_path / "dags"
    dags.mkdir()
    source = (ROOT / "dags" / "volcano_once_totals.py").read_text()
    assert 'Param("daily-totals"' in source
    (dags / "volcano_once_totals.py").write_text(
        source.replace('Param("daily-totals"', f'Param("{unique_key}"')
    )
    # PostgreSQL metadata: on SQLite, `airflow backfill create` met the scheduler's write ("database is
    # locked") after committing its backfill and its first day's run: the other days were never run.
    with running_stack(
        airflow_db, tmp_path, dags, extra_env={"VOLCANO_EXAMPLES_SQLALCHEMY_URL": warehouse}, postgres=True
    ) as s:
        yield s


def _ti(stack: Stack, day: str) -> tuple[str | None, int]:
    rows = stack.query(
        "SELECT ti.state, ti.try_number FROM task_instance ti JOIN dag_run dr ON dr.run_id = ti.run_id "
        "AND dr.dag_id = ti.dag_id WHERE ti.dag_id = ? AND date(dr.logical_date) = ?",
        DAG_ID,
        day,
    )
    return rows[0] if rows else (None, 0)


def _return_value(stack: Stack, run_id: str) -> Any:
    rows = stack.query(
        "SELECT value FROM xcom WHERE dag_id = ? AND run_id = ? AND key = 'return_value'", DAG_ID, run_id
    )
    if not rows:
        return None
    value = rows[0][0]  # JSON text on SQLite, decoded already on PostgreSQL
    return json.loads(value) if isinstance(value, str | bytes) else value


def _totals(warehouse: str) -> list[tuple[str, str]]:
    with sa.create_engine(warehouse).connect() as conn:
        rows = conn.execute(sa.text("SELECT day, written_by FROM example_daily_totals ORDER BY day")).all()
    return [(r[0], r[1]) for r in rows]


def _flow(day: str, key: str, volcano_conn: Any, warehouse: str, home: Path) -> dict[str, Any]:
    """``python flows/once_totals.py DAY KEY`` from the Prefect environment; the dict it prints."""
    env = dict(
        os.environ,
        VOLCANO_API_URL=volcano_conn.url,
        VOLCANO_ANON_KEY=volcano_conn.anon_key,
        VOLCANO_SERVICE_KEY=volcano_conn.service_key,
        VOLCANO_EXAMPLES_SQLALCHEMY_URL=warehouse,
        PREFECT_HOME=str(home),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_LOGGING_LEVEL="WARNING",
        # The flow starts Prefect's ephemeral server; beside a running Airflow stack that takes more than
        # its default 20 s on a busy two-core machine.
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="240",
    )
    env.pop("PREFECT_API_URL", None)
    done = subprocess.run(
        [str(PREFECT_PYTHON), str(ROOT / "flows" / "once_totals.py"), day, key],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    said: dict[str, Any] = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    return said


def _backfill(stack: Stack, start: str, end: str) -> None:
    """``airflow backfill create`` over ``start``-``end``, done days included."""
    argv = ["backfill", "create", "--dag-id", DAG_ID, "--from-date", start, "--to-date", end]
    stack.cli(*argv, "--reprocess-behavior", "completed")


def test_cleared_runs_backfills_and_a_flow_on_the_same_key_do_each_day_once(
    stack: Stack, volcano_conn: Any, unique_key: str, warehouse: str, tmp_path: Path
) -> None:
    if not PREFECT_PYTHON.is_file():
        pytest.skip(f"no Prefect environment at {PREFECT_PYTHON} (make envs)")
    stack.unpause_when_parsed(DAG_ID, timeout=300)

    # A run, then the same run cleared: skipped the second time, naming the first, with its result.
    stack.cli(
        "dags", "trigger", DAG_ID, "--run-id", "once_first", "--logical-date", "2026-11-10T00:00:00+00:00"
    )
    until("the first run", lambda: _ti(stack, "2026-11-10")[0] == "success", 240, stack=stack)
    first_result = _return_value(stack, "once_first")
    assert first_result == {"day": "2026-11-10", "total": 13}, first_result
    stack.cli("tasks", "clear", DAG_ID, "--start-date", "2026-11-10", "--end-date", "2026-11-10", "--yes")
    until(
        "the cleared run's second try", lambda: _ti(stack, "2026-11-10") == ("skipped", 2), 240, stack=stack
    )
    assert _return_value(stack, "once_first") == first_result
    log = stack.logs("once_first")
    assert "duplicate run" in log.lower() and "run_id=once_first" in log, log[-3000:]

    # A backfill over 9-11 November, the 10th already done: the 9th and the 11th are done once each.
    _backfill(stack, "2026-11-09", "2026-11-11")
    for day in ("2026-11-09", "2026-11-11"):
        until(f"the backfill's {day}", lambda d=day: _ti(stack, d)[0] == "success", 300, stack=stack)
    until("the backfill's 10th", lambda: _ti(stack, "2026-11-10")[0] == "skipped", 300, stack=stack)

    # The flow for a day the DAG did: a duplicate naming the Airflow run, with the DAG's result.
    said = _flow("2026-11-10", unique_key, volcano_conn, warehouse, tmp_path / "prefect-home")
    assert said["duplicate"] is True and said["result"] == first_result, said
    assert "airflow" in said["message"] and "once_first" in said["message"], said
    # The flow first, then the DAG for that day: the DAG's task is skipped, naming the flow run.
    said = _flow("2026-11-12", unique_key, volcano_conn, warehouse, tmp_path / "prefect-home")
    assert said["duplicate"] is False and said["result"] == {"day": "2026-11-12", "total": 15}, said
    stack.cli(
        "dags",
        "trigger",
        DAG_ID,
        "--run-id",
        "once_after_flow",
        "--logical-date",
        "2026-11-12T00:00:00+00:00",
    )
    until("the DAG run after the flow", lambda: _ti(stack, "2026-11-12")[0] == "skipped", 240, stack=stack)
    assert "prefect" in stack.logs("once_after_flow")
    assert _return_value(stack, "once_after_flow") == said["result"]

    assert [t for t in _totals(warehouse) if t[0] < "2026-12"] == [
        ("2026-11-09", "airflow"),
        ("2026-11-10", "airflow"),
        ("2026-11-11", "airflow"),
        ("2026-11-12", "prefect"),
    ]
