"""A claim on one connection: the guard is the first statement of every transaction until the claim ends.

SQLAlchemy 2's commit-as-you-go (``conn.commit()``, then more statements on the same connection) starts a
new transaction on the next statement. A guard claimed once would cover only the first of them: the next
batch would commit unfenced. So a :class:`Claim` listens to the connection's ``before_execute`` event and,
on the first statement of each new transaction (found by the transaction object changing), claims the
guard again before that statement runs. What goes through the connection (``execute``, ``scalar``,
``exec_driver_sql``, DDL, an ORM ``Session`` bound to it, savepoints) is covered; the raw DBAPI connection
(``conn.connection``) is not, as it is outside SQLAlchemy.

The claim ends with :meth:`Claim.end` (or its ``with`` block), or when the connection is closed (its
listeners go with it: a pooled connection checked out again is a new ``Connection``). Several claims on one
connection re-claim in the order they were made, one at a time (a flag in ``conn.info``), so two resources
fenced in one transaction keep a fixed order. AsyncFencedSQL's claims are the same object on the async
connection's ``sync_connection``: SQLAlchemy runs its events inside the greenlet that drives the I/O.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Connection

from volcano_locks.fencing._fence import Fence
from volcano_locks.fencing._sql_guard import Guard

__all__ = ["Claim"]

_CLAIMING = "volcano_locks.fencing.claiming"


class Claim:
    """``resource`` claimed under ``fence`` on one connection, for every transaction until it ends.

    Made by ``FencedSQL.claim`` / ``begin`` (and their async twins), which claim the guard at once; from
    then on each transaction's first statement is preceded by the guard. ``active`` says whether it still
    listens; a refusal on a later transaction raises from that statement, before it runs.
    """

    def __init__(self, guard: Guard, conn: Connection, resource: str, fence: Fence) -> None:
        self.guard = guard
        self.connection = conn
        self.resource = resource
        self.fence = fence
        self._claimed_in: object | None = None
        self.active = False

    def __repr__(self) -> str:
        state = "active" if self.active else "ended"
        fence = self.fence
        return f"Claim({self.resource!r}, {fence.lock_key!r}, fencing_token={fence.fencing_token}, {state})"

    def start(self, *, fresh: bool) -> Claim:
        """Claim the guard in the connection's current transaction, then follow every later one."""
        self._claim(fresh=fresh)
        event.listen(self.connection, "before_execute", self._before_execute)
        self.active = True
        return self

    def end(self) -> None:
        """Stop claiming later transactions (what is claimed now stays claimed until it ends)."""
        if self.active:
            self.active = False
            event.remove(self.connection, "before_execute", self._before_execute)

    def __enter__(self) -> Claim:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.end()

    def _before_execute(self, conn: Connection, *_: Any) -> None:
        if conn.info.get(_CLAIMING) or (
            self._claimed_in is not None and conn.get_transaction() is self._claimed_in
        ):
            return
        self._claim(fresh=False)

    def _claim(self, *, fresh: bool) -> None:
        conn = self.connection
        conn.info[_CLAIMING] = True
        try:
            self.guard.claim(conn, self.resource, self.fence, fresh=fresh)
        finally:
            conn.info.pop(_CLAIMING, None)
        self._claimed_in = conn.get_transaction()
