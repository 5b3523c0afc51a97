"""The fenced adapters as chaos-protected resources: every chaos write also goes through them.

Beside the shared ``FencedTable`` (``fenced_store.py``), each worker writes every attempt through

- ``sql``: :class:`~volcano_locks.fencing.FencedSQL` on a user table of its own (``<table>_sqla_log``):
  one fenced transaction appends the attempt and bumps ``<table>_sqla_total`` (two statements of the
  user's, after the guard). A refused attempt is appended afterwards, outside the transaction, as
  ``accepted = false``, so the checker sees it.
- ``s3``: :class:`~volcano_locks.fencing.FencedS3Prefix` on a prefix in a versioned bucket of the run's moto
  server: one publish of ``value.json`` per attempt. Accepted attempts are the manifest's versions (its
  ``generation`` orders them); a refused one is recorded as ``attempts/<id>.json`` with the generation it
  was refused at.

Each store gives the same interface as :class:`~tests.chaos.fenced_store.FencedStore` (``write``,
``current``, ``writes``, ``drop``, ``close``), with ``seq`` numbering attempts in the order they took
effect, so the one checker reads all three.
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Any

import sqlalchemy as sa

from volcano_locks.fencing import Fence, FencedS3Prefix, FencedSQL, StaleFencingToken

from .fenced_store import RESOURCE, WriteRow, open_store

__all__ = ["ADAPTERS", "S3Store", "SqlStore", "open_stores"]

ADAPTERS = ("sql", "s3")


def _sqlalchemy_url(url: str) -> str:
    if url.startswith(("postgresql://", "postgres://")):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    path = url.removeprefix("sqlite:")
    root, _ = os.path.splitext(path)
    return f"sqlite:///{root}-sqla.sqlite3"  # its own file: the SQLite write lock is per database


class SqlStore:
    """The chaos resource as a user's own tables behind FencedSQL."""

    def __init__(self, url: str, table: str, lock_key: str) -> None:
        """Use ``<table>_sqla_*`` in the database of ``url`` (a SQLite path or a PostgreSQL DSN)."""
        sa_url = _sqlalchemy_url(url)
        self.engine = sa.create_engine(
            sa_url, **({"connect_args": {"timeout": 30}} if "sqlite" in sa_url else {})
        )
        md = sa.MetaData()
        self.log = sa.Table(
            f"{table}_sqla_log",
            md,
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
            sa.Column("fencing_token", sa.BigInteger, nullable=False),
            sa.Column("value", sa.Text, nullable=False),
            sa.Column("writer", sa.String(64), nullable=False),
            sa.Column("cs", sa.Integer, nullable=False),
            sa.Column("late", sa.Boolean, nullable=False),
            sa.Column("accepted", sa.Boolean, nullable=False),
        )
        self.total = sa.Table(
            f"{table}_sqla_total",
            md,
            sa.Column("resource", sa.String(64), primary_key=True),
            sa.Column("writes", sa.Integer, nullable=False),
        )
        self.metadata = md
        self.fenced = FencedSQL(self.engine, guard_table=f"{table}_sqla_guard")
        self.lock_key = lock_key
        self._ready = False

    def _create(self) -> None:
        if not self._ready:
            self.fenced.create_guard_table()  # serialised on PostgreSQL: creators may race
            with self.engine.begin() as conn:
                if self.engine.dialect.name == "postgresql":
                    conn.execute(sa.text("SELECT pg_advisory_xact_lock(hashtext(:n))"), {"n": self.log.name})
                self.metadata.create_all(conn)
            self._ready = True

    def write(self, token: int, value: str, *, writer: str, cs: int, late: bool = False) -> bool:
        """Attempt one fenced write; return whether it was accepted."""
        self._create()
        row = {"fencing_token": token, "value": value, "writer": writer, "cs": cs, "late": late}
        try:
            with self.fenced.begin(RESOURCE, Fence(self.lock_key, token)) as conn:
                conn.execute(self.log.insert().values(**row, accepted=True))
                bumped = conn.execute(
                    self.total.update()
                    .where(self.total.c.resource == RESOURCE)
                    .values(writes=self.total.c.writes + 1)
                )
                if bumped.rowcount == 0:
                    conn.execute(self.total.insert().values(resource=RESOURCE, writes=1))
        except StaleFencingToken:
            with self.engine.begin() as conn:
                conn.execute(self.log.insert().values(**row, accepted=False))
            return False
        return True

    def current(self) -> tuple[int, str]:
        """The resource's (fencing_token, value) now: the last accepted row."""
        self._create()
        c = self.log.c
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(c.fencing_token, c.value).where(c.accepted).order_by(c.id.desc()).limit(1)
            ).first()
        return (0, "") if row is None else (int(row[0]), str(row[1]))

    def writes(self) -> list[WriteRow]:
        """Every attempt in the order it took effect (the log's id order)."""
        self._create()
        c = self.log.c
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(c.fencing_token, c.value, c.writer, c.cs, c.late, c.accepted).order_by(c.id)
            ).all()
            total = conn.execute(sa.select(self.total.c.writes)).scalar_one_or_none() or 0
        out = [
            WriteRow(i, int(t), v, w, int(cs), bool(late), bool(acc))
            for i, (t, v, w, cs, late, acc) in enumerate(rows, 1)
        ]
        accepted = sum(r.accepted for r in out)
        if total != accepted:  # the user's second statement committed exactly with the first
            raise AssertionError(f"sql store: total {total} but {accepted} accepted rows (a partial write)")
        return out

    def drop(self) -> None:
        """Drop the tables (the SQLite file stays with the run's logs)."""
        if self.engine.dialect.name == "postgresql":
            self.metadata.drop_all(self.engine)
            self.fenced.table.drop(self.engine, checkfirst=True)

    def close(self) -> None:
        """Dispose of the engine's connections."""
        self.engine.dispose()


