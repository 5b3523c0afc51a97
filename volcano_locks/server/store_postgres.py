"""PostgreSQL lock store and quota counter: each change is one transaction holding its row lock.

Several server processes may share one database: the row lock (SELECT ... FOR UPDATE) serialises
every decision on a key, so no lock is ever granted twice, and the quota is counted in the database
so the processes share it. Times come from the server's injected clock, not the database's. Tables
live in a schema this store creates: `?schema=NAME` on the DSN (default `volcano_locks`). Every
database interaction is bounded (`?timeout=S`, see `pg_pool`); a hung database is a 503.
"""

from __future__ import annotations

from psycopg import sql

from .errors import StoreUnavailable
from .pg_pool import DEFAULT_SCHEMA, PgPool, parse_dsn
from .store import Decide, LockRow, T

__all__ = ["DEFAULT_SCHEMA", "PostgresQuotaCounter", "PostgresStore", "split_schema"]


def split_schema(dsn: str) -> tuple[str, str]:
    """Return (DSN without our `schema` and `timeout` query parameters, schema name)."""
    settings = parse_dsn(dsn)
    return settings.dsn, settings.schema


class PostgresStore:
    """Lock rows in a PostgreSQL table, through a pool of time-bounded autocommit connections."""

    def __init__(self, dsn: str) -> None:
        """Connect to `dsn` and create the schema and tables if they do not exist."""
        self._pool = PgPool(dsn)
        self.schema = self._pool.schema
        self.timeout = self._pool.timeout
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
        try:
            self._create_schema()
        except StoreUnavailable:
            self._pool.close()
            raise

    def _create_schema(self) -> None:
        try:
            with self._pool.session() as conn, conn.transaction():
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
                conn.execute(
                    sql.SQL(
                        "CREATE TABLE IF NOT EXISTS {} (project TEXT NOT NULL, minute BIGINT NOT NULL,"
                        " requests BIGINT NOT NULL, PRIMARY KEY (project, minute))"
                    ).format(sql.Identifier(self.schema, "quota"))
                )
        except StoreUnavailable as exc:
            raise StoreUnavailable(f"cannot create PostgreSQL schema {self.schema!r}: {exc}") from exc

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
        # A decision that raises (e.g. a 409) rolls back cleanly and the connection is reused.
        with self._pool.session() as conn, conn.transaction():
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
        return result

    def read(self, project: str, key: str) -> LockRow | None:
        """Return the stored row, or None."""
        with self._pool.session() as conn:
            got = conn.execute(self._select, (project, key)).fetchone()
        return self._row(got)

    def quota_counter(self) -> PostgresQuotaCounter:
        """A quota counter in this database, shared by every server process that uses it."""
        return PostgresQuotaCounter(self._pool)

    def close(self) -> None:
        """Close every pooled connection."""
        self._pool.close()


class PostgresQuotaCounter:
    """Requests per (project, minute) in the schema's `quota` table: one statement per request."""

    def __init__(self, pool: PgPool) -> None:
        """Count through `pool` (the lock store's connections, bounds and schema)."""
        self._pool = pool
        table = sql.Identifier(pool.schema, "quota")
        # One statement, so one round trip and its own implicit transaction; set_config(..., true)
        # switches that transaction to asynchronous commit: no WAL flush wait per request, and a
        # crash of the database may lose the last few counts, which a rate limit can afford.
        self._increment = sql.SQL(
            "INSERT INTO {table} (project, minute, requests)"
            " SELECT %s, %s, 1 FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit"
            " ON CONFLICT (project, minute) DO UPDATE SET requests = {table}.requests + 1"
            " RETURNING requests"
        ).format(table=table)
        self._prune = sql.SQL("DELETE FROM {} WHERE minute < %s").format(table)

    def increment(self, project: str, window: int) -> int:
        """Count one request of `project` in minute `window`; return the minute's count so far."""
        with self._pool.session() as conn:
            got = conn.execute(self._increment, (project, window)).fetchone()
        assert got is not None and isinstance(got[0], int)
        return got[0]

    def prune(self, before: int) -> None:
        """Forget the counts of minutes before `before`."""
        with self._pool.session() as conn:
            conn.execute(self._prune, (before,))
