"""Daily totals, done once per day whoever runs them: this DAG, or the Prefect flow ``flows/once_totals.py``.

Both hold lock ``daily-totals`` and record business key ``daily-totals:<day>`` in the same ledger, a
table beside the totals (``volcano_locks.once.SQLLedger``). The callable writes the day's totals through
``volcano_once.begin()``, so the totals and their record commit together. A DAG run cleared and run again,
a backfill over days already done, or the flow run for a day this DAG did: the task is skipped, the log
names the run that did the day, and the first run's result is this task's ``return_value`` XCom.
The database is ``VOLCANO_EXAMPLES_SQLALCHEMY_URL`` (default: a SQLite file in the temp directory).
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import pendulum
import sqlalchemy as sa
from airflow.sdk import DAG, Param

from airflow_provider_volcano import VolcanoLockOperator


def ledger() -> Any:
    """The ledger (and the totals table) in the examples' database; built on the worker."""
    from volcano_locks.once import SQLLedger

    default = f"sqlite:///{os.path.join(tempfile.gettempdir(), 'volcano_examples_warehouse.sqlite3')}"
    engine = sa.create_engine(os.environ.get("VOLCANO_EXAMPLES_SQLALCHEMY_URL") or default)
    totals_table().create(engine, checkfirst=True)
    return SQLLedger(engine)


def totals_table() -> sa.Table:
    """One row per day's totals, with who wrote it and the fencing token it was written under."""
    return sa.Table(
        "example_daily_totals",
        sa.MetaData(),
        sa.Column("day", sa.String(32), nullable=False),
        sa.Column("total", sa.Integer, nullable=False),
        sa.Column("fencing_token", sa.BigInteger, nullable=False),
        sa.Column("written_by", sa.String(16), nullable=False),
    )


def write_totals(day: str, volcano_once: Any, volcano_lease: dict[str, Any]) -> dict[str, Any]:
    """The effect: the day's totals, recorded with its business key in one transaction."""
    total = sum(int(c) for c in day if c.isdigit())
    with volcano_once.begin() as effect:
        effect.connection.execute(
            sa.insert(totals_table()).values(
                day=day, total=total, fencing_token=volcano_lease["fencing_token"], written_by="airflow"
            )
        )
        effect.result = {"day": day, "total": total}
    return {"day": day, "total": total}


with DAG(
    dag_id="volcano_once_totals",
    schedule="@daily",
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
    params={"lock_key": Param("daily-totals", type="string")},
    tags=["volcano", "once"],
):
    VolcanoLockOperator(
        task_id="totals",
        lock_key="{{ params.lock_key }}",
        once_key="daily-totals:{{ ds }}",
        ledger=ledger,
        python_callable=write_totals,
        op_args=["{{ ds }}"],
    )
