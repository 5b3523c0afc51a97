"""The SQL ledger's two tables and every statement on them, run on a sync ``Connection``.

``volcano_once`` holds one row per business key done (primary key: the business key); ``volcano_once_audit``
one row per forget (the record forgotten, by whom, when, why). Both faces of the ledger (``SQLLedger``,
``AsyncSQLLedger``) run these functions: the async one through ``AsyncConnection.run_sync``, so sync and
async decide alike.

Recording is ``INSERT ... ON CONFLICT (business_key) DO NOTHING RETURNING business_key``: no row back means
another transaction committed the key first, whatever the lock and the fence said (a writer whose lock
lapsed, a fence on another resource). On PostgreSQL the insert waits for a concurrent uncommitted row of the
same key and is then judged against it, so two transactions can never both record a key.
"""

from __future__ import annotations

import functools
import re
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection
from sqlalchemy.schema import CreateTable

from volcano_locks.once._record import AuditEntry, OnceRecord, Who

__all__ = ["DEFAULT_LEDGER_TABLE", "LedgerTables"]

DEFAULT_LEDGER_TABLE = "volcano_once"
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,56}$")


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)


class LedgerTables:
    """The ledger and audit tables of one engine's dialect, and the statements on them.

    Args:
        postgres: whether the dialect is PostgreSQL (else SQLite).
        table: the ledger table's name (the audit table is ``<table>_audit``).
        schema: their schema, if not the default one.
    """

    def __init__(self, postgres: bool, table: str, schema: str | None) -> None:
        for what, name in (("table", table), ("schema", schema)):
            if name is not None and not (isinstance(name, str) and _IDENTIFIER.match(name)):
                raise ValueError(
                    f"ledger {what} must be a SQL identifier of at most 57 characters, got {name!r}"
                )
        self.postgres = postgres
        self.ledger, self.audit = _tables(table, schema)
        self.ready = False
        """Whether this process knows the tables exist (then no statement checks again)."""

    def create(self, conn: Connection) -> None:
        """Create both tables in ``conn``'s transaction when missing (the caller commits)."""
        if self.postgres:  # CREATE ... IF NOT EXISTS races on the catalog between concurrent creators
            conn.execute(
                sa.select(sa.func.pg_advisory_xact_lock(sa.func.hashtext(sa.bindparam("name")))),
                {"name": f"volcano_locks.once.{self.ledger.fullname}"},
            )
        conn.execute(CreateTable(self.ledger, if_not_exists=True))
        conn.execute(CreateTable(self.audit, if_not_exists=True))

    def exists(self, conn: Connection) -> bool:
        """Whether the ledger table exists (asked of the catalog once per process)."""
        if not self.ready and sa.inspect(conn).has_table(self.ledger.name, schema=self.ledger.schema):
            self.ready = True
        return self.ready

    def lookup(self, conn: Connection, business_key: str) -> OnceRecord | None:
        """The record of ``business_key``, or ``None`` (also when the ledger table does not exist yet)."""
        if not self.exists(conn):
            return None
        row = conn.execute(sa.select(self.ledger).where(self.ledger.c.business_key == business_key)).first()
        return None if row is None else self._record(row)

    def insert(self, conn: Connection, record: OnceRecord) -> bool:
        """Record ``record`` in ``conn``'s transaction; ``False`` if the business key is already recorded."""
        values = {
            "business_key": record.business_key,
            "lock_key": record.lock_key,
            "fencing_token": record.fencing_token,
            "done_at": record.done_at,
            "who": record.who.to_dict(),
            "result": record.result,
        }
        insert = (postgresql.insert if self.postgres else sqlite.insert)(self.ledger).values(**values)
        stmt = insert.on_conflict_do_nothing(index_elements=["business_key"]).returning(
            self.ledger.c.business_key
        )
        return conn.execute(stmt).first() is not None

    def records(self, conn: Connection, prefix: str | None, limit: int) -> list[OnceRecord]:
        """Records whose key starts with ``prefix`` (all: ``None``), newest first, at most ``limit``."""
        if not self.exists(conn):
            return []
        stmt = sa.select(self.ledger).order_by(self.ledger.c.done_at.desc(), self.ledger.c.business_key)
        if prefix:
            escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            stmt = stmt.where(self.ledger.c.business_key.like(f"{escaped}%", escape="\\"))
        return [self._record(row) for row in conn.execute(stmt.limit(limit))]

    def forget(
        self, conn: Connection, business_key: str, by: str, why: str, at: datetime
    ) -> OnceRecord | None:
        """Delete ``business_key``'s record and write the audit row, in ``conn``'s transaction.

        Returns the record forgotten, or ``None`` when there was none (nothing is written then).
        """
        if not self.exists(conn):
            return None
        stmt = sa.delete(self.ledger).where(self.ledger.c.business_key == business_key)
        row = conn.execute(stmt.returning(*self.ledger.c)).first()
        if row is None:
            return None
        record = self._record(row)
        conn.execute(
            sa.insert(self.audit).values(
                business_key=business_key, action="forget", by=by, why=why, at=at, record=record.to_dict()
            )
        )
        return record

    def history(self, conn: Connection, business_key: str | None, limit: int) -> list[AuditEntry]:
        """The audit rows (of one key, or all), newest first."""
        if not self.exists(conn):
            return []
        stmt = sa.select(self.audit).order_by(self.audit.c.id.desc()).limit(limit)
        if business_key is not None:
            stmt = stmt.where(self.audit.c.business_key == business_key)
        return [
            AuditEntry(OnceRecord.from_dict(row.record), row.by, row.why, _aware(row.at))
            for row in conn.execute(stmt)
        ]

    @staticmethod
    def _record(row: Any) -> OnceRecord:
        return OnceRecord(
            business_key=row.business_key,
            lock_key=row.lock_key,
            fencing_token=int(row.fencing_token),
            done_at=_aware(row.done_at),
            who=Who.from_dict(row.who),
            result=row.result,
        )


@functools.lru_cache(maxsize=32)
def _tables(table: str, schema: str | None) -> tuple[sa.Table, sa.Table]:
    """The two tables, one pair per name (so an engine's compiled statements are reused)."""
    metadata = sa.MetaData(schema=schema)
    ledger = sa.Table(
        table,
        metadata,
        sa.Column("business_key", sa.String(256), primary_key=True),
        sa.Column("lock_key", sa.String(128), nullable=False),
        sa.Column("fencing_token", sa.BigInteger, nullable=False),
        sa.Column("done_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("who", sa.JSON, nullable=False),
        sa.Column("result", sa.JSON(none_as_null=True), nullable=True),
    )
    audit = sa.Table(
        f"{table}_audit",
        metadata,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("business_key", sa.String(256), nullable=False, index=False),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("by", sa.String(256), nullable=False),
        sa.Column("why", sa.Text, nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("record", sa.JSON, nullable=False),
    )
    return ledger, audit
