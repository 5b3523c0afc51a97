"""The run-once ledger in your SQL database: the record commits in the same transaction as your effect.

:meth:`SQLLedger.begin` opens a fenced transaction (:class:`~volcano_locks.fencing.FencedSQL`, on the
resource you name, the business key by default), refuses at once if the key is already recorded
(:class:`~volcano_locks.once.AlreadyDone`, naming the first run), yields an :class:`Effect` whose
``connection`` runs your statements, and inserts the ledger row just before the commit. Your statements and
the record commit together or not at all:

- a retry after the commit finds the record and does nothing;
- a process killed before the commit leaves neither (the next run does the effect);
- a stale holder (its lock lapsed, another took over) is refused by the guard before any statement of its
  own ran, and a writer fenced on another resource still meets the ledger's primary key at insert time.

That is exactly-once for effects inside this database. :class:`AsyncSQLLedger` is the same on SQLAlchemy's
asyncio engines: the statements (``_sql_table``) run on the async connection's sync face, as
``AsyncFencedSQL`` does.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection, Engine

from volcano_locks.fencing._fence import fence_of
from volcano_locks.fencing.sql import AsyncFencedSQL, FencedSQL
from volcano_locks.once._record import (
    AuditEntry,
    OnceRecord,
    Who,
    already_done,
    bound_lease,
    check_forget,
    check_list,
    check_result,
    validate_business_key,
)
from volcano_locks.once._sql_table import DEFAULT_LEDGER_TABLE, LedgerTables

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["AsyncSQLLedger", "AsyncSQLOnce", "Effect", "SQLLedger", "SQLOnce"]


def _utc_now() -> datetime:
    return datetime.now(UTC)


class Effect:
    """The effect of one business key, inside its fenced transaction.

    Attributes:
        connection: the transaction's connection (sync ``Connection``, or ``AsyncConnection`` for
            :class:`AsyncSQLLedger`): run your statements on it.
        business_key: the key being done.
        result: set it to a small JSON value (a row count, a path) to record with the key; duplicates get it.
        record: the record written, once the transaction committed (``None`` before).
    """

    def __init__(self, connection: Any, business_key: str) -> None:
        self.connection = connection
        self.business_key = business_key
        self.result: Any = None
        self.record: OnceRecord | None = None

    def __repr__(self) -> str:
        return f"Effect({self.business_key!r}, committed={self.record is not None})"


class _Ledger:
    """What both faces share: the argument checks, the tables, the record, the forget's audit fields."""

    def __init__(
        self,
        fenced: FencedSQL | AsyncFencedSQL,
        *,
        table: str = DEFAULT_LEDGER_TABLE,
        schema: str | None = None,
        clock: Callable[[], datetime] = _utc_now,
    ) -> None:
        self.fenced = fenced
        self.tables = LedgerTables(fenced.engine.dialect.name == "postgresql", table, schema)
        self.clock = clock

    def __repr__(self) -> str:
        dialect, table = self.fenced.engine.dialect.name, self.tables.ledger.fullname
        return f"{type(self).__name__}({dialect!r}, table={table!r})"

    def _record(self, business_key: str, lease: object, who: Who, result: Any) -> OnceRecord:
        fence = fence_of(lease)
        return OnceRecord(
            business_key, fence.lock_key, fence.fencing_token, self.clock(), who, check_result(result)
        )

    def _insert_or_refuse(self, conn: Connection, record: OnceRecord) -> None:
        if not self.tables.insert(conn, record):
            first = self.tables.lookup(conn, record.business_key)
            raise already_done(first if first is not None else record)

    def _refuse_if_done(self, conn: Connection, business_key: str) -> None:
        first = self.tables.lookup(conn, business_key)
        if first is not None:
            raise already_done(first)

    def _prepare(self, conn: Connection) -> None:
        if not self.tables.exists(conn):
            with conn.engine.begin() as own:  # its own transaction, committed at once: every session sees it
                self.tables.create(own)
            self.tables.ready = True


