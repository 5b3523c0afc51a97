"""VolcanoLockOperator(once_key=..., ledger=...) against the real local server and a real SQLite ledger."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa

from airflow_provider_volcano.operators.lock import VolcanoLockOperator
from tests.airflow.versions import AirflowSkipException
from tests.once.helpers import Warehouse, sqlite_url
from volcano_locks.fencing import Fence
from volcano_locks.once import Who


class _TI(SimpleNamespace):
    def xcom_push(self, key: str, value: Any) -> None:
        self.xcoms[key] = value


def _context(run_id: str, try_number: int = 1) -> dict[str, Any]:
    ti = _TI(dag_id="rollup", task_id="load", run_id=run_id, map_index=-1, try_number=try_number, xcoms={})
    return {"ti": ti}


@pytest.fixture
def warehouse(tmp_path: Path) -> Any:
    made = Warehouse(sqlite_url(tmp_path))
    yield made
    made.drop()


def _op(w: Warehouse, key: str, calls: list[str], **kwargs: Any) -> VolcanoLockOperator:
    def load(day: str, volcano_once: Any, volcano_lease: dict[str, Any]) -> dict[str, Any]:
        calls.append(day)
        with volcano_once.begin() as effect:
            w.effect(effect.connection, f"rollup:{day}", volcano_lease["fencing_token"])
            effect.result = {"day": day, "rows": 1}
        return {"day": day, "rows": 1}

    return VolcanoLockOperator(
        task_id="load",
        lock_key=key,
        python_callable=load,
        op_args=["2026-12-01"],
        once_key="rollup:2026-12-01",
        ledger=w.ledger,
        **kwargs,
    )


def test_a_re_run_is_skipped_naming_the_first_run_with_its_result_in_xcom(
    volcano_conn: Any, outside: Any, warehouse: Warehouse, unique_key: str, capfd: pytest.CaptureFixture[str]
) -> None:
    calls: list[str] = []
    first = _op(warehouse, unique_key, calls).execute(_context("scheduled__2026-12-01"))
    assert first == {"day": "2026-12-01", "rows": 1}
    again = _context("manual__cleared", try_number=2)  # the DAG run cleared and run again
    with pytest.raises(AirflowSkipException) as skipped:
        _op(warehouse, unique_key, calls).execute(again)
    message = str(skipped.value)
    assert (
        "Duplicate run" in message and "run_id=scheduled__2026-12-01" in message and "try_number=1" in message
    )
    assert again["ti"].xcoms["return_value"] == {"day": "2026-12-01", "rows": 1}
    assert calls == ["2026-12-01"] and warehouse.effects() == 1
    assert outside.get(unique_key).held is False  # the skip released the lock
    out, err = capfd.readouterr()
    released = [line for line in (out + err).splitlines() if "Released lock" in line]
    assert "as the task is skipped" in released[-1], released  # not "after the callable failed"
    record = warehouse.ledger.lookup("rollup:2026-12-01")
    assert record is not None and record.who == Who.of(
        "airflow", dag_id="rollup", run_id="scheduled__2026-12-01", task_id="load", try_number=1
    )


def test_a_key_done_by_another_orchestrator_skips_too(
    volcano_conn: Any, warehouse: Warehouse, unique_key: str
) -> None:
    prefect = Who.of("prefect", flow_run_id="f1", task_run_id="t1")
    with warehouse.ledger.begin("rollup:2026-12-01", Fence(unique_key, 1), who=prefect) as effect:
        effect.result = 5
    calls: list[str] = []
    ctx = _context("scheduled__2026-12-01")
    with pytest.raises(AirflowSkipException, match="prefect flow_run_id=f1"):
        _op(warehouse, unique_key, calls).execute(ctx)
    assert calls == [] and ctx["ti"].xcoms["return_value"] == 5


def test_a_ledger_may_be_built_on_the_worker(
    volcano_conn: Any, warehouse: Warehouse, unique_key: str
) -> None:
    calls: list[str] = []
    op = _op(warehouse, unique_key, calls)
    op.ledger = lambda: warehouse.ledger
    op.execute(_context("r1"))
    assert calls == ["2026-12-01"]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"once_key": "k"}, ValueError, "once_key needs ledger"),
        ({"ledger": object()}, ValueError, "ledger needs once_key"),
        ({"once_key": " padded", "ledger": lambda: None}, ValueError, "' padded'"),
        ({"once_key": "k", "ledger": 3}, TypeError, "run-once ledger or a callable"),
    ],
)
def test_once_arguments_are_checked_at_parse_time(kwargs: dict[str, Any], error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        VolcanoLockOperator(task_id="t", lock_key="k", python_callable=lambda: None, **kwargs)


def test_a_templated_once_key_is_kept_for_rendering() -> None:
    op = VolcanoLockOperator(
        task_id="t",
        lock_key="k",
        python_callable=lambda: None,
        once_key="rollup:{{ ds }}",
        ledger=lambda: None,
    )
    assert op.once_key == "rollup:{{ ds }}" and "once_key" in op.template_fields


def test_the_taskflow_form_takes_once_key(volcano_conn: Any, warehouse: Warehouse, unique_key: str) -> None:
    from airflow.sdk import DAG, task

    with DAG("once_taskflow", schedule=None):

        @task.volcano_lock(lock_key=unique_key, once_key="rollup:tf", ledger=warehouse.ledger)
        def load(volcano_once: Any = None) -> int:
            with volcano_once.begin() as effect:
                effect.connection.execute(
                    sa.insert(warehouse.rollup).values(business_key="rollup:tf", fencing_token=1)
                )
                effect.result = 3
            return 3

        made = load()
    op = made.operator
    assert op.once_key == "rollup:tf"
    assert op.execute(_context("r1")) == 3
    ctx = _context("r2")
    with pytest.raises(AirflowSkipException):
        op.execute(ctx)
    assert ctx["ti"].xcoms["return_value"] == 3 and warehouse.effects() == 1
