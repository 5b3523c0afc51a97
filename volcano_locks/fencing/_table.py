"""A ready-made fenced table of (resource, value) rows: a write needs a token no older than the stored one.

A lease cannot stop a holder whose renewal stalled past ``expires_at``: it may still be running when the
next holder takes over. The protected store is what keeps its late writes out. :class:`FencedTable`
is that store for SQLite and PostgreSQL, used by the example DAGs and flows, the demo and the chaos
suite, and a template for your own tables. One conditional statement decides each write, so the check
and the write cannot be separated by another writer::

    INSERT INTO fenced_resource (resource, lock_key, fencing_token, value, writer, written_at)
    VALUES (:resource, :lock_key, :fencing_token, :value, :writer, :written_at)
    ON CONFLICT (resource) DO UPDATE SET
        lock_key = excluded.lock_key, fencing_token = excluded.fencing_token, value = excluded.value,
        writer = excluded.writer, written_at = excluded.written_at
    WHERE fenced_resource.lock_key = excluded.lock_key
      AND fenced_resource.fencing_token <= excluded.fencing_token

Fencing tokens compare only within one lock key, so a row remembers the key that wrote it and refuses a
write under another key. Every attempt, accepted or not, is appended to ``<table>_history``.
"""

from __future__ import annotations

import os
import re
import sqlite3
import tempfile
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from volcano_locks.fencing._fence import Fence, refusal

__all__ = ["FencedTable", "FencedWrite"]

_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,50}$")
_T = TypeVar("_T")


@dataclass(frozen=True)
class FencedWrite:
    """One write (or write attempt) on a fenced resource."""

    resource: str
    lock_key: str
    fencing_token: int
    value: str
    writer: str
    written_at: datetime
    accepted: bool = True


