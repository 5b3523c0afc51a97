"""The long pause: a holder frozen inside its fenced transaction, past its lease, holds the guard row.

The chaos run's SIGSTOPs land between a worker's writes; this is the other place a pause can land, inside
a fenced transaction, where it holds the guard row's lock (PostgreSQL) or the database's write lock
(SQLite) and the next holder's write queues behind it. For each SQL adapter of the chaos run (FencedSQL and
AsyncFencedSQL, ``adapter_stores``) on each backend: a real holder process (``paused_holder``) is frozen
with SIGSTOP right after its transaction's first statement; the next holder waits out the lease for real
and writes through the same adapter. What bounds its wait is the documented one:

- PostgreSQL: FencedSQL's ``stall_timeout`` (``idle_in_transaction_session_timeout``): the server ends
  the frozen session, and the next holder's write lands while the frozen holder is still frozen. Resumed,
  the frozen holder's write fails; nothing of it commits.
- SQLite: the busy timeout: the next holder gets ``FenceBusy`` (nothing written) while the frozen holder is
  still frozen. Resumed, the frozen holder commits (no newer write had landed); the next holder's retry
  lands after it.

Either way no stale write lands after a newer one (the chaos checker's ``stale_accepted`` is 0), and the
wait is reported.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.adapter_stores import AsyncSqlStore, SqlStore
from tests.chaos.checker import check
from tests.support import frozen
from volcano_locks import VolcanoLocks
from volcano_locks.fencing import FenceBusy
from volcano_locks.server.harness import LocalServer

REPO = Path(__file__).resolve().parents[2]
STALL = 20.0  # PostgreSQL: longer than the lease's lapse (TTL 5 s + 1 s grace), so the next holder waits
BUSY = 4.0  # SQLite's busy timeout for the next holder
SLACK = 10.0  # scheduling on a loaded two-core machine; only catches a wait the bound did not end

pytestmark = pytest.mark.slow


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "protected.db")
    return str(request.getfixturevalue("chaos_pg_dsn"))


@pytest.mark.parametrize("adapter", ["sql", "sql-async"])
def test_the_next_holders_wait_behind_a_holder_frozen_in_its_transaction_is_bounded(
    adapter: str,
    store_url: str,
    chaos_table: str,
    volcano_server: LocalServer,
    unique_key: str,
    tmp_path: Path,
) -> None:
    go = tmp_path / "go"
    env = {**os.environ, **volcano_server.env(), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.chaos.paused_holder",
            adapter,
            store_url,
            chaos_table,
            unique_key,
            str(STALL),
            str(go),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    kind = AsyncSqlStore if adapter == "sql-async" else SqlStore
    store: Any = kind(store_url, chaos_table, unique_key, stall_timeout=STALL, sqlite_timeout=BUSY)
    postgres = not store_url.endswith(".db")
    try:
        assert proc.stdout is not None
        paused_token = json.loads(proc.stdout.readline())["inside"]
        proc.send_signal(signal.SIGSTOP)  # inside its transaction, holding the guard
        frozen_at = time.monotonic()
        with VolcanoLocks(volcano_server.url, service_key=volcano_server.service_key) as client:
            lease = client.wait_acquire(unique_key, 30, timeout=60)  # the frozen one's lease lapses for real
            try:
                assert lease.fencing_token > paused_token
                start = time.monotonic()
                if postgres:
                    assert store.write(lease.fencing_token, "next", writer="next", cs=1)
                else:
                    with pytest.raises(FenceBusy):
                        store.write(lease.fencing_token, "next", writer="next", cs=1)
                waited = time.monotonic() - start
                assert proc.poll() is None  # still frozen: the bound ended the wait, not the holder
                bound = STALL if postgres else BUSY
                print(
                    f"{adapter} on {'PostgreSQL' if postgres else 'SQLite'}: the next holder waited "
                    f"{waited:.1f} s (frozen {time.monotonic() - frozen_at:.1f} s; bound {bound:g} s)"
                )
                assert waited <= bound + SLACK
                out = frozen.resume(proc, go)
                assert proc.wait(60) == 0
                if postgres:
                    assert "error" in out  # its session was ended: nothing of it committed
                else:
                    assert out == {"accepted": True}  # it committed before any newer write
                    assert store.write(lease.fencing_token, "next", writer="next", cs=1)
            finally:
                client.release(unique_key, lease)
        rows = store.writes()
        assert [(r.writer, r.accepted) for r in rows] == ([] if postgres else [("paused", True)]) + [
            ("next", True)
        ]
        assert check([], [r.as_dict() for r in rows]).stale_accepted == 0
    finally:
        frozen.end(proc)
        store.drop()
        store.close()
