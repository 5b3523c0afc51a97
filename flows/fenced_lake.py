"""A day's sales, published under one lock to a warehouse table and to an S3 prefix, both fenced.

The publish task holds `sales:{day}`; `current_lease()` hands its lease to both fenced writes, so no token
is copied by hand:

- the warehouse (`FencedSQL`): the day's rows are replaced in one transaction that commits only while
  this lease's fencing token is the newest the table's guard has seen for the day;
- the lake (`FencedS3Prefix`): the day's CSV goes up under a new version of `sales/{day}`, made current by
  a conditional swap of the prefix's manifest.

A run whose lease lapsed (paused, partitioned) and resumes after a newer run published is refused by both
stores with `StaleFencingToken`: nothing of it lands.

Configuration comes from the environment (a DSN or a key never sits in a parameter):
`VOLCANO_EXAMPLES_SQLALCHEMY_URL` (default: a SQLite file in the temp directory),
`VOLCANO_EXAMPLES_S3_BUCKET` (default `volcano-examples`), `VOLCANO_EXAMPLES_S3_ENDPOINT` (an
S3-compatible endpoint; unset, AWS) and boto3's usual `AWS_*` credentials.

    python flows/fenced_lake.py 2026-11-30
"""

from __future__ import annotations

import atexit
import csv
import functools
import io
import os
import sys
import tempfile
from typing import Any

import boto3
import sqlalchemy as sa
from prefect import flow, task

from prefect_volcano import current_lease, locked_task
from volcano_locks.fencing import FencedS3Prefix, FencedSQL

metadata = sa.MetaData()
daily_sales = sa.Table(
    "example_daily_sales",
    metadata,
    sa.Column("day", sa.String(128), primary_key=True),
    sa.Column("region", sa.String(20), primary_key=True),
    sa.Column("amount", sa.Integer, nullable=False),
    sa.Column("fencing_token", sa.BigInteger, nullable=False),
)


def warehouse() -> FencedSQL:
    """The fenced warehouse named by the environment: one engine and one FencedSQL per process and URL.

    Built on first use, with the table; every later run in the process reuses them, so a fenced write is
    one statement more than the plain one (the guard) and nothing else: no engine, catalog look-up or
    table creation per run. (The guard table is created the first time a claim finds it missing.)
    """
    default = f"sqlite:///{os.path.join(tempfile.gettempdir(), 'volcano_examples_warehouse.sqlite3')}"
    return _warehouse(os.environ.get("VOLCANO_EXAMPLES_SQLALCHEMY_URL") or default)


@functools.cache
def _warehouse(url: str) -> FencedSQL:
    engine = sa.create_engine(url)
    atexit.register(engine.dispose)  # the process's pooled connections, closed when it ends
    metadata.create_all(engine)
    return FencedSQL(engine)


def lake(day: str) -> FencedS3Prefix:
    """The day's fenced prefix in the bucket named by the environment (one S3 client per process)."""
    return FencedS3Prefix(
        _s3(os.environ.get("VOLCANO_EXAMPLES_S3_ENDPOINT") or None),
        os.environ.get("VOLCANO_EXAMPLES_S3_BUCKET", "volcano-examples"),
        f"sales/{day}",
    )


@functools.cache
def _s3(endpoint: str | None) -> Any:
    return boto3.client("s3", endpoint_url=endpoint)


@task
def extract(day: str) -> list[dict[str, Any]]:
    """The day's sales per region (a stand-in for a real source)."""
    return [{"region": r, "amount": len(day) * (i + 1)} for i, r in enumerate(("eu", "us", "apac"))]


@locked_task("sales:{day}", ttl=30, on_contention="wait", wait_timeout=300)
@task
def publish(day: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Replace the day in the warehouse and publish it to the lake, both fenced by this task's lease."""
    lease = current_lease()
    with warehouse().begin(f"sales:{day}", lease) as conn:  # the guard first, then our statements
        conn.execute(daily_sales.delete().where(daily_sales.c.day == day))
        conn.execute(
            daily_sales.insert(), [{**r, "day": day, "fencing_token": lease.fencing_token} for r in rows]
        )
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=["region", "amount"])
    writer.writeheader()
    writer.writerows(rows)
    manifest = lake(day).publish(lease, {"sales.csv": out.getvalue().encode()}, writer="fenced-lake")
    return {"day": day, "fencing_token": lease.fencing_token, "rows": len(rows), "version": manifest.version}


@flow(name="fenced-lake")
def fenced_lake(day: str) -> dict[str, Any]:
    """Extract the day's sales, then publish them to the warehouse and the lake under the day's lock."""
    return publish(day, extract(day))


if __name__ == "__main__":
    print(fenced_lake(sys.argv[1] if len(sys.argv) > 1 else "2026-11-30"))
