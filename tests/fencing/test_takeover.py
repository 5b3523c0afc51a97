"""Per adapter: a holder SIGSTOPped past its TTL, a successor takes over and writes, the stalled one resumes.

The stalled holder is a real process holding a real lease on the session's server; the successor is this
test, which waits for the lease to lapse for real (TTL 5 s plus the server's 1 s grace). The resumed
holder's write goes out without a guard check (a process frozen between its check and its write): the
store must refuse it with StaleFencingToken, keep the successor's data intact and hold nothing partial.
The SQL cases: a one-transaction ``begin`` job (sqlite3, psycopg), and on every driver a ``claim`` with
commit-as-you-go whose first batch committed before the stall and whose next batch comes after it.
Then processes x threads contend through ``with_lock`` and the adapter: no accepted write is lost.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.fencing.s3_server import MotoServer
from tests.support import frozen
from volcano_locks import VolcanoLocks
from volcano_locks.server.harness import LocalServer

from .adapter_worker import RESOURCE
from .helpers import PARTS, PG_DRIVERS, SqlTarget, s3_keys, s3_publish

REPO = Path(__file__).resolve().parents[2]
PROCESSES, THREADS, ITERATIONS = 2, 3, 3


@dataclass
class Store:
    """One adapter under test: how a worker reaches it (env), and how this test writes and reads it."""

    adapter: str
    name: str
    env: dict[str, str]
    sql: SqlTarget | None = None
    s3: Any = None
    bucket: str = ""

    def write(self, lease: object, writer: str) -> None:
        if self.sql is not None:
            self.sql.write(RESOURCE, lease, writer)
        else:
            from volcano_locks.fencing import FencedS3Prefix

            s3_publish(FencedS3Prefix(self.s3, self.bucket, self.name), lease, writer)

    def written(self) -> list[tuple[int, str]]:
        """(fencing_token, writer) of every whole batch the store holds, PARTS pieces each, in order."""
        if self.sql is not None:
            rows = self.sql.orders_of(RESOURCE)
            jobs = [(t, w, p // PARTS) for t, w, p in rows if p % PARTS == 0]
            whole = [(t, w, b * PARTS + i) for t, w, b in jobs for i in range(PARTS)]
            assert sorted(rows) == sorted(whole), "a partial job"
            return [(t, w) for t, w, _ in jobs]
        return []

    def current_writer(self) -> tuple[int, str]:
        if self.sql is not None:
            total = self.sql.total_of(RESOURCE)
            assert total is not None
            fence = self.sql.guard.read(RESOURCE)
            assert fence is not None
            return fence.fencing_token, total[1]
        from volcano_locks.fencing import FencedS3Prefix

        snapshot = FencedS3Prefix(self.s3, self.bucket, self.name).snapshot()
        assert snapshot is not None
        m = snapshot.manifest
        assert [snapshot.read(f"part-{i}.txt") for i in range(PARTS)] == [
            f"{m.writer}:{i}".encode() for i in range(PARTS)
        ]
        return m.fencing_token, m.writer


@pytest.fixture
def store(request: pytest.FixtureRequest, make_target: Callable[..., SqlTarget]) -> Store:
    """The adapter named by the test's ``store`` parameter: an SQL driver (``conftest.ALL_DRIVERS``) or s3."""
    name = f"ftake_{uuid.uuid4().hex[:10]}"
    if request.param == "s3":
        server: MotoServer = request.getfixturevalue("s3_server")
        bucket = server.bucket(versioned=True)
        return Store(
            "s3", name, {**server.env(), "FENCED_S3_BUCKET": bucket}, s3=server.client(), bucket=bucket
        )
    target = make_target(request.param)
    return Store("sql", target.name, target.env(), sql=target)


def _pg(driver: str) -> Any:
    return pytest.param(driver, marks=pytest.mark.postgres)


