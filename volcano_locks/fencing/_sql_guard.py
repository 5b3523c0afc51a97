"""The guard row of a fenced resource: its table, the one statement that claims it, and what its answer means.

A guard table holds one row per fenced resource: the lock key that fences it and the highest fencing token
it accepted. Claiming the row is one conditional upsert, the first statement of a fenced transaction::

    INSERT INTO volcano_fence (resource, lock_key, fencing_token)
    SELECT :resource, :lock_key, :token
      FROM (SELECT set_config('idle_in_transaction_session_timeout', :stall, true),
                   set_config('lock_timeout', :stall, true)) AS volcano_stall_bound   -- PostgreSQL only
    ON CONFLICT (resource) DO UPDATE SET lock_key = excluded.lock_key, fencing_token = excluded.fencing_token
    WHERE volcano_fence.lock_key = excluded.lock_key AND volcano_fence.fencing_token <= excluded.fencing_token
    RETURNING fencing_token

No row back: the stored token is newer, or the resource is fenced by another lock key; :func:`refusal`
names which. The check and the write are one statement, which takes the row's lock until the transaction
ends, so a second fenced writer of the resource waits there and is then judged against the committed row.

What the statement cannot see, the guard checks right after it, on the driver's own connection: that the
session is inside a transaction (an autocommit session committed the guard alone, and would commit each of
the user's statements apart from it). Drivers that cannot say are refused when the engine is given:
PostgreSQL through psycopg (3), psycopg2 or asyncpg, SQLite through pysqlite (the standard ``sqlite3``) or
aiosqlite.

The stall bound (PostgreSQL): the two ``set_config(..., true)`` are ``SET LOCAL`` for the fenced
transaction, evaluated before the upsert takes any lock. ``idle_in_transaction_session_timeout`` makes the
server end a fenced session that sits idle inside its transaction for longer (a writer paused or cut off
mid-transaction: its row locks go with it, nothing of it commits); ``lock_timeout`` bounds how long any
statement of the transaction, the guard first, waits for a lock. A next holder queued behind a stalled
writer therefore waits at most the stall timeout (the stalled session went idle before the next holder
started waiting, so it is ended first) and a writer that is slow rather than stalled makes the next one
fail with :class:`FenceBusy` instead of waiting without bound. SQLite cannot end another process's
transaction: there the wait is the connection's busy timeout (``sqlite3``'s ``timeout``, 5 s unless set),
after which the guard raises :class:`FenceBusy` too.
"""

from __future__ import annotations

import functools
import math
import re
import sqlite3
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.schema import CreateTable

from volcano_locks.fencing._fence import Fence, FenceBusy, fence_of, refusal, validate_resource

__all__ = [
    "DEFAULT_GUARD_TABLE",
    "DEFAULT_STALL_TIMEOUT",
    "SUPPORTED_DRIVERS",
    "Guard",
    "check_stall_timeout",
]

DEFAULT_GUARD_TABLE = "volcano_fence"
DEFAULT_STALL_TIMEOUT = 30.0
"""Seconds (PostgreSQL): how long a fenced session may sit idle inside its transaction, and how long any
statement of it waits for a lock."""

SUPPORTED_DRIVERS: dict[str, tuple[str, ...]] = {
    "postgresql": ("psycopg", "psycopg2", "asyncpg"),
    "sqlite": ("pysqlite", "aiosqlite"),
}
"""The dialects and drivers whose sessions say whether they are inside a transaction."""

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_UNDEFINED_TABLE = "42P01"
_LOCK_NOT_AVAILABLE = "55P03"
_MAX_STALL = 24 * 3600.0


def check_stall_timeout(value: object) -> float | None:
    """Validate a stall timeout: ``None`` (no bound) or a number of seconds from 0.001 to 86400."""
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0.001 <= value <= _MAX_STALL
    ):
        raise ValueError(f"stall_timeout must be None or seconds from 0.001 to {_MAX_STALL:g}, got {value!r}")
    return float(value)


def check_engine(dialect: Dialect, owner: str) -> None:
    """Refuse a dialect or driver whose fenced transactions this module cannot keep (names the fix)."""
    name, driver = dialect.name, dialect.driver
    drivers = SUPPORTED_DRIVERS.get(name)
    if drivers is None:
        raise ValueError(
            f"{owner} needs INSERT ... ON CONFLICT DO UPDATE ... WHERE ... RETURNING (PostgreSQL or SQLite); "
            f"dialect {name!r} is not supported"
        )
    if driver not in drivers:
        raise ValueError(
            f"{owner} cannot tell whether a {name}+{driver} session is inside a transaction, so it cannot "
            f"keep your statements in the guard's: use one of {', '.join(f'{name}+{d}' for d in drivers)}"
        )


