"""Fenced transactions on your own tables through SQLAlchemy: one guard row per resource, same transaction.

:class:`FencedSQL` keeps a small guard table, one row per fenced resource: the lock key and the highest
fencing token it accepted. A fenced transaction starts with one conditional upsert of that row, then runs
your ``INSERT`` / ``UPDATE`` / ``MERGE`` statements on the same connection, and commits them together::

    INSERT INTO volcano_fence (resource, lock_key, fencing_token) VALUES (:resource, :lock_key, :token)
    ON CONFLICT (resource) DO UPDATE SET lock_key = excluded.lock_key, fencing_token = excluded.fencing_token
    WHERE volcano_fence.lock_key = excluded.lock_key AND volcano_fence.fencing_token <= excluded.fencing_token
    RETURNING fencing_token

When the upsert returns no row, the stored token is newer (or the resource belongs to another lock): the
transaction is rolled back before any of your statements ran, and :class:`StaleFencingToken` names the
resource, the refused token and the stored one.

Dialects: PostgreSQL (9.5+) and SQLite (3.35+), which have both features it relies on: a conditional upsert
(``INSERT ... ON CONFLICT DO UPDATE ... WHERE``, so the check and the write are one statement that takes the
row lock) and ``RETURNING`` (to learn whether the row changed). Any other dialect is refused when the
:class:`FencedSQL` is built.

Concurrent writers of one resource: the upsert locks the guard row until the transaction ends (PostgreSQL:
the row lock, or the unique-index entry when the row is new; SQLite: the database write lock, taken by the
upsert as the transaction's first write). A second fenced writer waits there, then re-evaluates the
``WHERE`` against the committed row: an older token is refused, an equal or newer one goes on. So no
accepted write is lost, and two fenced writers of one resource cannot deadlock on each other: both take
the guard first, before anything else. Keep it first (``begin`` does) and fence one resource per
transaction, or take several guards in a fixed order. Under PostgreSQL's ``REPEATABLE READ`` or
``SERIALIZABLE`` the waiting writer fails with a serialization error instead (retry the transaction);
under the default ``READ COMMITTED`` it proceeds as above.

An autocommit connection is refused with ``ValueError``: the guard would commit apart from your statements.

Cost: one extra statement per fenced transaction (the upsert); a refusal costs one more (the read that
names the stored token).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine

from volcano_locks.fencing._fence import Fence, StaleFencingToken, fence_of, validate_resource

__all__ = ["DEFAULT_GUARD_TABLE", "SUPPORTED_DIALECTS", "FencedSQL"]

DEFAULT_GUARD_TABLE = "volcano_fence"
SUPPORTED_DIALECTS = ("postgresql", "sqlite")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_INSERTS = {"postgresql": postgresql.insert, "sqlite": sqlite.insert}


class FencedSQL:
    """Fenced transactions on a SQLAlchemy engine: your statements commit only under the newest token.

    Args:
        engine: your engine (PostgreSQL or SQLite); Airflow's SQL hooks give one (``get_sqlalchemy_engine``).
        guard_table: the guard table's name (created on first use when missing).
        schema: the guard table's schema, if not the default one.

    Example:
        >>> fenced = FencedSQL(engine)  # doctest: +SKIP
        >>> with client.with_lock("orders", ttl=30) as guard, fenced.begin("orders", guard) as conn:
        ...     conn.execute(orders.update().values(total=42))  # commits only if the lease is current
    """

    def __init__(self, engine: Engine, *, guard_table: str = DEFAULT_GUARD_TABLE, schema: str | None = None):
        if not isinstance(engine, Engine):
            raise TypeError(f"engine must be a SQLAlchemy Engine, got {type(engine).__name__}")
        dialect = engine.dialect.name
        if dialect not in SUPPORTED_DIALECTS:
            raise ValueError(
                f"FencedSQL needs INSERT ... ON CONFLICT DO UPDATE ... WHERE (PostgreSQL or SQLite); "
                f"dialect {dialect!r} is not supported"
            )
        for what, name in (("guard_table", guard_table), ("schema", schema)):
            if name is not None and not _IDENTIFIER.match(name):
                raise ValueError(f"{what} must be a SQL identifier of at most 63 characters, got {name!r}")
        self.engine = engine
        self.table = sa.Table(
            guard_table,
            sa.MetaData(schema=schema),
            sa.Column("resource", sa.String(512), primary_key=True),
            sa.Column("lock_key", sa.String(128), nullable=False),
            sa.Column("fencing_token", sa.BigInteger, nullable=False),
        )
        self._insert = _INSERTS[dialect]
        self._ready = False
        self._ready_lock = threading.Lock()

    def __repr__(self) -> str:
        # The URL may hold a password: name the dialect and table only.
        return f"FencedSQL({self.engine.dialect.name!r}, guard_table={self.table.fullname!r})"

    def create_guard_table(self) -> None:
        """Create the guard table if it is missing (``begin`` and ``claim`` do it on first use)."""
        with self._ready_lock:
            if self._ready:
                return
            with self.engine.begin() as conn:
                if self.engine.dialect.name == "postgresql":
                    # CREATE TABLE IF NOT EXISTS races on the catalog between concurrent creators.
                    conn.execute(
                        sa.text("SELECT pg_advisory_xact_lock(hashtext(:name))"),
                        {"name": f"volcano_locks.fencing.{self.table.fullname}"},
                    )
                self.table.create(conn, checkfirst=True)
            self._ready = True

    @contextmanager
    def begin(self, resource: str, lease: object) -> Iterator[Connection]:
        """A transaction on ``resource`` under ``lease``: yields the connection for your statements.

        The guard is claimed first; your statements commit with it when the block ends, or roll back with
        it on any error. ``lease`` is any form :func:`~volcano_locks.fencing.fence_of` takes.

        Raises:
            StaleFencingToken: a newer token (or another lock) wrote ``resource``; nothing was written.
        """
        fence = fence_of(lease)
        resource = validate_resource(resource)
        self.create_guard_table()
        with self.engine.begin() as conn:
            self._claim(conn, resource, fence)
            yield conn

    def claim(self, conn: Connection, resource: str, lease: object) -> None:
        """Claim ``resource``'s guard in a transaction you opened on ``conn``; make it the first statement.

        Raises:
            StaleFencingToken: the guard refused; roll your transaction back (``engine.begin()`` does).
        """
        fence = fence_of(lease)
        self.create_guard_table()
        self._claim(conn, validate_resource(resource), fence)

    def read(self, resource: str) -> Fence | None:
        """The lock key and highest fencing token ``resource`` accepted, or ``None`` if never written."""
        self.create_guard_table()
        with self.engine.connect() as conn:
            return self._stored(conn, validate_resource(resource))

    def _claim(self, conn: Connection, resource: str, fence: Fence) -> None:
        t = self.table
        stmt: Any = self._insert(t).values(
            resource=resource, lock_key=fence.lock_key, fencing_token=fence.fencing_token
        )
        stmt = stmt.on_conflict_do_update(
            index_elements=[t.c.resource],
            set_={"lock_key": stmt.excluded.lock_key, "fencing_token": stmt.excluded.fencing_token},
            where=(t.c.lock_key == stmt.excluded.lock_key)
            & (t.c.fencing_token <= stmt.excluded.fencing_token),
        )
        # RETURNING, not rowcount: SQLAlchemy's psycopg dialect reports -1 for a Core INSERT's rowcount.
        accepted = conn.execute(stmt.returning(t.c.fencing_token)).first() is not None
        if _in_transaction(conn) is False:
            # The guard committed on its own: it cannot hold back statements that commit apart from it.
            raise ValueError(
                "FencedSQL needs a transaction, but the connection is in autocommit mode "
                "(isolation_level='AUTOCOMMIT' or a driver-level autocommit): use a transactional engine"
            )
        if not accepted:
            stored = self._stored(conn, resource)
            raise StaleFencingToken(resource, fence.fencing_token, stored, lock_key=fence.lock_key)

    def _stored(self, conn: Connection, resource: str) -> Fence | None:
        t = self.table
        row = conn.execute(sa.select(t.c.lock_key, t.c.fencing_token).where(t.c.resource == resource)).first()
        return None if row is None else Fence(row[0], int(row[1]))


def _in_transaction(conn: Connection) -> bool | None:
    """Whether the database session is inside a transaction now (``None``: this driver does not say)."""
    dbapi: Any = conn.connection.dbapi_connection
    if isinstance(getattr(dbapi, "in_transaction", None), bool):  # sqlite3
        return bool(dbapi.in_transaction)
    info = getattr(dbapi, "info", None)
    status = getattr(info, "transaction_status", None)  # psycopg 3: IDLE, ACTIVE, INTRANS, INERROR, UNKNOWN
    if status is not None and hasattr(status, "name"):
        return str(status.name) != "IDLE"
    return None