class S3Store:
    """The chaos resource as an S3 prefix behind FencedS3Prefix (a versioned bucket on the run's moto)."""

    def __init__(self, client: Any, bucket: str, table: str, lock_key: str) -> None:
        """Use prefix ``table`` in ``bucket``."""
        self.client = client
        self.bucket = bucket
        self.prefix = FencedS3Prefix(client, bucket, table, max_swaps=50)
        self.lock_key = lock_key

    def write(self, token: int, value: str, *, writer: str, cs: int, late: bool = False) -> bool:
        """Attempt one fenced publish; return whether it was accepted."""
        meta = {"fencing_token": token, "v": value, "writer": writer, "cs": cs, "late": late}
        try:
            self.prefix.publish(
                Fence(self.lock_key, token), {"value.json": json.dumps(meta).encode()}, writer=writer
            )
        except StaleFencingToken as exc:
            stored = exc.stored
            record = {**meta, "generation": getattr(stored, "generation", 0)}
            key = f"{self.prefix.prefix}-attempts/{uuid.uuid4().hex}.json"
            self.client.put_object(Bucket=self.bucket, Key=key, Body=json.dumps(record).encode())
            return False
        return True

    def current(self) -> tuple[int, str]:
        """The prefix's (fencing_token, value) now."""
        m = self.prefix.current()
        return (0, "") if m is None else (m.fencing_token, json.loads(self.prefix.read("value.json"))["v"])

    def writes(self) -> list[WriteRow]:
        """Accepted publishes by generation; each refused one right after the generation it was refused at."""
        keyed: list[tuple[tuple[int, int], dict[str, Any], bool]] = []
        versions = self.client.get_paginator("list_object_versions")
        for page in versions.paginate(Bucket=self.bucket, Prefix=self.prefix.manifest_key):
            for v in page.get("Versions", []):
                body = self.client.get_object(Bucket=self.bucket, Key=v["Key"], VersionId=v["VersionId"])[
                    "Body"
                ]
                manifest = json.loads(body.read())
                data_key = f"{self.prefix.prefix}/versions/{manifest['version']}/value.json"
                meta = json.loads(self.client.get_object(Bucket=self.bucket, Key=data_key)["Body"].read())
                keyed.append(((int(manifest["generation"]), 0), meta, True))
        attempts = self.client.get_paginator("list_objects_v2")
        for page in attempts.paginate(Bucket=self.bucket, Prefix=f"{self.prefix.prefix}-attempts/"):
            for o in page.get("Contents", []):
                record = json.loads(self.client.get_object(Bucket=self.bucket, Key=o["Key"])["Body"].read())
                keyed.append(((int(record["generation"]), 1), record, False))
        keyed.sort(key=lambda k: k[0])
        return [
            WriteRow(i, int(m["fencing_token"]), m["v"], m["writer"], int(m["cs"]), bool(m["late"]), accepted)
            for i, (_, m, accepted) in enumerate(keyed, 1)
        ]

    def drop(self) -> None:
        """Nothing to drop: the bucket dies with the run's moto server."""

    def close(self) -> None:
        """Nothing to close: the client is shared."""


def open_stores(
    url: str, table: str, lock_key: str, s3_bucket: str | None, *, s3_endpoint: str | None = None
) -> dict[str, Any]:
    """The chaos resource in every store: ``table`` (FencedTable), ``sql`` and, given a bucket, ``s3``.

    The S3 endpoint is ``s3_endpoint``, else ``$VOLCANO_TEST_S3_ENDPOINT`` (what a worker is given).
    """
    stores: dict[str, Any] = {"table": open_store(url, table, lock_key=lock_key)}
    stores["sql"] = SqlStore(url, table, lock_key)
    if s3_bucket:
        from tests.fencing.s3_server import client_for

        endpoint = s3_endpoint or os.environ["VOLCANO_TEST_S3_ENDPOINT"]
        stores["s3"] = S3Store(client_for(endpoint), s3_bucket, table, lock_key)
    return stores
