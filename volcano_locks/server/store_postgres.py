"""PostgreSQL lock store: each change is one transaction holding the row lock (SELECT ... FOR UPDATE).

Several server processes may share one database: the row lock serialises every decision on a key,
so no lock is ever granted twice. Times come from the server's injected clock, not the database's.
Tables live in a schema this store creates: `?schema=NAME` on the DSN (default `volcano_locks`).
"""

from __future__ import annotations

import threading
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import sql

from .errors import StoreUnavailable
from .store import Decide, LockRow, T

__all__ = ["DEFAULT_SCHEMA", "PostgresStore", "split_schema"]

DEFAULT_SCHEMA = "volcano_locks"
_CONNECT_TIMEOUT = 3
_MAX_IDLE = 16


def split_schema(dsn: str) -> tuple[str, str]:
    """Return (DSN without our `schema` query parameter, schema name)."""
    parts = urlsplit(dsn)
    query = parse_qsl(parts.query, keep_blank_values=True)
    schema = DEFAULT_SCHEMA
    rest = []
    for name, value in query:
        if name == "schema":
            schema = value
        else:
            rest.append((name, value))
    if not schema:
        raise ValueError("empty schema= in the PostgreSQL DSN")
    return urlunsplit(parts._replace(query=urlencode(rest))), schema


class PostgresStore:
    """Lock rows in a PostgreSQL table; a small pool of autocommit connections, one per in-flight request."""

    def __init__(self, dsn: str) -> None:
        """Connect to `dsn` and create the schema and table if they do not exist."""
        self._dsn, self.schema = split_schema(dsn)
        table = sql.Identifier(self.schema, "locks")
        self._select = sql.SQL(
            "SELECT token_hash, fencing, expires_us, deadline_us FROM {} WHERE project = %s AND key = %s"
        ).format(table)
        self._select_for_update = self._select + sql.SQL(" FOR UPDATE")
        self._insert_blank = sql.SQL(
            "INSERT INTO {} (project, key, token_hash, fencing, expires_us, deadline_us)"
            " VALUES (%s, %s, NULL, 0, 0, 0) ON CONFLICT DO NOTHING"
        ).format(table)
        self._write = sql.SQL(
            "UPDATE {} SET token_hash = %s, fencing = %s, expires_us = %s, deadline_us = %s"
            " WHERE project = %s AND key = %s"
        ).format(table)
        self._idle: list[psycopg.Connection[tuple[object, ...]]] = []
        self._lock = threading.Lock()
        self._create_schema()

    def _connect(self) -> psycopg.Connection[tuple[object, ...]]:
        try:
            return psycopg.connect(self._dsn, autocommit=True, connect_timeout=_CONNECT_TIMEOUT)
        except psycopg.Error as exc:
            raise StoreUnavailable(f"cannot connect to PostgreSQL: {type(exc).__name__}") from exc

    def _create_schema(self) -> None:
        conn = self._connect()
        try:
            with conn.transaction():
                # Concurrent CREATE ... IF NOT EXISTS can still collide; an advisory lock serialises them.
                conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"volcano_locks:{self.schema}",))
                conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema)))
                conn.execute(
                    sql.SQL(
                        "CREATE TABLE IF NOT EXISTS {} (project TEXT NOT NULL, key TEXT NOT NULL,"
                        " token_hash TEXT, fencing BIGINT NOT NULL, expires_us BIGINT NOT NULL,"
                        " deadline_us BIGINT NOT NULL, PRIMARY KEY (project, key))"
                    ).format(sql.Identifier(self.schema, "locks"))
                )
        except psycopg.Error as exc:
            conn.close()
            raise StoreUnavailable(f"cannot create PostgreSQL schema {self.schema!r}: {exc}") from exc
        self._release(conn, ok=True)

    def _borrow(self) -> psycopg.Connection[tuple[object, ...]]:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return self._connect()

    def _release(self, conn: psycopg.Connection[tuple[object, ...]], *, ok: bool) -> None:
        if ok and not conn.closed and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
            with self._lock:
                if len(self._idle) < _MAX_IDLE:
                    self._idle.append(conn)
                    return
        conn.close()

    @staticmethod
    def _row(got: tuple[object, ...] | None) -> LockRow | None:
        if got is None:
            return None
        token_hash, fencing, expires_us, deadline_us = got
        assert isinstance(fencing, int) and isinstance(expires_us, int) and isinstance(deadline_us, int)
        if fencing == 0 and token_hash is None:
            return None  # the placeholder row inserted to take the row lock on a never-used key
        return LockRow(token_hash if isinstance(token_hash, str) else None, fencing, expires_us, deadline_us)

    def update(self, project: str, key: str, decide: Decide[T]) -> T:
        """Lock the row (creating a blank one if needed), decide, and write in one transaction."""
        conn = self._borrow()
        ok = False
        try:
            with conn.transaction():
                got = conn.execute(self._select_for_update, (project, key)).fetchone()
                if got is None:
                    conn.execute(self._insert_blank, (project, key))
                    got = conn.execute(self._select_for_update, (project, key)).fetchone()
                new, result = decide(self._row(got))
                if new is not None:
                    conn.execute(
                        self._write,
                        (new.token_hash, new.fencing, new.expires_us, new.deadline_us, project, key),
                    )
            ok = True
            return result
        except psycopg.Error as exc:
            raise StoreUnavailable(f"PostgreSQL error: {type(exc).__name__}: {exc}") from exc
        finally:
            # A decision that raised (e.g. a 409) rolled back cleanly; the connection is reusable.
            self._release(conn, ok=ok or not conn.broken)

    def read(self, project: str, key: str) -> LockRow | None:
        """Return the stored row, or None."""
        conn = self._borrow()
        ok = False
        try:
            got = conn.execute(self._select, (project, key)).fetchone()
            ok = True
        except psycopg.Error as exc:
            raise StoreUnavailable(f"PostgreSQL error: {type(exc).__name__}: {exc}") from exc
        finally:
            self._release(conn, ok=ok)
        return self._row(got)

    def close(self) -> None:
        """Close every pooled connection."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
