"""Which store backs a server: `open_store` picks SQLite or PostgreSQL from the `db` argument.

Apart from `store.py` (the interface the backends implement) so that neither backend's module and the
interface import each other.
"""

from __future__ import annotations

from .store import LockStore


def open_store(db: str) -> LockStore:
    """Open a store for `db`: a `postgresql://` / `postgres://` DSN, or else a SQLite file path."""
    if db.startswith(("postgresql://", "postgres://")):
        from .store_postgres import PostgresStore  # psycopg only for a PostgreSQL store

        return PostgresStore(db)
    from .store_sqlite import SqliteStore

    return SqliteStore(db)
