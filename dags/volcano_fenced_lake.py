"""A day's sales, published under one lock to a warehouse table and to an S3 prefix, both fenced.

The ``publish`` task holds ``sales:{{ ds }}``; the operator hands the callable its lease as
``volcano_lease``, and both fenced writes take it as it is (no token copied by hand):

- the warehouse (``FencedSQL``): the day's rows are replaced in one transaction that commits only while
  this lease's fencing token is the newest the table's guard has seen for the day;
- the lake (``FencedS3Prefix``): the day's CSV goes up under a new version of ``sales/<day>``, made
  current by a conditional swap of the prefix's manifest.

A task whose lease lapsed and resumes after a newer run published is refused by both stores with
``StaleFencingToken``: nothing of it lands. The engine could equally come from an Airflow SQL hook
(``PostgresHook(...).get_sqlalchemy_engine()``); here it comes from the environment, like the bucket:
``VOLCANO_EXAMPLES_SQLALCHEMY_URL`` (default: a SQLite file in the temp directory),
``VOLCANO_EXAMPLES_S3_BUCKET`` (default ``volcano-examples``), ``VOLCANO_EXAMPLES_S3_ENDPOINT`` (an
S3-compatible endpoint; unset, AWS) and boto3's usual ``AWS_*`` credentials.
"""

from __future__ import annotations

import atexit
import csv
import functools
import io
import os
import tempfile
from typing import Any

import boto3
import pendulum
import sqlalchemy as sa
from airflow.sdk import DAG, Param

from airflow_provider_volcano import VolcanoLockOperator
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


def publish(day: str, volcano_lease: dict) -> dict:
    """Replace the day in the warehouse and publish it to the lake, both fenced by this task's lease."""
    rows = [{"region": r, "amount": len(day) * (i + 1)} for i, r in enumerate(("eu", "us", "apac"))]
    token = volcano_lease["fencing_token"]
    with warehouse().begin(f"sales:{day}", volcano_lease) as conn:  # the guard, then our statements
        conn.execute(daily_sales.delete().where(daily_sales.c.day == day))
        conn.execute(daily_sales.insert(), [{**r, "day": day, "fencing_token": token} for r in rows])
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=["region", "amount"])
    writer.writeheader()
    writer.writerows(rows)
    manifest = lake(day).publish(volcano_lease, {"sales.csv": out.getvalue().encode()}, writer="fenced-lake")
    return {"day": day, "fencing_token": token, "rows": len(rows), "version": manifest.version}


with DAG(
    dag_id="volcano_fenced_lake",
    schedule="@daily",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    params={"day": Param("", type="string")},  # empty: the run's logical date
    tags=["volcano", "example"],
) as dag:
    VolcanoLockOperator(
        task_id="publish",
        lock_key="sales:{{ params.day or ds }}",
        ttl=30,
        on_contention="wait",
        python_callable=publish,
        op_kwargs={"day": "{{ params.day or ds }}"},
    )
