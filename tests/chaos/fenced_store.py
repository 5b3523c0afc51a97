"""The protected resource: one row that accepts a write only through the fencing check.

``write`` runs one transaction: the conditional update
``UPDATE t SET fencing_token = :t, value = :v WHERE id = :id AND fencing_token <= :t`` and an insert into the
append-only ``<t>_writes`` table recording the attempt and whether it was accepted. In PostgreSQL the update
takes the row lock before the insert draws its ``seq``, and in SQLite ``BEGIN IMMEDIATE`` serialises writers,
so ``seq`` order is the order in which accepted writes took effect: the checker relies on that.
"""

from __future__ import annotations

import re
import sqlite3
import time
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["FencedStore", "WriteRow", "open_store"]

_TABLE = re.compile(r"^[a-z_][a-z0-9_]{0,40}$")
RESOURCE_ID = 1


@dataclass(frozen=True)
class WriteRow:
    """One attempted write as recorded in the writes table."""

    seq: int
    fencing_token: int
    value: str
    writer: str
    cs: int
    late: bool
    accepted: bool
    mono: float

    def as_dict(self) -> dict[str, Any]:
        """Return the row as a plain dict (the checker's input form)."""
        return {
            "seq": self.seq,
            "token": self.fencing_token,
            "value": self.value,
            "worker": self.writer,
            "cs": self.cs,
            "late": self.late,
            "accepted": self.accepted,
            "mono": self.mono,
        }


class FencedStore(Protocol):
    """What a worker and the checker need from the protected table."""

    def write(self, token: int, value: str, *, writer: str, cs: int, late: bool = False) -> bool:
        """Attempt a fenced write; return whether it was accepted."""

    def current(self) -> tuple[int, str]:
        """Return the row's (fencing_token, value)."""

    def writes(self) -> list[WriteRow]:
        """Return every recorded attempt in ``seq`` order."""

    def drop(self) -> None:
        """Drop the tables (PostgreSQL) or leave the file (SQLite)."""

    def close(self) -> None:
        """Close the connection."""


def _check_table(table: str) -> str:
    if not _TABLE.match(table):
        raise ValueError(f"table name must match {_TABLE.pattern}: {table!r}")
    return table


