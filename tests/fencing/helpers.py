"""What the fenced-adapter tests write: a user's own two tables (SQL) or a prefix (S3), through the adapters.

One *write* is what a real job does in one go, so that "nothing partial" means something:

- SQL: one fenced transaction that appends ``PARTS`` rows to ``<name>_orders`` and bumps the resource's
  row in ``<name>_totals`` by a read-modify-write (SELECT, then UPDATE): a lost update would show as a
  total below the number of accepted writes.
- S3: one fenced publish of ``PARTS`` objects.

Shared by the tests and by ``adapter_worker.py`` (their processes), configured from the
environment (``FENCED_SQL_URL`` and ``FENCED_SQL_ASYNC``, ``FENCED_S3_BUCKET`` with
``VOLCANO_TEST_S3_ENDPOINT``) so that a DSN never sits in argv. SQL runs on every driver of ``DRIVERS``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from volcano_locks.fencing import AsyncFencedSQL, Fence, FencedS3Prefix, FencedSQL, Manifest, fence_of
from volcano_locks.fencing.sql import DEFAULT_STALL_TIMEOUT

PARTS = 3


DRIVERS: dict[str, str] = {
    "sqlite": "sqlite",
    "aiosqlite": "sqlite+aiosqlite",
    "psycopg": "postgresql+psycopg",
    "psycopg2": "postgresql+psycopg2",
    "asyncpg": "postgresql+asyncpg",
    "psycopg-async": "postgresql+psycopg",
}
"""Every SQLAlchemy driver FencedSQL / AsyncFencedSQL is tested on, by name, and its URL scheme."""
ASYNC_DRIVERS = frozenset({"aiosqlite", "asyncpg", "psycopg-async"})
PG_DRIVERS = ("psycopg", "psycopg2", "asyncpg", "psycopg-async")


def driver_url(driver: str, *, sqlite_file: Path | None = None, pg_dsn: str | None = None) -> str:
    """The SQLAlchemy URL of ``driver`` on a SQLite file or on the test PostgreSQL."""
    scheme = DRIVERS[driver]
    if scheme.startswith("sqlite"):
        assert sqlite_file is not None
        return f"{scheme}:///{sqlite_file}"
    assert pg_dsn is not None
    return f"{scheme}://{pg_dsn.split('://', 1)[1]}"


def pg_driver_params() -> list[Any]:
    """pytest params for the PostgreSQL drivers (marked ``postgres``)."""
    return [pytest.param(d, marks=pytest.mark.postgres) for d in PG_DRIVERS]


class SqlTarget:
    """A user's tables on one database and driver, and the fenced engine (sync or asyncio) over them.

    ``write`` is one fenced job (PARTS order rows and a read-modify-write of the total in one transaction);
    ``run`` plays a script of steps through ``begin`` or ``claim`` (the matrix of test_stale_writers). With
    an asyncio driver each call runs its own event loop (the engine has no pool, so no connection outlives
    the loop it was made on); reading back goes through a sync engine on the same database. ``autocommit``:
    the fenced engine's sessions autocommit (SQLAlchemy's ``isolation_level="AUTOCOMMIT"``).
    """

    def __init__(
        self,
        url: str,
        name: str,
        *,
        is_async: bool = False,
        stall_timeout: float | None = DEFAULT_STALL_TIMEOUT,
        sqlite_timeout: float = 30.0,
        autocommit: bool = False,
    ) -> None:
        self.url = url
        self.name = name
        self.is_async = is_async
        self.autocommit = autocommit
        args: dict[str, Any] = {"isolation_level": "AUTOCOMMIT"} if autocommit else {}
        if url.startswith("sqlite"):
            args["connect_args"] = {"timeout": sqlite_timeout}
        sync_url = sa.make_url(url)
        self._async_args = dict(args)
        self._stall_timeout = stall_timeout
        self._local = threading.local()
        self._async_engines: list[Any] = []
        if is_async:  # the sync twin, for creating and reading back
            sync_url = sync_url.set(drivername=sync_url.get_backend_name())
            args.pop("isolation_level", None)
        self.engine = sa.create_engine(sync_url, **args)
        if not is_async:
            self._sync_fenced = FencedSQL(
                self.engine, guard_table=f"{name}_guard", stall_timeout=stall_timeout
            )
        self.guard = FencedSQL(self.engine, guard_table=f"{name}_guard")  # for reading the guard back
        md = sa.MetaData()
        self.orders = sa.Table(
            f"{name}_orders",
            md,
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
            sa.Column("resource", sa.String(200), nullable=False),
            sa.Column("fencing_token", sa.BigInteger, nullable=False),
            sa.Column("writer", sa.String(100), nullable=False),
            sa.Column("part", sa.Integer, nullable=False),
        )
        self.totals = sa.Table(
            f"{name}_totals",
            md,
            sa.Column("resource", sa.String(200), primary_key=True),
            sa.Column("writes", sa.Integer, nullable=False),
            sa.Column("last_writer", sa.String(100), nullable=False),
        )
        self.metadata = md

    @property
    def fenced(self) -> Any:
        """The fenced engine: FencedSQL, or this thread's AsyncFencedSQL (an AsyncEngine serves one loop at a
        time, so each thread that writes has its own, as each process of a fleet would)."""
        if not self.is_async:
            return self._sync_fenced
        fenced = getattr(self._local, "fenced", None)
        if fenced is None:
            engine = create_async_engine(self.url, poolclass=NullPool, **self._async_args)
            self._async_engines.append(engine)
            fenced = self._local.fenced = AsyncFencedSQL(
                engine, guard_table=f"{self.name}_guard", stall_timeout=self._stall_timeout
            )
        return fenced

    @property
    def async_engine(self) -> Any:
        """This thread's AsyncEngine (asyncio drivers only)."""
        return self.fenced.engine

    @classmethod
    def from_env(cls, name: str) -> SqlTarget:
        """The target named ``name`` on ``$FENCED_SQL_URL`` (asyncio when ``$FENCED_SQL_ASYNC`` is 1)."""
        return cls(os.environ["FENCED_SQL_URL"], name, is_async=os.environ.get("FENCED_SQL_ASYNC") == "1")

    def env(self) -> dict[str, str]:
        """What a worker process needs to open this target with :meth:`from_env`."""
        return {"FENCED_SQL_URL": self.url, "FENCED_SQL_ASYNC": "1" if self.is_async else "0"}

    def create(self) -> None:
        """Create the user's tables (the guard table is the fenced engine's to create)."""
        self.metadata.create_all(self.engine)

    def drop(self) -> None:
        """Drop them all and dispose of the engines."""
        self.metadata.drop_all(self.engine)
        self.guard.table.drop(self.engine, checkfirst=True)
        self.close()

    def close(self) -> None:
        """Dispose of the engines."""
        self.engine.dispose()
        for engine in self._async_engines:
            asyncio.run(engine.dispose())

    # -- one fenced job ------------------------------------------------------------------------------

    def write(self, resource: str, lease: object, writer: str, *, pause: float = 0.0) -> None:
        """One fenced job: PARTS order rows and a read-modify-write of the total, in one transaction."""
        if self.is_async:
            asyncio.run(self._awrite(resource, lease, writer, pause))
            return
        with self.fenced.begin(resource, lease) as conn:
            token = fence_of(lease).fencing_token
            for statement in self._rows(resource, token, writer):
                conn.execute(statement)
            seen = conn.execute(self._seen(resource)).scalar_one_or_none()
            time.sleep(pause)  # widen the read-modify-write window: a missing guard would lose updates here
            conn.execute(self._bump(resource, writer, seen))

    async def _awrite(self, resource: str, lease: object, writer: str, pause: float) -> None:
        async with self.fenced.begin(resource, lease) as conn:
            token = fence_of(lease).fencing_token
            for statement in self._rows(resource, token, writer):
                await conn.execute(statement)
            seen = (await conn.execute(self._seen(resource))).scalar_one_or_none()
            await asyncio.sleep(pause)
            await conn.execute(self._bump(resource, writer, seen))

    def _rows(self, resource: str, token: int, writer: str, batch: int = 0) -> list[Any]:
        return [
            self.orders.insert().values(
                resource=resource, fencing_token=token, writer=writer, part=batch * PARTS + part
            )
            for part in range(PARTS)
        ]

    def _seen(self, resource: str) -> Any:
        return sa.select(self.totals.c.writes).where(self.totals.c.resource == resource)

    def _bump(self, resource: str, writer: str, seen: int | None) -> Any:
        if seen is None:
            return self.totals.insert().values(resource=resource, writes=1, last_writer=writer)
        t = self.totals
        return t.update().where(t.c.resource == resource).values(writes=seen + 1, last_writer=writer)

    # -- a scripted writer -----------------------------------------------------------------------------

    def run(self, script: Script) -> None:
        """Play ``script`` to its end, or to the exception one of its steps raised (recorded on it)."""
        try:
            if self.is_async:
                asyncio.run(self._arun(script))
            else:
                self._run(script)
        except BaseException as exc:
            script.error = exc
        finally:
            script.done.set()

    def _run(self, script: Script) -> None:
        with contextlib.ExitStack() as stack:
            if script.mode == "begin":
                script.pause_at("before")
                conn = stack.enter_context(self.fenced.begin(script.resource, script.fence))
            else:
                conn = stack.enter_context(self.engine.connect())
                script.pause_at("before")
                stack.enter_context(self.fenced.claim(conn, script.resource, script.fence))
            for i, step in enumerate(script.steps):
                if step == "write":
                    for statement in self._rows(
                        script.resource, script.fence.fencing_token, script.writer, i
                    ):
                        conn.execute(statement)
                    script.ran_steps.append(i)
                elif step == "commit":
                    conn.commit()
                else:
                    script.pause_at(step)
            if script.mode == "claim":
                conn.commit()

    async def _arun(self, script: Script) -> None:
        async with contextlib.AsyncExitStack() as stack:
            if script.mode == "begin":
                await asyncio.to_thread(script.pause_at, "before")
                conn = await stack.enter_async_context(self.fenced.begin(script.resource, script.fence))
            else:
                conn = await stack.enter_async_context(self.async_engine.connect())
                await asyncio.to_thread(script.pause_at, "before")
                stack.enter_context(await self.fenced.claim(conn, script.resource, script.fence))
            for i, step in enumerate(script.steps):
                if step == "write":
                    for statement in self._rows(
                        script.resource, script.fence.fencing_token, script.writer, i
                    ):
                        await conn.execute(statement)
                    script.ran_steps.append(i)
                elif step == "commit":
                    await conn.commit()
                else:
                    await asyncio.to_thread(script.pause_at, step)
            if script.mode == "claim":
                await conn.commit()

    # -- reading back -------------------------------------------------------------------------------

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


@dataclass
class Script:
    """What a scripted writer does: its fence, ``begin`` or ``claim`` (autocommit or not), then its steps.

    Steps: ``write`` (PARTS order rows), ``commit`` (commit-as-you-go), or a pause name: the writer sets
    ``paused`` and waits for ``resume`` (a real pause: it holds whatever it holds meanwhile). ``before`` is a
    pause before the claim. ``ran_steps`` are the writes whose statements returned (not necessarily
    committed); ``error`` is what stopped it.
    """

    resource: str
    fence: Fence
    writer: str
    mode: str
    steps: tuple[str, ...]
    pauses: frozenset[str] = frozenset()
    paused: threading.Event = field(default_factory=threading.Event)
    resume: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    ran_steps: list[int] = field(default_factory=list)
    error: BaseException | None = None

    def pause_at(self, name: str) -> None:
        """Pause here if ``name`` is one of this script's pauses."""
        if name in self.pauses:
            self.paused.set()
            if not self.resume.wait(60):
                raise TimeoutError(f"{self.writer} was never resumed from {name!r}")


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
