"""What the run-once tests write: a user's own rollup table beside the ledger, on SQLite or PostgreSQL."""

from __future__ import annotations

import uuid
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from volcano_locks.once import SQLLedger


class Warehouse:
    """A rollup table (one row per effect done) and a ledger with tables of its own, on one database.

    Names are unique per instance, so tests running at once on the shared PostgreSQL never meet.
    """

    def __init__(self, url: str) -> None:
        self.name = f"once_{uuid.uuid4().hex[:10]}"
        self.url = url
        self.engine: Engine = sa.create_engine(url)
        self.rollup = sa.Table(
            f"{self.name}_rollup",
            sa.MetaData(),
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
            sa.Column("business_key", sa.String(256), nullable=False),
            sa.Column("fencing_token", sa.BigInteger, nullable=False),
        )
        self.rollup.create(self.engine)
        self.ledger = SQLLedger(self.engine, table=f"{self.name}_ledger")

    def effect(self, conn: Connection, business_key: str, token: int) -> None:
        """The user's effect: one row of the rollup."""
        conn.execute(sa.insert(self.rollup).values(business_key=business_key, fencing_token=token))

    def effects(self, business_key: str | None = None) -> int:
        """How many effects committed (of one key, or all)."""
        stmt = sa.select(sa.func.count()).select_from(self.rollup)
        if business_key is not None:
            stmt = stmt.where(self.rollup.c.business_key == business_key)
        with self.engine.connect() as conn:
            return int(conn.execute(stmt).scalar_one())

    def drop(self) -> None:
        """Drop every table of this warehouse, the ledger's and the guard's included."""
        tables = [self.rollup, self.ledger.tables.ledger, self.ledger.tables.audit, self.ledger.fenced.table]
        with self.engine.begin() as conn:
            for table in tables:
                table.drop(conn, checkfirst=True)
        self.engine.dispose()


def sqlite_url(tmp: Path) -> str:
    """A SQLite file in ``tmp``."""
    return f"sqlite:///{tmp / 'warehouse.sqlite3'}"
