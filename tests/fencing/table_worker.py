"""A contender for test_contention: threads that take a lock through with_lock and write to a FencedTable.

Run as a script: ``python table_worker.py DB TABLE KEY THREADS ITERATIONS`` with VOLCANO_* in the
environment. DB is a SQLite file path or a ``postgresql://`` DSN; the fenced write goes through
``volcano_locks.fencing.FencedTable`` (table ``TABLE``, history in ``TABLE_history``). The one thing
FencedTable does not give is :class:`Occupancy`, which tells whether two holders were ever inside the
critical section at once; each write carries that answer in its value.
"""

from __future__ import annotations

import os
import random
import sqlite3
import sys
import threading
import time
from typing import Any

from volcano_locks import LockContention, VolcanoLocks
from volcano_locks.fencing import FencedTable

RESOURCE = "core-fenced"
ALONE, OVERLAP = "alone", "overlap"


class Occupancy:
    """A one-row ``<table>_inside`` naming who is in the critical section (autocommit, one statement each).

    ``enter`` claims the row only when it is empty, so a second holder inside at the same time finds it
    taken: that is the overlap the lock must prevent.
    """

    def __init__(self, db: str, table: str) -> None:
        self.table = f"{table}_inside"
        self.pg = db.startswith("postgresql://")
        if self.pg:
            import psycopg

            self.conn: Any = psycopg.connect(db, autocommit=True)
        else:
            self.conn = sqlite3.connect(db, timeout=30, isolation_level=None, check_same_thread=False)

    def close(self) -> None:
        self.conn.close()

    def _run(self, sql: str, params: tuple[object, ...] = ()) -> int:
        sql = sql.replace("{t}", self.table)
        return int(self.conn.execute(sql.replace("?", "%s") if self.pg else sql, params).rowcount)

    def create(self) -> None:
        self._run("CREATE TABLE {t} (id INTEGER PRIMARY KEY, holder TEXT)")
        self._run("INSERT INTO {t} (id, holder) VALUES (1, NULL)")

    def drop(self) -> None:
        self._run("DROP TABLE IF EXISTS {t}")

    def enter(self, worker: str) -> bool:
        """Claim the section for ``worker``; False if someone else was inside."""
        return self._run("UPDATE {t} SET holder = ? WHERE id = 1 AND holder IS NULL", (worker,)) == 1

    def leave(self, worker: str) -> None:
        self._run("UPDATE {t} SET holder = NULL WHERE id = 1 AND holder = ?", (worker,))


def section(table: FencedTable, occupancy: Occupancy, key: str, worker: str, fence: int, hold: float) -> None:
    """One critical section: enter, hold, one fenced write recording whether it was alone, leave."""
    alone = occupancy.enter(worker)
    time.sleep(hold)
    table.write(RESOURCE, key, fence, ALONE if alone else OVERLAP, writer=worker)
    occupancy.leave(worker)


def contend(db: str, table_name: str, key: str, worker: str, iterations: int) -> None:
    table = FencedTable(db, table=table_name)
    occupancy = Occupancy(db, table_name)
    rng = random.Random()
    done = 0
    try:
        with VolcanoLocks() as client:
            while done < iterations:
                try:
                    with client.with_lock(key, 5) as guard:
                        assert guard.fencing_token is not None
                        section(table, occupancy, key, worker, guard.fencing_token, rng.uniform(0.005, 0.03))
                    done += 1
                except LockContention:
                    time.sleep(rng.uniform(0.005, 0.03))
    finally:
        occupancy.close()


def main() -> None:
    db, table, key, threads, iterations = sys.argv[1:6]
    workers = [
        threading.Thread(target=contend, args=(db, table, key, f"{os.getpid()}-{i}", int(iterations)))
        for i in range(int(threads))
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


if __name__ == "__main__":
    main()
