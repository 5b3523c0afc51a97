"""A contender for test_fenced: threads that take a lock through with_lock and write to a fenced table.

Run as a script: ``python fenced_worker.py DSN KEY THREADS ITERATIONS`` with VOLCANO_* in the environment.
DSN is a SQLite file path or a ``postgresql://...?table=PREFIX`` DSN.
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


class Store:
    """The fenced table and the section log, in SQLite or PostgreSQL (autocommit, one statement each)."""

    def __init__(self, dsn: str, prefix: str) -> None:
        self.prefix = prefix
        self.pg = dsn.startswith("postgresql://")
        if self.pg:
            import psycopg

            self.conn: Any = psycopg.connect(dsn, autocommit=True)
        else:
            self.conn = sqlite3.connect(dsn, timeout=30, isolation_level=None, check_same_thread=False)

    def close(self) -> None:
        self.conn.close()

    def run(self, sql: str, params: tuple[object, ...] = ()) -> int:
        sql = sql.replace("{p}", self.prefix)
        if self.pg:
            sql = sql.replace("?", "%s")
        cur = self.conn.execute(sql, params)
        return int(cur.rowcount)

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        return list(self.conn.execute(sql.replace("{p}", self.prefix)).fetchall())

    def create(self) -> None:
        serial = "BIGSERIAL" if self.pg else "INTEGER"
        self.run(
            "CREATE TABLE {p}_state (id INTEGER PRIMARY KEY, fencing_token BIGINT NOT NULL, holder TEXT)"
        )
        self.run(
            f"CREATE TABLE {{p}}_sections (seq {serial} PRIMARY KEY, fencing_token BIGINT, worker TEXT,"
            " accepted INTEGER, overlap INTEGER)"
        )
        self.run("INSERT INTO {p}_state (id, fencing_token, holder) VALUES (1, 0, NULL)")

    def section(self, worker: str, fence: int, hold: float) -> None:
        entered = self.run("UPDATE {p}_state SET holder = ? WHERE id = 1 AND holder IS NULL", (worker,))
        time.sleep(hold)
        accepted = self.run(
            "UPDATE {p}_state SET fencing_token = ? WHERE id = 1 AND fencing_token <= ?", (fence, fence)
        )
        self.run(
            "INSERT INTO {p}_sections (fencing_token, worker, accepted, overlap) VALUES (?, ?, ?, ?)",
            (fence, worker, accepted, 1 - entered),
        )
        self.run("UPDATE {p}_state SET holder = NULL WHERE id = 1 AND holder = ?", (worker,))


def contend(dsn: str, prefix: str, key: str, name: str, iterations: int) -> None:
    store = Store(dsn, prefix)
    rng = random.Random()
    with VolcanoLocks() as client:
        try:
            _contend(store, client, key, name, iterations, rng)
        finally:
            store.close()


def _contend(
    store: Store, client: VolcanoLocks, key: str, name: str, iterations: int, rng: random.Random
) -> None:
    done = 0
    while done < iterations:
        try:
            with client.with_lock(key, 5) as guard:
                assert guard.fencing_token is not None
                store.section(name, guard.fencing_token, rng.uniform(0.005, 0.03))
            done += 1
        except LockContention:
            time.sleep(rng.uniform(0.005, 0.03))


def main() -> None:
    dsn, prefix, key, threads, iterations = sys.argv[1:6]
    workers = [
        threading.Thread(target=contend, args=(dsn, prefix, key, f"{os.getpid()}-{i}", int(iterations)))
        for i in range(int(threads))
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


if __name__ == "__main__":
    main()
