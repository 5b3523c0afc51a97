"""A pipeline whose load step writes through a fencing check.

The load step holds the resource's lock and stamps every write with the lease's fencing
token; the database refuses a write whose token is older than the last one it accepted. So a
worker that lost its lock (paused, partitioned, force-released) can never overwrite the work of
the run that holds the lock now, even if it wakes up and writes late.

The database is a SQLite file or PostgreSQL, chosen by `VOLCANO_FLOWS_DB` (a path, or a
`postgresql://` DSN); the default is `.demo/fenced-pipeline.sqlite`.

    python flows/fenced_pipeline.py orders
"""

from __future__ import annotations

import os
import re
import sqlite3
import sys
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prefect import flow, task

from prefect_volcano import current_lease, locked_task

DEFAULT_DB = ".demo/fenced-pipeline.sqlite"
_TABLE_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


class StaleWrite(RuntimeError):
    """The database already holds a write from a newer lease: this writer lost its lock."""


def database() -> str:
    """Where the pipeline writes: `VOLCANO_FLOWS_DB`, else the demo SQLite file."""
    return os.environ.get("VOLCANO_FLOWS_DB") or DEFAULT_DB


def fenced_write(db: str, table: str, resource: str, fencing_token: int, value: str) -> None:
    """Upsert `value` for `resource` only if `fencing_token` is not older than the stored one."""
    if not _TABLE_RE.match(table):
        raise ValueError(f"table must be a lower-case SQL identifier, got {table!r}")
    create = (
        f"CREATE TABLE IF NOT EXISTS {table} (resource TEXT PRIMARY KEY, fencing_token BIGINT NOT NULL,"
        " value TEXT NOT NULL, written_at TEXT NOT NULL)"
    )
    # One conditional statement: the check and the write cannot be separated by another writer.
    upsert = (
        f"INSERT INTO {table} (resource, fencing_token, value, written_at)"
        " VALUES ({p}, {p}, {p}, {p})"
        f" ON CONFLICT (resource) DO UPDATE SET fencing_token = excluded.fencing_token,"
        f" value = excluded.value, written_at = excluded.written_at"
        f" WHERE excluded.fencing_token >= {table}.fencing_token"
    )
    args = (resource, fencing_token, value, datetime.now(UTC).isoformat())
    if db.startswith(("postgresql://", "postgres://")):
        import psycopg

        with psycopg.connect(db) as conn:
            conn.execute(create)
            written = conn.execute(upsert.format(p="%s"), args).rowcount
    else:
        Path(db).parent.mkdir(parents=True, exist_ok=True)
        with closing(sqlite3.connect(db, timeout=30)) as conn, conn:
            conn.execute(create)
            written = conn.execute(upsert.format(p="?"), args).rowcount
    if written != 1:
        raise StaleWrite(
            f"write to {resource!r} with fencing token {fencing_token} refused: a newer lease already wrote"
        )


def read_back(db: str, table: str, resource: str) -> tuple[int, str] | None:
    """Return the stored (fencing_token, value) of `resource`, or None."""
    query = f"SELECT fencing_token, value FROM {table} WHERE resource = {{p}}"
    if db.startswith(("postgresql://", "postgres://")):
        import psycopg

        with psycopg.connect(db) as conn:
            row = conn.execute(query.format(p="%s"), (resource,)).fetchone()
    else:
        with closing(sqlite3.connect(db, timeout=30)) as conn:
            row = conn.execute(query.format(p="?"), (resource,)).fetchone()
    return (int(row[0]), str(row[1])) if row else None


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
    token = current_lease().fencing_token
    # The database comes from the environment, not a parameter: a DSN may hold a password.
    fenced_write(database(), table, resource, token, value)
    return {"resource": resource, "value": value, "fencing_token": token}


@flow(name="fenced-pipeline")
def fenced_pipeline(resource: str, table: str = "fenced_writes") -> dict[str, Any]:
    """Extract, transform, then load through the fencing check."""
    value = transform(extract(resource))
    return load(resource, value, table)


if __name__ == "__main__":
    print(fenced_pipeline(sys.argv[1] if len(sys.argv) > 1 else "orders"))
