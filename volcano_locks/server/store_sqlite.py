"""SQLite lock store and quota counter: one WAL-mode file, each change one transaction (multi-process safe).

A new database file is created with mode 0600 (its -wal and -shm files follow), in a 0700 directory.

The quota is counted in the file too (one upsert per request, no fsync in WAL mode with
synchronous=NORMAL), so server processes sharing a file share the quota as they share the locks.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import stat
import threading

from .errors import StoreUnavailable
from .store import Decide, LockRow, T

__all__ = ["SqliteQuotaCounter", "SqliteStore"]

log = logging.getLogger("volcano_locks.server")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS locks (
    project     TEXT    NOT NULL,
    key         TEXT    NOT NULL,
    token_hash  TEXT,
    fencing     INTEGER NOT NULL,
    expires_us  INTEGER NOT NULL,
    deadline_us INTEGER NOT NULL,
    PRIMARY KEY (project, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS quota (
    project  TEXT    NOT NULL,
    minute   INTEGER NOT NULL,
    requests INTEGER NOT NULL,
    PRIMARY KEY (project, minute)
) WITHOUT ROWID;
"""
_SELECT = "SELECT token_hash, fencing, expires_us, deadline_us FROM locks WHERE project = ? AND key = ?"
_UPSERT = """
INSERT INTO locks (project, key, token_hash, fencing, expires_us, deadline_us) VALUES (?, ?, ?, ?, ?, ?)
ON CONFLICT (project, key) DO UPDATE SET token_hash = excluded.token_hash, fencing = excluded.fencing,
    expires_us = excluded.expires_us, deadline_us = excluded.deadline_us
"""


class SqliteStore:
    """Lock rows in a SQLite file; a restart (or a crash of the process) loses no committed change."""

    def __init__(self, path: str) -> None:
        """Open (and create if needed) the database file at `path`."""
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, mode=0o700, exist_ok=True)
        self.path = path
        # Create the file private to its owner; SQLite gives its -wal and -shm files the same mode.
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except FileExistsError:
            mode = os.stat(path).st_mode
            if mode & 0o077:
                log.warning(
                    "database file %s has mode %s: other users may read its lock state; chmod 600 it",
                    path,
                    stat.filemode(mode),
                )
        # One connection serialised by a lock: SQLite allows one writer anyway, and BEGIN IMMEDIATE
        # plus busy_timeout serialises writers from other processes on the same file.
        self._lock = threading.Lock()
        try:
            self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=10.0)
            self._conn.execute("PRAGMA journal_mode=WAL")
            # NORMAL in WAL mode survives a process crash; only an OS crash can lose the last commits.
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.execute("PRAGMA busy_timeout=10000")
            self._conn.executescript(_SCHEMA)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"cannot open SQLite database {path!r}: {exc}") from exc

    def update(self, project: str, key: str, decide: Decide[T]) -> T:
        """Read, decide and write the row inside one BEGIN IMMEDIATE transaction."""
        with self._lock:
            conn = self._conn
            try:
                conn.execute("BEGIN IMMEDIATE")
                got = conn.execute(_SELECT, (project, key)).fetchone()
                row = LockRow(*got) if got is not None else None
                try:
                    new, result = decide(row)
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                if new is not None:
                    conn.execute(
                        _UPSERT,
                        (project, key, new.token_hash, new.fencing, new.expires_us, new.deadline_us),
                    )
                conn.execute("COMMIT")
                return result
            except sqlite3.Error as exc:
                if conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                raise StoreUnavailable(f"SQLite error: {exc}") from exc

    def read(self, project: str, key: str) -> LockRow | None:
        """Return the stored row, or None."""
        with self._lock:
            try:
                got = self._conn.execute(_SELECT, (project, key)).fetchone()
            except sqlite3.Error as exc:
                raise StoreUnavailable(f"SQLite error: {exc}") from exc
        return LockRow(*got) if got is not None else None

    def quota_counter(self) -> SqliteQuotaCounter:
        """A quota counter in this file, shared by every server process that uses it."""
        return SqliteQuotaCounter(self._conn, self._lock)

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._conn.close()


_INCREMENT = """
INSERT INTO quota (project, minute, requests) VALUES (?, ?, 1)
ON CONFLICT (project, minute) DO UPDATE SET requests = requests + 1 RETURNING requests
"""


class SqliteQuotaCounter:
    """Requests per (project, minute) in the file's `quota` table, on the store's connection."""

    def __init__(self, conn: sqlite3.Connection, lock: threading.Lock) -> None:
        """Count through the store's connection, serialised by the store's lock."""
        self._conn = conn
        self._lock = lock

    def increment(self, project: str, window: int) -> int:
        """Count one request of `project` in minute `window`; return the minute's count so far."""
        with self._lock:
            try:
                # fetchall() steps the statement to its end, which commits the implicit transaction and
                # releases the write lock; fetchone() would hold it until the cursor is collected.
                got = self._conn.execute(_INCREMENT, (project, window)).fetchall()
            except sqlite3.Error as exc:
                raise StoreUnavailable(f"SQLite error: {exc}") from exc
        count = got[0][0]
        assert isinstance(count, int)
        return count

    def prune(self, before: int) -> None:
        """Forget the counts of minutes before `before`."""
        with self._lock:
            try:
                self._conn.execute("DELETE FROM quota WHERE minute < ?", (before,))
            except sqlite3.Error as exc:
                raise StoreUnavailable(f"SQLite error: {exc}") from exc
