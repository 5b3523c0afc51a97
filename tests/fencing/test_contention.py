"""Two processes x three threads contending through with_lock on a FencedTable: one holder at a time."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from volcano_locks.fencing import FencedTable
from volcano_locks.server.harness import LocalServer

from .table_worker import ALONE, RESOURCE, Occupancy

WORKER = Path(__file__).with_name("table_worker.py")
PROCESSES, THREADS, ITERATIONS = 2, 3, 3


def _contend(server: LocalServer, db: str, table: str, key: str) -> None:
    env = {**os.environ, **server.env()}
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), db, table, key, str(THREADS), str(ITERATIONS)], env=env
        )
        for _ in range(PROCESSES)
    ]
    for proc in procs:
        assert proc.wait(timeout=120) == 0


def _check(table: FencedTable, key: str) -> None:
    sections = table.history(RESOURCE)
    assert len(sections) == PROCESSES * THREADS * ITERATIONS
    assert all(w.value == ALONE for w in sections), "two holders were inside at once"
    accepted = [w.fencing_token for w in sections if w.accepted]
    assert len(accepted) == len(sections), "a current holder's write was rejected"
    assert accepted == sorted(accepted) and len(set(accepted)) == len(accepted)  # each a new, higher fence
    assert len({w.writer for w in sections}) == PROCESSES * THREADS
    # The fence holds: a write carrying an older token than the last accepted one is refused.
    assert table.write(RESOURCE, key, accepted[0], "late") is False
    stored = table.read(RESOURCE)
    assert stored is not None and stored.fencing_token == accepted[-1]


def _run(server: LocalServer, db: str, name: str, key: str) -> None:
    table = FencedTable(db, table=name)
    assert table.history() == []  # creates the fenced tables before the workers race to
    occupancy = Occupancy(db, name)
    try:
        occupancy.create()
        _contend(server, db, name, key)
        _check(table, key)
    finally:
        occupancy.close()


def test_fenced_sqlite(volcano_server: LocalServer, unique_key: str, tmp_path: Path) -> None:
    _run(volcano_server, str(tmp_path / "fenced.sqlite3"), "fence", unique_key)


@pytest.mark.postgres
def test_fenced_postgres(volcano_server: LocalServer, unique_key: str, pg_dsn: str) -> None:
    name = f"core_fence_{uuid.uuid4().hex[:10]}"
    try:
        _run(volcano_server, pg_dsn, name, unique_key)
    finally:
        import psycopg

        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            for table in (name, f"{name}_history", f"{name}_inside"):
                conn.execute(f"DROP TABLE IF EXISTS {table}")