class SQLLedger(_Ledger):
    """A run-once ledger beside your data, on a sync SQLAlchemy engine (PostgreSQL or SQLite).

    Args:
        engine: your engine, or a :class:`~volcano_locks.fencing.FencedSQL` over it (to share its guard
            table and stall bound).
        table: the ledger table's name (``<table>_audit`` is its audit table); created when missing.
        schema: their schema, if not the default one.
        clock: the wall clock (aware UTC) of ``done_at`` and the audit's ``at``.

    Example:
        >>> ledger = SQLLedger(engine)  # doctest: +SKIP
        >>> with locks.with_lock("rollup", ttl=60, once=ledger.once("rollup:2026-12-01")) as guard:
        ...     if guard.duplicate is None:
        ...         with guard.once.begin() as effect:
        ...             effect.connection.execute(insert_rollup)
        ...             effect.result = {"rows": 42}
    """

    fenced: FencedSQL

    def __init__(
        self,
        engine: Engine | FencedSQL,
        *,
        table: str = DEFAULT_LEDGER_TABLE,
        schema: str | None = None,
        clock: Callable[[], datetime] = _utc_now,
    ) -> None:
        fenced = engine if isinstance(engine, FencedSQL) else FencedSQL(engine)
        super().__init__(fenced, table=table, schema=schema, clock=clock)

    def once(self, business_key: str, *, who: Who | None = None) -> SQLOnce:
        """``business_key`` on this ledger, done by ``who`` (this process: ``None``), for ``with_lock``."""
        return SQLOnce(self, validate_business_key(business_key), who or Who.here())

    def create_tables(self) -> None:
        """Create the ledger and audit tables now if missing (``begin`` does it when it needs to)."""
        with self.fenced.engine.connect() as conn:
            self._prepare(conn)

    @contextmanager
    def begin(
        self, business_key: str, lease: object, *, who: Who | None = None, resource: str | None = None
    ) -> Iterator[Effect]:
        """Do ``business_key``'s effect once: a fenced transaction that records the key as it commits.

        Args:
            business_key: what is done once.
            lease: the lease it is done under (any form :func:`~volcano_locks.fencing.fence_of` takes).
            who: the run doing it (this process when ``None``).
            resource: the fenced resource (default: the business key).

        Raises:
            AlreadyDone: the key is recorded (before your statements run, or at the insert); nothing of
                this transaction committed; ``.record`` is the first run's.
            StaleFencingToken: a newer token wrote the resource; nothing was written.
        """
        key = validate_business_key(business_key)
        who = who or Who.here()
        fence_of(lease)  # the lease is checked where it is given
        if not self.tables.ready:
            self.create_tables()
        with self.fenced.begin(resource or key, lease) as conn:
            self._refuse_if_done(conn, key)
            effect = Effect(conn, key)
            yield effect
            record = self._record(key, lease, who, effect.result)
            self._insert_or_refuse(conn, record)
        effect.record = record

    def lookup(self, business_key: str) -> OnceRecord | None:
        """The record of ``business_key``, or ``None`` if it was never done (or was forgotten)."""
        key = validate_business_key(business_key)
        with self.fenced.engine.connect() as conn:
            return self.tables.lookup(conn, key)

    def records(self, *, prefix: str | None = None, limit: int = 100) -> list[OnceRecord]:
        """The records, newest first: those whose key starts with ``prefix``, at most ``limit``."""
        check_list(prefix, limit)
        with self.fenced.engine.connect() as conn:
            return self.tables.records(conn, prefix, limit)

    def forget(self, business_key: str, *, by: str, why: str) -> OnceRecord | None:
        """Delete ``business_key``'s record so a run may do it again; audited (who, when, why).

        Returns the record forgotten, or ``None`` if there was none (nothing is audited then).
        """
        key, by, why = check_forget(business_key, by, why)
        with self.fenced.engine.begin() as conn:
            return self.tables.forget(conn, key, by, why, self.clock())

    def audit(self, business_key: str | None = None, *, limit: int = 100) -> list[AuditEntry]:
        """The audit trail of forgets (of one key, or all), newest first."""
        if business_key is not None:
            validate_business_key(business_key)
        check_list(None, limit)
        with self.fenced.engine.connect() as conn:
            return self.tables.history(conn, business_key, limit)