class SqliteStore:
    """The protected table in a SQLite file shared by all worker processes."""

    def __init__(self, path: str, table: str = "protected") -> None:
        """Open (and create if needed) the tables in the SQLite file at ``path``."""
        self._t = _check_table(table)
        # isolation_level=None: we issue BEGIN IMMEDIATE ourselves so the write lock is taken up front.
        self._db = sqlite3.connect(path, timeout=60.0, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA busy_timeout=60000")
        self._db.execute(
            f"CREATE TABLE IF NOT EXISTS {self._t} (id INTEGER PRIMARY KEY, "
            "fencing_token INTEGER NOT NULL, value TEXT NOT NULL)"
        )
        self._db.execute(
            f"CREATE TABLE IF NOT EXISTS {self._t}_writes (seq INTEGER PRIMARY KEY AUTOINCREMENT, "
            "resource_id INTEGER NOT NULL, fencing_token INTEGER NOT NULL, value TEXT NOT NULL, "
            "writer TEXT NOT NULL, cs INTEGER NOT NULL, late INTEGER NOT NULL, accepted INTEGER NOT NULL, "
            "mono REAL NOT NULL)"
        )
        self._db.execute(
            f"INSERT OR IGNORE INTO {self._t} (id, fencing_token, value) VALUES (?, 0, '')", (RESOURCE_ID,)
        )

    def write(self, token: int, value: str, *, writer: str, cs: int, late: bool = False) -> bool:
        """Attempt a fenced write; return whether it was accepted."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            cur = self._db.execute(
                f"UPDATE {self._t} SET fencing_token = ?, value = ? WHERE id = ? AND fencing_token <= ?",
                (token, value, RESOURCE_ID, token),
            )
            accepted = cur.rowcount == 1
            self._db.execute(
                f"INSERT INTO {self._t}_writes (resource_id, fencing_token, value, writer, cs, late, "
                "accepted, mono) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (RESOURCE_ID, token, value, writer, cs, int(late), int(accepted), time.monotonic()),
            )
            self._db.execute("COMMIT")
        except BaseException:
            # An interrupt may land after COMMIT returned: then there is nothing left to roll back.
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise
        return accepted

    def current(self) -> tuple[int, str]:
        """Return the row's (fencing_token, value)."""
        row = self._db.execute(
            f"SELECT fencing_token, value FROM {self._t} WHERE id = ?", (RESOURCE_ID,)
        ).fetchone()
        return int(row[0]), str(row[1])

    def writes(self) -> list[WriteRow]:
        """Return every recorded attempt in ``seq`` order."""
        rows = self._db.execute(
            f"SELECT seq, fencing_token, value, writer, cs, late, accepted, mono FROM {self._t}_writes "
            "ORDER BY seq"
        ).fetchall()
        return [
            WriteRow(int(r[0]), int(r[1]), r[2], r[3], int(r[4]), bool(r[5]), bool(r[6]), r[7]) for r in rows
        ]

    def drop(self) -> None:
        """Leave the file in place: it is evidence, and lives in the run's temp dir."""

    def close(self) -> None:
        """Close the connection."""
        self._db.close()


class PostgresStore:
    """The protected table in PostgreSQL, under a per-run table name."""

    def __init__(self, dsn: str, table: str) -> None:
        """Connect to ``dsn`` and create the tables ``table`` and ``table_writes`` if needed."""
        import psycopg  # only the PostgreSQL runs need it

        self._t = _check_table(table)
        # autocommit: every transaction below is an explicit ``transaction()`` block.
        self._db = psycopg.connect(dsn, autocommit=True, connect_timeout=10)
        self._db.execute("SET lock_timeout = '60s'")
        with self._db.transaction():
            self._db.execute(
                f"CREATE TABLE IF NOT EXISTS {self._t} (id INTEGER PRIMARY KEY, "
                "fencing_token BIGINT NOT NULL, value TEXT NOT NULL)"
            )
            self._db.execute(
                f"CREATE TABLE IF NOT EXISTS {self._t}_writes (seq BIGSERIAL PRIMARY KEY, "
                "resource_id INTEGER NOT NULL, fencing_token BIGINT NOT NULL, value TEXT NOT NULL, "
                "writer TEXT NOT NULL, cs INTEGER NOT NULL, late BOOLEAN NOT NULL, "
                "accepted BOOLEAN NOT NULL, "
                "mono DOUBLE PRECISION NOT NULL)"
            )
            self._db.execute(
                f"INSERT INTO {self._t} (id, fencing_token, value) VALUES (%s, 0, '') ON CONFLICT DO NOTHING",
                (RESOURCE_ID,),
            )

    def write(self, token: int, value: str, *, writer: str, cs: int, late: bool = False) -> bool:
        """Attempt a fenced write; return whether it was accepted."""
        with self._db.transaction():
            cur = self._db.execute(
                f"UPDATE {self._t} SET fencing_token = %s, value = %s WHERE id = %s AND fencing_token <= %s",
                (token, value, RESOURCE_ID, token),
            )
            accepted = cur.rowcount == 1
            self._db.execute(
                f"INSERT INTO {self._t}_writes (resource_id, fencing_token, value, writer, cs, late, "
                "accepted, mono) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                (RESOURCE_ID, token, value, writer, cs, late, accepted, time.monotonic()),
            )
        return accepted

    def current(self) -> tuple[int, str]:
        """Return the row's (fencing_token, value)."""
        with self._db.transaction():
            row = self._db.execute(
                f"SELECT fencing_token, value FROM {self._t} WHERE id = %s", (RESOURCE_ID,)
            ).fetchone()
        assert row is not None
        return int(row[0]), str(row[1])

    def writes(self) -> list[WriteRow]:
        """Return every recorded attempt in ``seq`` order."""
        with self._db.transaction():
            rows = self._db.execute(
                f"SELECT seq, fencing_token, value, writer, cs, late, accepted, mono FROM {self._t}_writes "
                "ORDER BY seq"
            ).fetchall()
        return [
            WriteRow(int(r[0]), int(r[1]), r[2], r[3], int(r[4]), bool(r[5]), bool(r[6]), r[7]) for r in rows
        ]

    def drop(self) -> None:
        """Drop both tables."""
        with self._db.transaction():
            self._db.execute(f"DROP TABLE IF EXISTS {self._t}_writes")
            self._db.execute(f"DROP TABLE IF EXISTS {self._t}")

    def close(self) -> None:
        """Close the connection."""
        self._db.close()


def open_store(url: str, table: str = "protected") -> FencedStore:
    """Open the protected table: ``url`` is a ``postgresql://`` DSN or a SQLite file path."""
    if url.startswith(("postgresql://", "postgres://")):
        return PostgresStore(url, table)
    return SqliteStore(url.removeprefix("sqlite:"), table)
