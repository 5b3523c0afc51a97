"""The protected resource for the chaos suite: the project's shared ``volcano_locks.fencing.FencedTable``.

The chaos suite attacks the same fenced table the examples and the demo use (one conditional upsert per
write: ``... DO UPDATE ... WHERE fencing_token <= :t``, every attempt appended to ``<table>_history``), so
what it proves holds for that table. This adapter only adds what the checker needs: each attempt's
critical section (``cs``) and whether it was the deliberate late write after a SIGCONT, carried in the
value as JSON, and the history as plain rows in table order (``seq``). The upsert holds the row lock
(PostgreSQL) or the write lock (SQLite) while the history row is inserted in the same transaction, so
history order is the order in which writes took effect: the checker relies on that.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from volcano_locks.fencing import FencedTable

__all__ = ["RESOURCE", "FencedStore", "WriteRow", "open_store"]

RESOURCE = "chaos-protected"


@dataclass(frozen=True)
class WriteRow:
    """One attempted write as recorded in the history table."""

    seq: int
    fencing_token: int
    value: str
    writer: str
    cs: int
    late: bool
    accepted: bool

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
        }


class FencedStore:
    """One fenced resource in a shared table, as the chaos workers and the checker see it."""

    def __init__(self, url: str, table: str, lock_key: str) -> None:
        """Use ``table`` (and ``<table>_history``) in the SQLite file or PostgreSQL DSN ``url``."""
        self._table = FencedTable(url, table=table)
        self._lock_key = lock_key

    def write(self, token: int, value: str, *, writer: str, cs: int, late: bool = False) -> bool:
        """Attempt a fenced write; return whether it was accepted."""
        payload = json.dumps({"v": value, "cs": cs, "late": late}, separators=(",", ":"))
        return self._table.write(RESOURCE, self._lock_key, token, payload, writer=writer)

    def current(self) -> tuple[int, str]:
        """Return the resource's (fencing_token, value) now; (0, "") if never written."""
        row = self._table.read(RESOURCE)
        return (0, "") if row is None else (row.fencing_token, json.loads(row.value)["v"])

    def writes(self) -> list[WriteRow]:
        """Return every recorded attempt in table order."""
        rows = []
        for seq, w in enumerate(self._table.history(RESOURCE), 1):
            meta = json.loads(w.value)
            rows.append(
                WriteRow(
                    seq, w.fencing_token, meta["v"], w.writer, int(meta["cs"]), bool(meta["late"]), w.accepted
                )
            )
        return rows

    def drop(self) -> None:
        """Drop both tables (PostgreSQL; a SQLite file stays with the run's logs)."""
        if self._table.db.startswith(("postgresql://", "postgres://")):
            import psycopg

            with psycopg.connect(self._table.db, autocommit=True) as conn:
                conn.execute(f"DROP TABLE IF EXISTS {self._table.table}_history")
                conn.execute(f"DROP TABLE IF EXISTS {self._table.table}")

    def close(self) -> None:
        """Nothing to close: the shared table opens one connection per write."""


def open_store(url: str, table: str = "protected", lock_key: str = "chaos") -> FencedStore:
    """Open the protected resource: ``url`` is a ``postgresql://`` DSN or a SQLite file path."""
    return FencedStore(url.removeprefix("sqlite:"), table, lock_key)
