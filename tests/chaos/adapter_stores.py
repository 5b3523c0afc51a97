"""The fenced adapters as chaos-protected resources: every chaos write also goes through them.

Beside the shared ``FencedTable`` (``fenced_store.py``), each worker writes every attempt through

- ``sql``: :class:`~volcano_locks.fencing.FencedSQL` on a user table of its own (``<table>_sqla_log``):
  one fenced transaction appends the attempt and bumps ``<table>_sqla_total`` (two statements of the
  user's, after the guard). A refused attempt is appended afterwards, outside the transaction, as
  ``accepted = false``, so the checker sees it.
- ``sql-async``: the same through :class:`~volcano_locks.fencing.AsyncFencedSQL` on SQLAlchemy's asyncio
  engines (asyncpg; aiosqlite on a SQLite file of its own), tables ``<table>_sqlaa_*``.
- ``s3``: :class:`~volcano_locks.fencing.FencedS3Prefix` on a prefix in a versioned bucket of the run's moto
  server: one publish of ``value.json`` per attempt. Accepted attempts are the manifest's versions (its
  ``generation`` orders them); a refused one is recorded as ``attempts/<id>.json`` with the generation it
  was refused at.

Each store gives the same interface as :class:`~tests.chaos.fenced_store.FencedStore` (``write``,
``current``, ``writes``, ``drop``, ``close``), with ``seq`` numbering attempts in the order they took
effect, so the one checker reads all three.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from volcano_locks.fencing import Fence, FencedS3Prefix, FencedSQL, StaleFencingToken
from volcano_locks.fencing.sql import DEFAULT_STALL_TIMEOUT

from .fenced_store import RESOURCE, WriteRow, open_store

__all__ = ["ADAPTERS", "AsyncSqlStore", "S3Store", "SqlStore", "open_stores"]

ADAPTERS = ("sql", "sql-async", "s3")


def _sqlalchemy_url(url: str, *, is_async: bool = False) -> str:
    if url.startswith(("postgresql://", "postgres://")):
        return ("postgresql+asyncpg://" if is_async else "postgresql+psycopg://") + url.split("://", 1)[1]
    path = url.removeprefix("sqlite:")
    root, _ = os.path.splitext(path)
    # Its own file: the SQLite write lock is per database.
    return f"sqlite+aiosqlite:///{root}-sqla-async.sqlite3" if is_async else f"sqlite:///{root}-sqla.sqlite3"


class SqlStore:
    """The chaos resource as a user's own tables behind FencedSQL.

    ``stall_timeout`` is FencedSQL's (PostgreSQL); ``sqlite_timeout`` the SQLite busy timeout: the two
    bounds on how long a writer waits behind one paused inside its transaction.
    """

    is_async = False
    infix = "sqla"

    def __init__(
        self,
        url: str,
        table: str,
        lock_key: str,
        *,
        stall_timeout: float | None = DEFAULT_STALL_TIMEOUT,
        sqlite_timeout: float = 30.0,
    ) -> None:
        """Use ``<table>_<infix>_*`` in the database of ``url`` (a SQLite path or a PostgreSQL DSN)."""
        sync_url = sa.make_url(_sqlalchemy_url(url, is_async=self.is_async))
        args: dict[str, Any] = {}
        if sync_url.get_backend_name() == "sqlite":
            args["connect_args"] = {"timeout": sqlite_timeout}
        if self.is_async:
            # Imported here, not with the module: SQLAlchemy's asyncio package brings its ORM along (seconds
            # on a loaded machine), and a chaos worker imports this module before it can take a SIGTERM.
            from sqlalchemy.ext.asyncio import create_async_engine

            from volcano_locks.fencing import AsyncFencedSQL

            self.async_engine = create_async_engine(sync_url, poolclass=NullPool, **args)
            self.async_fenced = AsyncFencedSQL(
                self.async_engine, guard_table=f"{table}_{self.infix}_guard", stall_timeout=stall_timeout
            )
            sync_url = sync_url.set(drivername=sync_url.get_backend_name())  # for creating and reading
        self.engine = sa.create_engine(sync_url, **args)
        table = f"{table}_{self.infix}"
        md = sa.MetaData()
        self.log = sa.Table(
            f"{table}_log",
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
            f"{table}_total",
            md,
            sa.Column("resource", sa.String(64), primary_key=True),
            sa.Column("writes", sa.Integer, nullable=False),
        )
        self.metadata = md
        self.fenced = FencedSQL(self.engine, guard_table=f"{table}_guard", stall_timeout=stall_timeout)
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

    def write(
        self,
        token: int,
        value: str,
        *,
        writer: str,
        cs: int,
        late: bool = False,
        inside: Callable[[], None] | None = None,
    ) -> bool:
        """Attempt one fenced write; return whether it was accepted.

        ``inside`` runs within the fenced transaction, after its first statement (a pause there holds the
        guard: ``test_long_pause``).
        """
        self._create()
        row = {"fencing_token": token, "value": value, "writer": writer, "cs": cs, "late": late}
        try:
            self._fenced_write(Fence(self.lock_key, token), row, inside)
        except StaleFencingToken:
            with self.engine.begin() as conn:
                conn.execute(self.log.insert().values(**row, accepted=False))
            return False
        return True

    def _statements(self, row: dict[str, Any]) -> tuple[Any, Any, Any]:
        """The user's statements: log the attempt, bump the total (or insert it when there is none)."""
        t = self.total
        bump = t.update().where(t.c.resource == RESOURCE).values(writes=t.c.writes + 1)
        return (
            self.log.insert().values(**row, accepted=True),
            bump,
            t.insert().values(resource=RESOURCE, writes=1),
        )

    def _fenced_write(self, fence: Fence, row: dict[str, Any], inside: Callable[[], None] | None) -> None:
        log, bump, first = self._statements(row)
        with self.fenced.begin(RESOURCE, fence) as conn:
            conn.execute(log)
            if inside is not None:
                inside()
            if conn.execute(bump).rowcount == 0:
                conn.execute(first)

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


class AsyncSqlStore(SqlStore):
    """The chaos resource behind AsyncFencedSQL (asyncpg, aiosqlite); each write runs its own event loop."""

    is_async = True
    infix = "sqlaa"

    def _fenced_write(self, fence: Fence, row: dict[str, Any], inside: Callable[[], None] | None) -> None:
        log, bump, first = self._statements(row)

        async def write() -> None:
            async with self.async_fenced.begin(RESOURCE, fence) as conn:
                await conn.execute(log)
                if inside is not None:
                    inside()  # a pause here blocks the loop too: the whole process is paused
                if (await conn.execute(bump)).rowcount == 0:
                    await conn.execute(first)

        asyncio.run(write())

    def close(self) -> None:
        """Dispose of both engines."""
        super().close()
        asyncio.run(self.async_engine.dispose())


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
        """The prefix's (fencing_token, value) now, read from one snapshot."""
        snapshot = self.prefix.snapshot()
        if snapshot is None:
            return (0, "")
        return snapshot.manifest.fencing_token, json.loads(snapshot.read("value.json"))["v"]

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
    stores["sql-async"] = AsyncSqlStore(url, table, lock_key)
    if s3_bucket:
        from tests.fencing.s3_server import client_for

        endpoint = s3_endpoint or os.environ["VOLCANO_TEST_S3_ENDPOINT"]
        stores["s3"] = S3Store(client_for(endpoint), s3_bucket, table, lock_key)
    return stores
