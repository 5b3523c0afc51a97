"""A pipeline whose load step writes through a fencing check.

The load step holds the resource's lock and stamps every write with the lease's fencing
token; the database refuses a write whose token is older than the last one it accepted. So a
worker that lost its lock (paused, partitioned, force-released) can never overwrite the work of
the run that holds the lock now, even if it wakes up and writes late.

The table is `volcano_locks.fencing.FencedTable`, in the database named by `VOLCANO_EXAMPLES_DB`
(a SQLite path or a `postgresql://` DSN; default `volcano_examples.sqlite3` in the temp directory).

    python flows/fenced_pipeline.py orders
"""

from __future__ import annotations

import sys
from typing import Any

from prefect import flow, task

from prefect_volcano import current_lease, locked_task
from volcano_locks.fencing import FencedTable


@task
def extract(resource: str) -> list[int]:
    """Fetch the rows to aggregate (a stand-in for a real source)."""
    return [len(resource), 7, 35]


@task
def transform(rows: list[int]) -> str:
    """Aggregate the rows."""
    return f"total={sum(rows)}"


@locked_task("pipeline:{resource}", ttl=30, on_contention="wait", wait_timeout=300)
@task(retries=2, retry_delay_seconds=1)
def load(resource: str, value: str, table: str) -> dict[str, Any]:
    """Write the aggregate under the resource's lock, fenced by the lease's fencing token."""
    lease = current_lease()
    # The database comes from the environment, not a parameter: a DSN may hold a password.
    FencedTable.from_env(table=table).write_or_raise(resource, lease.lock_key, lease.fencing_token, value)
    return {"resource": resource, "value": value, "fencing_token": lease.fencing_token}


@flow(name="fenced-pipeline")
def fenced_pipeline(resource: str, table: str = "fenced_resource") -> dict[str, Any]:
    """Extract, transform, then load through the fencing check."""
    value = transform(extract(resource))
    return load(resource, value, table)


if __name__ == "__main__":
    print(fenced_pipeline(sys.argv[1] if len(sys.argv) > 1 else "orders"))
