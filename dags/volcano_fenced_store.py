"""A fenced table for the example DAGs: a write lands only if its fencing token is not stale.

The database is SQLite by default or PostgreSQL; ``VOLCANO_EXAMPLES_DB`` chooses it: a file path
(default: ``volcano_examples.sqlite`` in the temp directory) or a ``postgresql://`` DSN. Every
attempt is recorded in ``fenced_history`` with whether it was accepted, so a test (or you) can
check that no stale write ever landed.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["StaleFencingToken", "database", "fenced_write", "history", "read"]


class StaleFencingToken(RuntimeError):
    """A write carried a fencing token older than the one already stored."""


def database() -> str:
    """Return where the example table lives (``VOLCANO_EXAMPLES_DB``)."""
    return os.environ.get("VOLCANO_EXAMPLES_DB") or os.path.join(
        tempfile.gettempdir(), "volcano_examples.sqlite"
    )


def _is_pg(db: str) -> bool:
    return db.startswith(("postgresql://", "postgres://"))


@contextmanager
def _connect() -> Iterator[tuple[Any, str]]:
    db = database()
    if _is_pg(db):
        import psycopg

        with psycopg.connect(db, autocommit=False) as conn:
            yield conn, "%s"
        return
    conn = sqlite3.connect(db, timeout=30)
    try:
        with conn:
            yield conn, "?"
    finally:
        conn.close()


def _ensure(conn: Any) -> None:
    serial = "BIGSERIAL PRIMARY KEY" if _is_pg(database()) else "INTEGER PRIMARY KEY AUTOINCREMENT"
    conn.execute(
        "CREATE TABLE IF NOT EXISTS fenced_resource ("
        " resource TEXT PRIMARY KEY, lock_key TEXT NOT NULL, fencing_token BIGINT NOT NULL, value TEXT)"
    )
    conn.execute(
        "CREATE TABLE IF NOT EXISTS fenced_history ("
        f" id {serial}, resource TEXT NOT NULL, lock_key TEXT NOT NULL, fencing_token BIGINT NOT NULL,"
        " value TEXT, accepted BOOLEAN NOT NULL)"
    )


def fenced_write(resource: str, lock_key: str, fencing_token: int, value: str) -> None:
    """Write ``value`` to ``resource`` unless a newer fencing token already wrote it.

    One conditional statement decides (no read-then-write race). Fencing tokens compare only
    within one lock key, so the resource records its key.

    :raises StaleFencingToken: the stored token is newer: this writer lost the lock.
    """
    with _connect() as (conn, p):
        _ensure(conn)
        cur = conn.execute(
            "INSERT INTO fenced_resource (resource, lock_key, fencing_token, value)"
            f" VALUES ({p}, {p}, {p}, {p})"
            " ON CONFLICT (resource) DO UPDATE SET fencing_token = excluded.fencing_token,"
            " value = excluded.value, lock_key = excluded.lock_key"
            " WHERE fenced_resource.lock_key = excluded.lock_key"
            " AND fenced_resource.fencing_token <= excluded.fencing_token",
            (resource, lock_key, int(fencing_token), value),
        )
        accepted = cur.rowcount == 1
        conn.execute(
            "INSERT INTO fenced_history (resource, lock_key, fencing_token, value, accepted)"
            f" VALUES ({p}, {p}, {p}, {p}, {p})",
            (resource, lock_key, int(fencing_token), value, accepted),
        )
    if not accepted:
        raise StaleFencingToken(
            f"stale write to {resource!r} rejected: fencing token {fencing_token} of lock {lock_key!r} "
            "is older than the stored one (or the resource is fenced by another lock)"
        )


def read(resource: str) -> tuple[int, str] | None:
    """Return ``(fencing_token, value)`` stored for ``resource``, if any."""
    with _connect() as (conn, p):
        _ensure(conn)
        row = conn.execute(
            f"SELECT fencing_token, value FROM fenced_resource WHERE resource = {p}", (resource,)
        ).fetchone()
    return None if row is None else (int(row[0]), row[1])


def history(resource: str) -> list[tuple[int, str, bool]]:
    """Return every write attempt on ``resource``: ``(fencing_token, value, accepted)`` in order."""
    with _connect() as (conn, p):
        _ensure(conn)
        rows = conn.execute(
            f"SELECT fencing_token, value, accepted FROM fenced_history WHERE resource = {p} ORDER BY id",
            (resource,),
        ).fetchall()
    return [(int(t), v, bool(a)) for t, v, a in rows]
