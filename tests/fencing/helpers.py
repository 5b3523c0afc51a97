"""What the fenced-adapter tests write: a user's own two tables (SQL) or a prefix (S3), through the adapters.

One *write* is what a real job does in one go, so that "nothing partial" means something:

- SQL: one fenced transaction that appends ``PARTS`` rows to ``<name>_orders`` and bumps the resource's
  row in ``<name>_totals`` by a read-modify-write (SELECT, then UPDATE): a lost update would show as a
  total below the number of accepted writes.
- S3: one fenced publish of ``PARTS`` objects.

Shared by the tests and by ``adapter_worker.py`` (their processes), configured from the
environment (``FENCED_SQL_URL``, ``FENCED_S3_BUCKET`` with ``VOLCANO_TEST_S3_ENDPOINT``) so that a DSN never
sits in argv.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from volcano_locks.fencing import FencedS3Prefix, FencedSQL, Manifest, fence_of

PARTS = 3


@dataclass
class SqlTarget:
    """A user's tables and the fenced engine over them."""

    engine: sa.Engine
    name: str

    def __post_init__(self) -> None:
        md = sa.MetaData()
        self.orders = sa.Table(
            f"{self.name}_orders",
            md,
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
            sa.Column("resource", sa.String(200), nullable=False),
            sa.Column("fencing_token", sa.BigInteger, nullable=False),
            sa.Column("writer", sa.String(100), nullable=False),
            sa.Column("part", sa.Integer, nullable=False),
        )
        self.totals = sa.Table(
            f"{self.name}_totals",
            md,
            sa.Column("resource", sa.String(200), primary_key=True),
            sa.Column("writes", sa.Integer, nullable=False),
            sa.Column("last_writer", sa.String(100), nullable=False),
        )
        self.metadata = md
        self.fenced = FencedSQL(self.engine, guard_table=f"{self.name}_guard")

    def create(self) -> None:
        """Create the user's tables and the guard table."""
        self.metadata.create_all(self.engine)
        self.fenced.create_guard_table()

    def drop(self) -> None:
        """Drop them all."""
        self.metadata.drop_all(self.engine)
        self.fenced.table.drop(self.engine, checkfirst=True)

    def write(self, resource: str, lease: object, writer: str, *, pause: float = 0.0) -> None:
        """One fenced job: PARTS order rows and a read-modify-write of the total, in one transaction."""
        with self.fenced.begin(resource, lease) as conn:
            token = fence_of(lease).fencing_token
            for part in range(PARTS):
                conn.execute(
                    self.orders.insert().values(
                        resource=resource, fencing_token=token, writer=writer, part=part
                    )
                )
            seen = conn.execute(
                sa.select(self.totals.c.writes).where(self.totals.c.resource == resource)
            ).scalar_one_or_none()
            time.sleep(pause)  # widen the read-modify-write window: a missing guard would lose updates here
            if seen is None:
                conn.execute(self.totals.insert().values(resource=resource, writes=1, last_writer=writer))
            else:
                conn.execute(
                    self.totals.update()
                    .where(self.totals.c.resource == resource)
                    .values(writes=seen + 1, last_writer=writer)
                )

    def orders_of(self, resource: str) -> list[tuple[int, str, int]]:
        """(fencing_token, writer, part) of every order row of ``resource``, in insertion order."""
        o = self.orders.c
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(o.fencing_token, o.writer, o.part).where(o.resource == resource).order_by(o.id)
            ).all()
        return [(int(t), str(w), int(p)) for t, w, p in rows]

    def total_of(self, resource: str) -> tuple[int, str] | None:
        """(writes, last_writer) of ``resource``'s total row."""
        t = self.totals.c
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(t.writes, t.last_writer).where(t.resource == resource)).first()
        return None if row is None else (int(row[0]), str(row[1]))


def sql_engine(url: str) -> sa.Engine:
    """An engine for ``url``; SQLite waits up to 30 s for the write lock instead of the default 5 s."""
    if url.startswith("sqlite"):
        return sa.create_engine(url, connect_args={"timeout": 30})
    return sa.create_engine(url, pool_size=10)


def sql_target_from_env(name: str) -> SqlTarget:
    """The target named ``name`` on ``$FENCED_SQL_URL``."""
    return SqlTarget(sql_engine(os.environ["FENCED_SQL_URL"]), name)


def s3_publish(prefix: FencedS3Prefix, lease: object, writer: str) -> Manifest:
    """One fenced job on S3: PARTS objects in one publish."""
    files = {f"part-{i}.txt": f"{writer}:{i}".encode() for i in range(PARTS)}
    return prefix.publish(lease, files, writer=writer)


def s3_prefix_from_env(prefix: str) -> FencedS3Prefix:
    """The fenced ``prefix`` in ``$FENCED_S3_BUCKET`` on ``$VOLCANO_TEST_S3_ENDPOINT``."""
    from tests.fencing.s3_server import client_from_env

    return FencedS3Prefix(client_from_env(), os.environ["FENCED_S3_BUCKET"], prefix)


def s3_keys(client: Any, bucket: str, prefix: str) -> list[str]:
    """Every key under ``prefix`` now."""
    keys: list[str] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/"):
        keys.extend(o["Key"] for o in page.get("Contents", []))
    return sorted(keys)
