"""Two processes x three threads contending through with_lock on a fenced table: one holder at a time."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from volcano_locks.server.harness import LocalServer

from .fenced_worker import Store

WORKER = Path(__file__).with_name("fenced_worker.py")
PROCESSES, THREADS, ITERATIONS = 2, 3, 3


def _contend(server: LocalServer, dsn: str, prefix: str, key: str) -> None:
    env = {**os.environ, **server.env()}
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), dsn, prefix, key, str(THREADS), str(ITERATIONS)], env=env
        )
        for _ in range(PROCESSES)
    ]
    for proc in procs:
        assert proc.wait(timeout=120) == 0


def _check(store: Store) -> None:
    sections = store.rows("SELECT fencing_token, worker, accepted, overlap FROM {p}_sections ORDER BY seq")
    assert len(sections) == PROCESSES * THREADS * ITERATIONS
    assert sum(row[3] for row in sections) == 0, "two holders were inside at once"
    accepted = [row[0] for row in sections if row[2] == 1]
    assert len(accepted) == len(sections), "a current holder's write was rejected"
    assert accepted == sorted(accepted) and len(set(accepted)) == len(
        accepted
    )  # each section a new, higher fence
    assert len({row[1] for row in sections}) == PROCESSES * THREADS
    # The fence holds: a write carrying an older token than the last accepted one is refused.
    stale = store.run(
        "UPDATE {p}_state SET fencing_token = ? WHERE id = 1 AND fencing_token <= ?",
        (accepted[0], accepted[0]),
    )
    assert stale == 0


def test_fenced_sqlite(volcano_server: LocalServer, unique_key: str, tmp_path: Path) -> None:
    dsn = str(tmp_path / "fenced.sqlite3")
    store = Store(dsn, "fence")
    store.create()
    try:
        _contend(volcano_server, dsn, "fence", unique_key)
        _check(store)
    finally:
        store.close()


@pytest.mark.postgres
def test_fenced_postgres(volcano_server: LocalServer, unique_key: str, pg_dsn: str) -> None:
    prefix = f"core_fence_{uuid.uuid4().hex[:10]}"
    store = Store(pg_dsn, prefix)
    store.create()
    try:
        _contend(volcano_server, pg_dsn, prefix, unique_key)
        _check(store)
    finally:
        store.run("DROP TABLE IF EXISTS {p}_state")
        store.run("DROP TABLE IF EXISTS {p}_sections")
        store.close()
