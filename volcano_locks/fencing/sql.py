"""Fenced transactions on your own tables through SQLAlchemy, sync (:class:`FencedSQL`) and asyncio
(:class:`AsyncFencedSQL`): a guard row per resource, claimed first in every transaction of the work.

The guard (``_sql_guard``) is one conditional upsert of the resource's row in a small table (lock key,
highest fencing token accepted), the first statement of the transaction; your ``INSERT`` / ``UPDATE`` /
``MERGE`` statements follow on the same connection and commit with it, or the whole transaction rolls back.
A stale token (or another lock key) is refused with :class:`StaleFencingToken` before any of yours ran.

What it holds for, and what it refuses (each a test in ``tests/fencing/``):

- Every engine a user can pass: PostgreSQL through psycopg (3), psycopg2 or asyncpg, SQLite through the
  standard ``sqlite3`` or aiosqlite, sync and asyncio. Other dialects and drivers are refused when the
  engine is given (``ValueError`` naming the ones that work): the guard must be able to ask the driver
  whether the session is inside a transaction.
- Every commit style: a claim covers every transaction on its connection until the claim ends (the
  ``begin`` block, or the claim's ``with`` block / ``end()`` / the connection's close). After SQLAlchemy's
  commit-as-you-go ``conn.commit()`` the next statement re-claims the guard first, so no batch commits
  unfenced (``_sql_claim``).
- Autocommit (SQLAlchemy's ``isolation_level="AUTOCOMMIT"`` or the driver's own, psycopg2 included) is
  refused with ``ValueError`` before any of your statements ran: each statement would commit apart from
  the guard.
- A writer stalled inside its transaction (paused, cut off) holds the guard row: on PostgreSQL the server
  ends its session after ``stall_timeout`` idle (default 30 s) and the next holder's wait is bounded by the
  same (``lock_timeout``), for every statement of the fenced transaction; on SQLite the bound is the
  connection's busy timeout. A wait that runs out raises :class:`FenceBusy` (nothing written, retry).

Concurrent fenced writers of one resource queue on the guard row, then the next one's ``WHERE`` is judged
against the committed token: no accepted write is lost, and they cannot deadlock on each other, because
both take the guard first (fence one resource per transaction, or claim several in a fixed order). Under
PostgreSQL's ``REPEATABLE READ`` / ``SERIALIZABLE`` the queued writer gets a serialization error instead
(retry the transaction); under the default ``READ COMMITTED`` it proceeds as above.

Cost: one statement per fenced transaction (the upsert, with the stall bound folded in); a refusal costs
one more (the read that names the stored token). The guard table is created when missing: ``begin`` finds
that out from the claim itself (no extra statement when it exists), a first ``claim`` in a process asks
the catalog once.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Generic, TypeVar

from sqlalchemy.engine import Connection, Engine

from volcano_locks.fencing._fence import Fence, validate_resource
from volcano_locks.fencing._sql_claim import Claim
from volcano_locks.fencing._sql_guard import (
    DEFAULT_GUARD_TABLE,
    DEFAULT_STALL_TIMEOUT,
    SUPPORTED_DRIVERS,
    Guard,
    check_engine,
    claim_args,
)

__all__ = [
    "DEFAULT_GUARD_TABLE",
    "DEFAULT_STALL_TIMEOUT",
    "SUPPORTED_DIALECTS",
    "SUPPORTED_DRIVERS",
    "AsyncFencedSQL",
    "Claim",
    "FencedSQL",
]

SUPPORTED_DIALECTS = tuple(SUPPORTED_DRIVERS)

if TYPE_CHECKING:
    # SQLAlchemy's asyncio package brings its ORM along: imported by AsyncFencedSQL only, not by FencedSQL.
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

_E = TypeVar("_E", "Engine", "AsyncEngine")


class _FencedEngine(Generic[_E]):
    """What the sync and async faces share: checking the engine where it is given, the guard, the repr."""

    def __init__(
        self,
        engine: _E,
        *,
        guard_table: str = DEFAULT_GUARD_TABLE,
        schema: str | None = None,
        stall_timeout: float | None = DEFAULT_STALL_TIMEOUT,
    ) -> None:
        owner = type(self).__name__
        self._check(engine)
        check_engine(engine.dialect, owner)
        self.engine: _E = engine
        self._guard = Guard(engine.dialect, guard_table, schema, stall_timeout, owner)
        self.table = self._guard.table

    def __repr__(self) -> str:
        # The URL may hold a password: name the dialect and table only.
        return f"{type(self).__name__}({self.engine.dialect.name!r}, guard_table={self.table.fullname!r})"

    @property
    def stall_timeout(self) -> float | None:
        """The PostgreSQL stall bound in seconds (``None``: none)."""
        return self._guard.stall_timeout

    def _check(self, engine: object) -> None:
        """Refuse what is not this face's kind of engine, naming the other face when it is that one's."""
        raise NotImplementedError


class FencedSQL(_FencedEngine[Engine]):
    """Fenced transactions on a SQLAlchemy engine: your statements commit only under the newest token.

    Args:
        engine: your engine (PostgreSQL or SQLite, a driver of ``SUPPORTED_DRIVERS``); Airflow's SQL hooks
            give one (``get_sqlalchemy_engine()``).
        guard_table: the guard table's name (created when missing).
        schema: the guard table's schema, if not the default one.
        stall_timeout: seconds (PostgreSQL) a fenced session may sit idle inside its transaction before the
            server ends it, and the longest any of its statements waits for a lock; ``None`` for neither.

    Example:
        >>> fenced = FencedSQL(engine)  # doctest: +SKIP
        >>> with client.with_lock("orders", ttl=30) as guard, fenced.begin("orders", guard) as conn:
        ...     conn.execute(orders.update().values(total=42))  # commits only if the lease is current
    """

    def _check(self, engine: object) -> None:
        asyncio = sys.modules.get("sqlalchemy.ext.asyncio")  # not imported: the engine cannot be one
        if asyncio is not None and isinstance(engine, asyncio.AsyncEngine):
            raise TypeError("FencedSQL takes a sync Engine; for an AsyncEngine use AsyncFencedSQL")
        if not isinstance(engine, Engine):
            raise TypeError(f"engine must be a SQLAlchemy Engine, got {type(engine).__name__}")

    def create_guard_table(self) -> None:
        """Create the guard table now if it is missing (``begin`` and ``claim`` do it when they need to)."""
        with self.engine.begin() as conn:
            self._guard.create(conn)
        self._guard.ready = True

    @contextmanager
    def begin(self, resource: str, lease: object) -> Iterator[Connection]:
        """A fenced transaction on ``resource`` under ``lease``: yields the connection for your statements.

        The guard is claimed first; your statements commit with it when the block ends, or roll back with it
        on any error. A ``conn.commit()`` inside the block commits what ran so far, and the next statement
        claims the guard again. ``lease`` is any form :func:`~volcano_locks.fencing.fence_of` takes.

        Raises:
            StaleFencingToken: a newer token (or another lock key) wrote ``resource``; nothing was written.
            FenceBusy: a stalled writer held the guard past the bound; nothing was written.
        """
        resource, fence = claim_args(resource, lease)
        with self.engine.connect() as conn, Claim(self._guard, conn, resource, fence).start(fresh=True):
            yield conn
            conn.commit()
        self._guard.ready = True  # a guard row was committed: so was its table

    def claim(self, conn: Connection, resource: str, lease: object) -> Claim:
        """Claim ``resource`` on ``conn``, your connection: now, and first in each of its later transactions.

        Call it before your statements. It lasts until the returned :class:`Claim` ends (``with`` it, or
        ``end()``) or ``conn`` is closed, so commit-as-you-go stays fenced.

        Raises:
            StaleFencingToken: the guard refused; roll your transaction back (``engine.begin()`` does).
        """
        resource, fence = claim_args(resource, lease)
        return Claim(self._guard, conn, resource, fence).start(fresh=False)

    def read(self, resource: str) -> Fence | None:
        """The lock key and highest fencing token ``resource`` accepted, or ``None`` if never written."""
        resource = validate_resource(resource)
        with self.engine.connect() as conn:
            return self._guard.read(conn, resource)


class AsyncFencedSQL(_FencedEngine["AsyncEngine"]):
    """:class:`FencedSQL` for SQLAlchemy's asyncio engines (asyncpg, psycopg's async side, aiosqlite).

    The same guard and claims, run by SQLAlchemy on the async connection's ``sync_connection`` (inside the
    greenlet that drives the I/O), so sync and async decide alike. Arguments as for :class:`FencedSQL`.

    Example:
        >>> fenced = AsyncFencedSQL(create_async_engine("postgresql+asyncpg://..."))  # doctest: +SKIP
        >>> async with client.with_lock("orders", ttl=30) as guard:  # doctest: +SKIP
        ...     async with fenced.begin("orders", guard) as conn:
        ...         await conn.execute(orders.update().values(total=42))
    """

    def _check(self, engine: object) -> None:
        from sqlalchemy.ext.asyncio import AsyncEngine

        if isinstance(engine, Engine):
            raise TypeError("AsyncFencedSQL takes an AsyncEngine; for a sync Engine use FencedSQL")
        if not isinstance(engine, AsyncEngine):
            raise TypeError(f"engine must be a SQLAlchemy AsyncEngine, got {type(engine).__name__}")

    async def create_guard_table(self) -> None:
        """Create the guard table now if it is missing."""
        async with self.engine.begin() as conn:
            await conn.run_sync(self._guard.create)
        self._guard.ready = True

    @asynccontextmanager
    async def begin(self, resource: str, lease: object) -> AsyncIterator[AsyncConnection]:
        """A fenced transaction on ``resource`` under ``lease``, as :meth:`FencedSQL.begin`."""
        resource, fence = claim_args(resource, lease)
        async with self.engine.connect() as conn:
            claim = await conn.run_sync(
                lambda sync: Claim(self._guard, sync, resource, fence).start(fresh=True)
            )
            with claim:
                yield conn
                await conn.commit()
        self._guard.ready = True  # a guard row was committed: so was its table

    async def claim(self, conn: AsyncConnection, resource: str, lease: object) -> Claim:
        """Claim ``resource`` on ``conn`` now and first in each of its later transactions, as
        :meth:`FencedSQL.claim`; the returned :class:`Claim` ends with ``end()``, its ``with`` block or the
        connection's close."""
        resource, fence = claim_args(resource, lease)
        return await conn.run_sync(lambda sync: Claim(self._guard, sync, resource, fence).start(fresh=False))

    async def read(self, resource: str) -> Fence | None:
        """The lock key and highest fencing token ``resource`` accepted, or ``None`` if never written."""
        resource = validate_resource(resource)
        async with self.engine.connect() as conn:
            return await conn.run_sync(self._guard.read, resource)
