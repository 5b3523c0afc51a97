"""Daily totals, done once per day by whoever runs them: this flow, or ``dags/volcano_once_totals.py``.

Both hold lock ``daily-totals`` and record ``daily-totals:<day>`` in the same ledger
(``VOLCANO_EXAMPLES_SQLALCHEMY_URL``, default a SQLite file in the temp directory). A run for a day
already done (by this flow, a second deployment, or the DAG) ends Completed as Skipped, names the run
that did the day, and its state's result is that run's recorded result.

Run it: ``python flows/once_totals.py 2026-12-01 [lock-key]`` (prints the result and whether it was a
duplicate).
"""

from __future__ import annotations

import functools
import os
import sys
import tempfile
from typing import Any

import sqlalchemy as sa
from prefect import flow, task
from prefect.states import State

from prefect_volcano import current_lease, current_once, is_skipped, locked_task
from volcano_locks.once import SQLLedger


@functools.cache
def ledger() -> SQLLedger:
    """The ledger in the examples' database, the same the DAG uses."""
    default = f"sqlite:///{os.path.join(tempfile.gettempdir(), 'volcano_examples_warehouse.sqlite3')}"
    engine = sa.create_engine(os.environ.get("VOLCANO_EXAMPLES_SQLALCHEMY_URL") or default)
    totals.create(engine, checkfirst=True)
    return SQLLedger(engine)


totals = sa.Table(
    "example_daily_totals",
    sa.MetaData(),
    sa.Column("day", sa.String(32), nullable=False),
    sa.Column("total", sa.Integer, nullable=False),
    sa.Column("fencing_token", sa.BigInteger, nullable=False),
    sa.Column("written_by", sa.String(16), nullable=False),
)


def daily_totals_task(lock_key: str) -> Any:
    """The task, under ``lock_key`` (``daily-totals`` in production; tests give their own)."""

    @task
    @locked_task(lock_key, ttl=60, once_key="daily-totals:{day}", ledger=ledger())
    def daily_totals(day: str) -> dict[str, Any]:
        total = sum(int(c) for c in day if c.isdigit())
        with current_once().begin() as effect:
            effect.connection.execute(
                sa.insert(totals).values(
                    day=day, total=total, fencing_token=current_lease().fencing_token, written_by="prefect"
                )
            )
            effect.result = {"day": day, "total": total}
        return {"day": day, "total": total}

    return daily_totals


@flow
def once_totals(day: str, lock_key: str = "daily-totals") -> dict[str, Any]:
    """Write ``day``'s totals once: whether this run was a duplicate, the day's result, the task's message."""
    state: State[Any] = daily_totals_task(lock_key)(day, return_state=True)
    return {"duplicate": is_skipped(state), "result": state.result(), "message": state.message}


if __name__ == "__main__":
    print(once_totals(sys.argv[1], *(sys.argv[2:3])))
