"""Per adapter: a holder SIGSTOPped past its TTL, a successor takes over and writes, the stalled one resumes.

The stalled holder is a real process holding a real lease on the session's server; the successor is this
test, which waits for the lease to lapse for real (TTL 5 s plus the server's 1 s grace). The resumed
holder's write goes out without a guard check (a process frozen between its check and its write): the
store must refuse it with StaleFencingToken, keep the successor's data intact and hold nothing partial.
Then processes x threads contend through ``with_lock`` and the adapter: no accepted write is lost.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.fencing.s3_server import MotoServer
from volcano_locks import VolcanoLocks
from volcano_locks.server.harness import LocalServer

from .adapter_worker import RESOURCE
from .helpers import PARTS, SqlTarget, s3_keys, s3_publish, sql_engine

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
        """(fencing_token, writer) of every whole job the store holds, PARTS pieces each, in order."""
        if self.sql is not None:
            rows = self.sql.orders_of(RESOURCE)
            jobs = [(t, w) for t, w, p in rows if p == 0]
            assert sorted(rows) == sorted((t, w, p) for t, w in jobs for p in range(PARTS)), "a partial job"
            return jobs
        return []

    def current_writer(self) -> tuple[int, str]:
        if self.sql is not None:
            total = self.sql.total_of(RESOURCE)
            assert total is not None
            fence = self.sql.fenced.read(RESOURCE)
            assert fence is not None
            return fence.fencing_token, total[1]
        from volcano_locks.fencing import FencedS3Prefix

        prefix = FencedS3Prefix(self.s3, self.bucket, self.name)
        m = prefix.current()
        assert m is not None
        assert [prefix.read(f"part-{i}.txt") for i in range(PARTS)] == [
            f"{m.writer}:{i}".encode() for i in range(PARTS)
        ]
        return m.fencing_token, m.writer


@pytest.fixture(params=["sql-sqlite", pytest.param("sql-postgres", marks=pytest.mark.postgres), "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    name = f"ftake_{uuid.uuid4().hex[:10]}"
    if request.param == "s3":
        server: MotoServer = request.getfixturevalue("s3_server")
        bucket = server.bucket(versioned=True)
        yield Store(
            "s3", name, {**server.env(), "FENCED_S3_BUCKET": bucket}, s3=server.client(), bucket=bucket
        )
        return
    if request.param == "sql-sqlite":
        url = f"sqlite:///{tmp_path / 'warehouse.sqlite3'}"
    else:
        url = request.getfixturevalue("pg_sqlalchemy_url")
    engine = sql_engine(url)
    target = SqlTarget(engine, name)
    target.create()
    try:
        yield Store("sql", name, {"FENCED_SQL_URL": url}, sql=target)
    finally:
        target.drop()
        engine.dispose()


def _worker(server: LocalServer, store: Store, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, **server.env(), **store.env, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.fencing.adapter_worker", args[0], store.adapter, *args[1:]],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_a_stalled_holder_resumed_after_a_takeover_is_refused(
    store: Store, volcano_server: LocalServer, unique_key: str, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    proc = _worker(volcano_server, store, "stall", unique_key, store.name, str(go))
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
        go.touch()
        proc.send_signal(signal.SIGCONT)
        out = json.loads(proc.stdout.readline())
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    assert out == {"refused": lease.fencing_token, "resource": RESOURCE if store.sql else store.name}
    assert store.current_writer() == (lease.fencing_token, "successor")  # the successor's data intact
    if store.sql is not None:
        assert store.written() == [(lease.fencing_token, "successor")]  # nothing of the stalled job
    else:
        versions = {k.split("/")[2] for k in s3_keys(store.s3, store.bucket, store.name) if "/versions/" in k}
        assert len(versions) == 1 and versions.pop().startswith(f"{lease.fencing_token:020d}-")


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