class AsyncSQLLedger(_Ledger):
    """:class:`SQLLedger` on SQLAlchemy's asyncio engines (asyncpg, psycopg's async side, aiosqlite).

    The same tables and statements, run on the async connection's sync face; methods are coroutines and
    :meth:`begin` is an async context manager. Arguments as for :class:`SQLLedger` (an ``AsyncEngine`` or
    an :class:`~volcano_locks.fencing.AsyncFencedSQL`).
    """

    fenced: AsyncFencedSQL

    def __init__(
        self,
        engine: AsyncEngine | AsyncFencedSQL,
        *,
        table: str = DEFAULT_LEDGER_TABLE,
        schema: str | None = None,
        clock: Callable[[], datetime] = _utc_now,
    ) -> None:
        fenced = engine if isinstance(engine, AsyncFencedSQL) else AsyncFencedSQL(engine)
        super().__init__(fenced, table=table, schema=schema, clock=clock)

    def once(self, business_key: str, *, who: Who | None = None) -> AsyncSQLOnce:
        """``business_key`` on this ledger, for an async ``with_lock(once=...)``."""
        return AsyncSQLOnce(self, validate_business_key(business_key), who or Who.here())

    async def create_tables(self) -> None:
        """Create the ledger and audit tables now if missing."""
        async with self.fenced.engine.connect() as conn:
            await conn.run_sync(self._prepare)

    @asynccontextmanager
    async def begin(
        self, business_key: str, lease: object, *, who: Who | None = None, resource: str | None = None
    ) -> AsyncIterator[Effect]:
        """Do ``business_key``'s effect once, as :meth:`SQLLedger.begin` (``effect.connection`` is async)."""
        key = validate_business_key(business_key)
        who = who or Who.here()
        fence_of(lease)
        if not self.tables.ready:
            await self.create_tables()
        async with self.fenced.begin(resource or key, lease) as conn:
            await conn.run_sync(self._refuse_if_done, key)
            effect = Effect(conn, key)
            yield effect
            record = self._record(key, lease, who, effect.result)
            await conn.run_sync(self._insert_or_refuse, record)
        effect.record = record

    async def lookup(self, business_key: str) -> OnceRecord | None:
        """The record of ``business_key``, or ``None``."""
        key = validate_business_key(business_key)
        async with self.fenced.engine.connect() as conn:
            return await conn.run_sync(self.tables.lookup, key)

    async def records(self, *, prefix: str | None = None, limit: int = 100) -> list[OnceRecord]:
        """The records, newest first, as :meth:`SQLLedger.records`."""
        check_list(prefix, limit)
        async with self.fenced.engine.connect() as conn:
            return await conn.run_sync(self.tables.records, prefix, limit)

    async def forget(self, business_key: str, *, by: str, why: str) -> OnceRecord | None:
        """Delete ``business_key``'s record, audited, as :meth:`SQLLedger.forget`."""
        key, by, why = check_forget(business_key, by, why)
        async with self.fenced.engine.begin() as conn:
            return await conn.run_sync(self.tables.forget, key, by, why, self.clock())


@dataclass(frozen=True)
class SQLOnce:
    """One business key on a :class:`SQLLedger`, as one run sees it: what ``with_lock(once=...)`` takes.

    ``with_lock`` looks the key up once the lock is held (``guard.duplicate``) and binds the run to its
    guard (``guard.once``), so ``guard.once.begin()`` needs no lease.
    """

    ledger: SQLLedger
    business_key: str
    who: Who
    lease: object | None = None

    def lookup(self) -> OnceRecord | None:
        """The key's record, or ``None``."""
        return self.ledger.lookup(self.business_key)

    def bound(self, lease: object) -> SQLOnce:
        """This run under ``lease``."""
        return replace(self, lease=lease)

    def begin(self, *, resource: str | None = None) -> Any:
        """:meth:`SQLLedger.begin` for this key under the bound lease (a context manager of ``Effect``)."""
        return self.ledger.begin(self.business_key, bound_lease(self.lease), who=self.who, resource=resource)


@dataclass(frozen=True)
class AsyncSQLOnce:
    """One business key on an :class:`AsyncSQLLedger`: what an async ``with_lock(once=...)`` takes."""

    ledger: AsyncSQLLedger
    business_key: str
    who: Who
    lease: object | None = None

    async def lookup(self) -> OnceRecord | None:
        """The key's record, or ``None``."""
        return await self.ledger.lookup(self.business_key)

    def bound(self, lease: object) -> AsyncSQLOnce:
        """This run under ``lease``."""
        return replace(self, lease=lease)

    def begin(self, *, resource: str | None = None) -> Any:
        """:meth:`AsyncSQLLedger.begin` for this key, under the bound lease (an async context manager)."""
        return self.ledger.begin(self.business_key, bound_lease(self.lease), who=self.who, resource=resource)