def _worker(server: LocalServer, store: Store, *args: str, job: str = "") -> subprocess.Popen[str]:
    env = {**os.environ, **server.env(), **store.env, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.fencing.adapter_worker", args[0], job or store.adapter, *args[1:]],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )


STALLS = [
    ("sqlite", "sql"),
    pytest.param("psycopg", "sql", marks=pytest.mark.postgres),
    *(("sqlite", "sql-claim"), ("aiosqlite", "sql-claim")),
    *(pytest.param(d, "sql-claim", marks=pytest.mark.postgres) for d in PG_DRIVERS),
    ("s3", "s3"),
]
"""(store, job): the one-transaction job on two drivers, the commit-as-you-go claim on every driver, S3."""


@pytest.mark.parametrize(("store", "job"), STALLS, indirect=["store"])
def test_a_stalled_holder_resumed_after_a_takeover_is_refused(
    store: Store, job: str, volcano_server: LocalServer, unique_key: str, tmp_path: Path
) -> None:
    """A real process frozen by SIGSTOP past its TTL; with ``sql-claim`` it committed one batch before."""
    go = tmp_path / "go"
    proc = _worker(volcano_server, store, "stall", unique_key, store.name, str(go), job=job)
    try:
        assert proc.stdout is not None
        stalled = json.loads(proc.stdout.readline())["held"]
        proc.send_signal(signal.SIGSTOP)  # frozen while holding: no renewal, no write
        with VolcanoLocks(volcano_server.url, service_key=volcano_server.service_key) as successor:
            lease = successor.wait_acquire(unique_key, 30, timeout=30)  # the lapse, for real
            try:
                assert lease.fencing_token > stalled
                store.write(lease, "successor")
            finally:
                successor.release(unique_key, lease)
        out = frozen.resume(proc, go)
        assert proc.wait(60) == 0
    finally:
        frozen.end(proc)
    assert out == {"refused": lease.fencing_token, "resource": RESOURCE if store.sql else store.name}
    assert store.current_writer() == (lease.fencing_token, "successor")  # the successor's data intact
    if store.sql is not None:
        before = [(stalled, w) for _, w in store.written()[:-1]]  # what it committed before the stall
        assert store.written() == [*before, (lease.fencing_token, "successor")]  # nothing of it after
        assert len(before) == (1 if job == "sql-claim" else 0)
        assert all(w.startswith("stalled-") for _, w in before)
    else:
        versions = {k.split("/")[2] for k in s3_keys(store.s3, store.bucket, store.name) if "/versions/" in k}
        assert len(versions) == 1 and versions.pop().startswith(f"{lease.fencing_token:020d}-")


@pytest.mark.parametrize("store", ["sqlite", _pg("psycopg"), _pg("asyncpg"), "s3"], indirect=True)
def test_processes_and_threads_contending_lose_no_accepted_write(
    store: Store, volcano_server: LocalServer, unique_key: str
) -> None:
    procs = [
        _worker(volcano_server, store, "contend", unique_key, store.name, str(THREADS), str(ITERATIONS))
        for _ in range(PROCESSES)
    ]
    accepted: list[int] = []
    for proc in procs:
        out, _ = proc.communicate(timeout=180)
        assert proc.returncode == 0
        accepted.extend(json.loads(out.strip().splitlines()[-1])["accepted"])
    assert len(accepted) == PROCESSES * THREADS * ITERATIONS
    assert len(set(accepted)) == len(accepted)  # each section a new lease, each write accepted
    if store.sql is not None:
        jobs = store.written()
        assert sorted(t for t, _ in jobs) == sorted(accepted) == [t for t, _ in jobs]  # in token order
        total = store.sql.total_of(RESOURCE)
        assert total is not None and total[0] == len(accepted)  # the read-modify-write lost nothing
    else:
        manifests = store.s3.list_object_versions(Bucket=store.bucket, Prefix=f"{store.name}/_manifest.json")
        bodies = [
            json.loads(
                store.s3.get_object(Bucket=store.bucket, Key=v["Key"], VersionId=v["VersionId"])[
                    "Body"
                ].read()
            )
            for v in manifests["Versions"]
        ]
        by_generation = sorted((b["generation"], b["fencing_token"]) for b in bodies)
        assert [g for g, _ in by_generation] == list(range(1, len(accepted) + 1))
        assert [t for _, t in by_generation] == sorted(accepted)
    assert store.current_writer()[0] == max(accepted)