class FencedTable:
    """A SQLite or PostgreSQL table of resources whose writes are checked against fencing tokens.

    Args:
        db: a SQLite file path, or a ``postgresql://`` DSN.
        table: the table's name (lower-case SQL identifier); the history goes to ``<table>_history``.

    Example:
        >>> table = FencedTable("/tmp/example.sqlite3")
        >>> with client.with_lock("daily-rollup", ttl=30) as guard:  # doctest: +SKIP
        ...     table.write_or_raise("rollup:2026-11-29", "daily-rollup", guard.fencing_token, "42 rows")
    """

    def __init__(self, db: str, *, table: str = "fenced_resource") -> None:
        if not _IDENTIFIER.match(table):
            raise ValueError(
                f"table must be a lower-case SQL identifier of at most 51 characters, got {table!r}"
            )
        self.db = db
        self.table = table
        self._postgres = db.startswith(("postgresql://", "postgres://"))
        self._ready = False

    @classmethod
    def from_env(
        cls, variable: str = "VOLCANO_EXAMPLES_DB", *, table: str = "fenced_resource"
    ) -> FencedTable:
        """The table in the database named by ``variable`` (a SQLite path or a DSN).

        Unset, it is ``volcano_examples.sqlite3`` in the temporary directory: what the example DAGs and
        flows use, so that tests and the demo can point them at a database of their own.
        """
        db = os.environ.get(variable) or os.path.join(tempfile.gettempdir(), "volcano_examples.sqlite3")
        return cls(db, table=table)

    def __repr__(self) -> str:
        where = "postgresql" if self._postgres else self.db
        return f"FencedTable({where!r}, table={self.table!r})"

    def write(
        self, resource: str, lock_key: str, fencing_token: int, value: str, *, writer: str = ""
    ) -> bool:
        """Store ``value`` unless a newer token (or another lock key) wrote ``resource``; True if stored."""
        if isinstance(fencing_token, bool) or not isinstance(fencing_token, int):
            raise TypeError(f"fencing_token must be an int, got {fencing_token!r}")
        t, p = self.table, self._placeholder
        now = datetime.now(UTC).isoformat()

        def upsert(conn: Any) -> bool:
            accepted = (
                conn.execute(
                    f"INSERT INTO {t} (resource, lock_key, fencing_token, value, writer, written_at)"
                    f" VALUES ({p}, {p}, {p}, {p}, {p}, {p})"
                    f" ON CONFLICT (resource) DO UPDATE SET lock_key = excluded.lock_key,"
                    f" fencing_token = excluded.fencing_token, value = excluded.value,"
                    f" writer = excluded.writer, written_at = excluded.written_at"
                    f" WHERE {t}.lock_key = excluded.lock_key"
                    f" AND {t}.fencing_token <= excluded.fencing_token",
                    (resource, lock_key, fencing_token, value, writer, now),
                ).rowcount
                == 1
            )
            conn.execute(
                f"INSERT INTO {t}_history"
                " (resource, lock_key, fencing_token, value, writer, written_at, accepted)"
                f" VALUES ({p}, {p}, {p}, {p}, {p}, {p}, {p})",
                (resource, lock_key, fencing_token, value, writer, now, accepted),
            )
            return bool(accepted)

        return self._run(upsert)

    def write_or_raise(
        self, resource: str, lock_key: str, fencing_token: int, value: str, *, writer: str = ""
    ) -> None:
        """Like :meth:`write`, but raise :class:`StaleFencingToken` when the write is refused."""
        if not self.write(resource, lock_key, fencing_token, value, writer=writer):
            raise refusal("table", resource, Fence(lock_key, fencing_token), self.read(resource))

    def read(self, resource: str) -> FencedWrite | None:
        """Return the write that ``resource`` holds now, if any."""
        row = self._run(
            lambda conn: conn.execute(
                f"SELECT resource, lock_key, fencing_token, value, writer, written_at FROM {self.table}"
                f" WHERE resource = {self._placeholder}",
                (resource,),
            ).fetchone()
        )
        return None if row is None else _write_from_row(row, accepted=True)

    def history(self, resource: str | None = None) -> list[FencedWrite]:
        """Return every write attempt, in order, on ``resource`` (or on every resource)."""
        where, args = (f" WHERE resource = {self._placeholder}", (resource,)) if resource else ("", ())
        rows = self._run(
            lambda conn: conn.execute(
                "SELECT resource, lock_key, fencing_token, value, writer, written_at, accepted"
                f" FROM {self.table}_history{where} ORDER BY id",
                args,
            ).fetchall()
        )
        return [_write_from_row(row[:6], accepted=bool(row[6])) for row in rows]

    @property
    def _placeholder(self) -> str:
        return "%s" if self._postgres else "?"

    def _run(self, work: Callable[[Any], _T]) -> _T:
        """``work`` on one connection in one transaction, the tables created when first found missing.

        No statement looks for them in advance on PostgreSQL (a new FencedTable per run costs nothing once
        they exist): a missing table fails the transaction, which runs again after creating them. SQLite
        reads its own catalog, in-process, on a FencedTable's first call.
        """
        if not self._ready and not self._postgres and not self._sqlite_tables_exist():
            self._create_tables()
        try:
            with self._connect() as conn:
                result = work(conn)
        except Exception as exc:
            if self._ready or getattr(exc, "sqlstate", None) != "42P01":  # psycopg's undefined_table
                raise
            self._create_tables()
            with self._connect() as conn:
                result = work(conn)
        self._ready = True
        return result

    def _sqlite_tables_exist(self) -> bool:
        if not Path(self.db).exists():
            return False
        with closing(sqlite3.connect(self.db, timeout=30)) as lite:
            names = {f"{self.table}", f"{self.table}_history"}
            found = lite.execute(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name IN (?, ?)", tuple(names)
            ).fetchone()[0]
        return bool(found == len(names))

    @contextmanager
    def _connect(self) -> Iterator[Any]:
        """One connection and one transaction per call: safe to share the table between processes."""
        if self._postgres:
            import psycopg

            with psycopg.connect(self.db) as pg:
                yield pg
            return
        Path(self.db).parent.mkdir(parents=True, exist_ok=True)
        with closing(sqlite3.connect(self.db, timeout=30)) as lite, lite:
            yield lite

    def _create_tables(self) -> None:
        serial = "BIGSERIAL PRIMARY KEY" if self._postgres else "INTEGER PRIMARY KEY AUTOINCREMENT"
        statements = [
            f"CREATE TABLE IF NOT EXISTS {self.table} (resource TEXT PRIMARY KEY, lock_key TEXT NOT NULL,"
            " fencing_token BIGINT NOT NULL, value TEXT NOT NULL, writer TEXT NOT NULL,"
            " written_at TEXT NOT NULL)",
            f"CREATE TABLE IF NOT EXISTS {self.table}_history (id {serial}, resource TEXT NOT NULL,"
            " lock_key TEXT NOT NULL, fencing_token BIGINT NOT NULL, value TEXT NOT NULL,"
            " writer TEXT NOT NULL,"
            " written_at TEXT NOT NULL, accepted BOOLEAN NOT NULL)",
        ]
        if self._postgres:
            import psycopg

            # IF NOT EXISTS is not atomic in PostgreSQL: concurrent creators can still collide on the
            # catalog, so creation is serialised on an advisory lock named after the table.
            with psycopg.connect(self.db) as pg:
                pg.execute(
                    "SELECT pg_advisory_xact_lock(hashtext(%s))", (f"volcano_locks.fencing.{self.table}",)
                )
                for statement in statements:
                    pg.execute(statement)
        else:
            Path(self.db).parent.mkdir(parents=True, exist_ok=True)
            with closing(sqlite3.connect(self.db, timeout=30)) as lite, lite:
                for statement in statements:
                    lite.execute(statement)
        self._ready = True


def _write_from_row(row: Any, *, accepted: bool) -> FencedWrite:
    resource, lock_key, token, value, writer, written_at = row
    return FencedWrite(
        resource=resource,
        lock_key=lock_key,
        fencing_token=int(token),
        value=value,
        writer=writer,
        written_at=datetime.fromisoformat(written_at),
        accepted=accepted,
    )