class Guard:
    """The guard table of one fenced engine, and claiming a resource's row on a connection of it.

    Args:
        dialect: the engine's dialect (checked by :func:`check_engine` first).
        guard_table: the table's name; ``schema``: its schema, if not the default one.
        stall_timeout: the PostgreSQL stall bound in seconds (module docstring), or ``None`` for none.
        owner: the public class using it, for messages.
    """

    def __init__(
        self, dialect: Dialect, guard_table: str, schema: str | None, stall_timeout: float | None, owner: str
    ) -> None:
        for what, name in (("guard_table", guard_table), ("schema", schema)):
            if name is not None and not (isinstance(name, str) and _IDENTIFIER.match(name)):
                raise ValueError(f"{what} must be a SQL identifier of at most 63 characters, got {name!r}")
        self.postgres = dialect.name == "postgresql"
        self.owner = owner
        self.stall_timeout = check_stall_timeout(stall_timeout)
        self.table, self._claim, self._stored = _statements(
            self.postgres, guard_table, schema, self.stall_timeout is not None
        )
        self.ready = False
        """Whether this process knows the table exists, committed (then no statement checks for it again)."""

    def create(self, conn: Connection) -> None:
        """Create the table on ``conn``, in its transaction, if it is missing (the caller commits it)."""
        if self.postgres:
            # CREATE TABLE IF NOT EXISTS races on the catalog between concurrent creators.
            conn.execute(
                sa.select(sa.func.pg_advisory_xact_lock(sa.func.hashtext(sa.bindparam("name")))),
                {"name": f"volcano_locks.fencing.{self.table.fullname}"},
            )
        # IF NOT EXISTS, not a look then a CREATE: concurrent first users of a SQLite file race in between.
        conn.execute(CreateTable(self.table, if_not_exists=True))

    def stored(self, conn: Connection, resource: str) -> Fence | None:
        """The fence ``resource``'s row holds on ``conn``, or ``None``."""
        row = conn.execute(self._stored, {"resource": resource}).first()
        return None if row is None else Fence(row[0], int(row[1]))

    def claim(self, conn: Connection, resource: str, fence: Fence, *, fresh: bool) -> None:
        """Claim ``resource``'s row for ``fence`` in ``conn``'s transaction, or raise.

        ``fresh``: nothing ran in the transaction yet and it is the caller's own (``begin``), so on
        PostgreSQL a missing table may be found by the claim itself and the transaction started again.
        Otherwise a claim that does not know the table exists looks first (one catalog query) and creates a
        missing one: on PostgreSQL in a transaction of its own, committed at once, so that every session
        sees it; on SQLite in the caller's transaction (another connection would wait on its write lock),
        so this process looks again next time.

        Raises:
            StaleFencingToken: the row holds a newer token or another lock key; nothing was written.
            FenceBusy: the row stayed locked by another transaction past the bound.
            ValueError: the session is not inside a transaction (autocommit).
        """
        params: dict[str, Any] = {
            "resource": resource,
            "lock_key": fence.lock_key,
            "fencing_token": fence.fencing_token,
        }
        if self.stall_timeout is not None and self.postgres:
            params["stall"] = str(max(1, round(self.stall_timeout * 1000)))  # milliseconds
        first = not self.ready
        if first and not (fresh and self.postgres):
            if sa.inspect(conn).has_table(self.table.name, schema=self.table.schema):
                self.ready = True
            elif self.postgres:
                with conn.engine.begin() as own:
                    self.create(own)
                self.ready = True
            else:
                self.create(conn)
        try:
            row = conn.execute(self._claim, params).first()
        except sa.exc.DBAPIError as exc:
            if first and fresh and _sqlstate(exc) == _UNDEFINED_TABLE:
                conn.rollback()  # nothing of the caller's ran: start the transaction again with the table
                self.create(conn)
                conn.commit()
                row = conn.execute(self._claim, params).first()
            else:
                self._raise_if_busy(conn, resource, exc)
                raise
        if self.postgres:
            self.ready = True  # every way here found the table committed, or committed it
        if in_transaction(conn.connection.driver_connection) is not True:
            raise ValueError(
                f"{self.owner} needs a transaction, but this session is in autocommit mode "
                "(isolation_level='AUTOCOMMIT', or the driver's own autocommit): the guard committed alone "
                "and could not hold back your statements, so none of them ran; use a connection without "
                "autocommit (the engine's default)"
            )
        if row is None:
            raise refusal("sql", resource, fence, self.stored(conn, resource))

    def read(self, conn: Connection, resource: str) -> Fence | None:
        """What ``resource``'s row holds (``None``: never written, or no guard table yet)."""
        if not self.ready and not sa.inspect(conn).has_table(self.table.name, schema=self.table.schema):
            return None
        self.ready = True
        return self.stored(conn, resource)

    def _raise_if_busy(self, conn: Connection, resource: str, exc: sa.exc.DBAPIError) -> None:
        if self.postgres and _sqlstate(exc) == _LOCK_NOT_AVAILABLE:
            waited = (
                f"lock_timeout {self.stall_timeout:g} s"
                if self.stall_timeout
                else "the session's lock_timeout"
            )
            raise FenceBusy(
                resource,
                waited,
                "PostgreSQL ends a fenced session idle inside its transaction after stall_timeout, so retry "
                f"shortly; {self.owner}(engine, stall_timeout=...) sets both bounds",
            ) from exc
        code = getattr(exc.orig, "sqlite_errorcode", None)
        if not self.postgres and isinstance(code, int) and code & 0xFF == sqlite3.SQLITE_BUSY:
            raise FenceBusy(
                resource,
                "SQLite's busy timeout",
                "SQLite cannot end another process's transaction: retry once it ends, or wait longer with "
                "create_engine(url, connect_args={'timeout': seconds})",
            ) from exc


@functools.lru_cache(maxsize=64)
def _statements(
    postgres: bool, guard_table: str, schema: str | None, bounded: bool
) -> tuple[sa.Table, Any, Any]:
    """The guard table and its two statements (claim, read), built once per process and shape.

    One Table object per shape, so that a new FencedSQL on an engine (a new run's) finds its statements
    already compiled in the engine's cache instead of compiling them again.
    """
    t = sa.Table(
        guard_table,
        sa.MetaData(schema=schema),
        sa.Column("resource", sa.String(512), primary_key=True),
        sa.Column("lock_key", sa.String(128), nullable=False),
        sa.Column("fencing_token", sa.BigInteger, nullable=False),
    )
    values = [
        sa.bindparam("resource", type_=t.c.resource.type),
        sa.bindparam("lock_key", type_=t.c.lock_key.type),
        sa.bindparam("fencing_token", type_=t.c.fencing_token.type),
    ]
    stmt: Any
    if postgres:
        source = sa.select(*values)
        if bounded:
            bound = sa.select(
                sa.func.set_config("idle_in_transaction_session_timeout", sa.bindparam("stall"), sa.true()),
                sa.func.set_config("lock_timeout", sa.bindparam("stall"), sa.true()),
            ).subquery("volcano_stall_bound")
            source = source.select_from(bound)
        stmt = postgresql.insert(t).from_select(["resource", "lock_key", "fencing_token"], source)
    else:
        stmt = sqlite.insert(t).values(resource=values[0], lock_key=values[1], fencing_token=values[2])
    stmt = stmt.on_conflict_do_update(
        index_elements=[t.c.resource],
        set_={"lock_key": stmt.excluded.lock_key, "fencing_token": stmt.excluded.fencing_token},
        where=(t.c.lock_key == stmt.excluded.lock_key) & (t.c.fencing_token <= stmt.excluded.fencing_token),
    )
    # RETURNING, not rowcount: SQLAlchemy's psycopg dialect reports -1 for a Core INSERT's rowcount.
    claim = stmt.returning(t.c.fencing_token)
    stored = sa.select(t.c.lock_key, t.c.fencing_token).where(t.c.resource == sa.bindparam("resource"))
    return t, claim, stored


def in_transaction(driver: Any) -> bool | None:
    """Whether a driver connection's session is inside a transaction now (``None``: the driver does not say).

    sqlite3 and aiosqlite: ``in_transaction``; asyncpg: ``is_in_transaction()``; psycopg (3) and psycopg2:
    libpq's transaction status (``info.transaction_status``: 0 is idle, outside any transaction).
    """
    flag = getattr(driver, "in_transaction", None)
    if isinstance(flag, bool):
        return flag
    method = getattr(driver, "is_in_transaction", None)
    if callable(method):
        return bool(method())
    status = getattr(getattr(driver, "info", None), "transaction_status", None)
    if isinstance(status, int):
        return status != 0
    return None


def _sqlstate(exc: sa.exc.DBAPIError) -> str | None:
    """The SQLSTATE of a PostgreSQL driver's error (psycopg: ``sqlstate``; psycopg2: ``pgcode``)."""
    orig = exc.orig
    state = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    return state if isinstance(state, str) else None


def claim_args(resource: object, lease: object) -> tuple[str, Fence]:
    """Validate a claim's arguments where they are given: the resource's name and the lease's fence."""
    fence = fence_of(lease)
    return validate_resource(resource), fence
