"""Prefect under fault injection: ``locked_task`` runs never report success after their lock was lost.

Run in its own process (a Prefect test harness takes a while to boot; isolating it keeps the pytest
session's Prefect state untouched)::

    .venv-prefect/bin/python -m tests.chaos.prefect_scenario --out result.json

What it does: starts a local lock server with fault injection (503s, dropped connections, renewals delayed
past the TTL), runs one flow that submits sync and async ``locked_task`` runs, one key each, whose bodies
outlive several renewals and write through the fencing check, while a thief force-releases two of the
keys mid-run and writes with its own newer lease. It records each task's final state, the server's request
log and the fenced tables, and writes them as JSON for ``test_prefect.py`` to judge.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from volcano_locks.server.harness import LocalServer

from .fenced_store import open_store

__all__ = ["FAULTS", "MAX_DELAY", "TTL", "main"]

TTL = 5
FAULTS = "status=503:rate=0.1,drop:rate=0.05,delay=5-7:op=renew:rate=0.12"
MAX_DELAY = 7.0
BODY_SECONDS = 7.0


def _thief(
    server: LocalServer, keys: list[str], store_path: str, tables: dict[str, str], out: list[Any]
) -> None:
    """Force-release each key once it has been held ~2 s, then take it and write with the newer lease."""
    from volcano_locks import VolcanoError, VolcanoLocks

    with VolcanoLocks(server.url, service_key=server.service_key, timeout=5.0) as client:
        for key in keys:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                try:
                    if client.get(key).held:
                        break
                except VolcanoError:
                    pass
                time.sleep(0.1)
            time.sleep(2.0)
            for _ in range(10):  # the faults apply to the thief too
                try:
                    client.force_release(key)
                    break
                except VolcanoError:
                    time.sleep(0.2)
            token = str(uuid.uuid4())
            try:
                lease = client.acquire(key, TTL, token=token)
            except VolcanoError as exc:
                out.append({"key": key, "stole": False, "error": type(exc).__name__})
                continue
            store = open_store(store_path, tables[key], lock_key=key)
            accepted = store.write(lease.fencing_token, "thief", writer="thief", cs=0)
            store.close()
            # Only the hash prefix the server logs, so the test can tell the thief's lease from the task's.
            digest = hashlib.sha256(token.encode()).hexdigest()[:12]
            out.append(
                {
                    "key": key,
                    "stole": True,
                    "fencing_token": lease.fencing_token,
                    "accepted": accepted,
                    "token_sha256": digest,
                }
            )
            with contextlib.suppress(VolcanoError):
                client.release(key, lease)


def main(argv: list[str] | None = None) -> int:
    """Run the scenario and write the JSON result."""
    p = argparse.ArgumentParser(
        prog="python -m tests.chaos.prefect_scenario", description=__doc__.splitlines()[0]
    )
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--jobs", type=int, default=8)
    args = p.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="volcano-chaos-prefect-"))
    os.environ["PREFECT_HOME"] = str(work / "prefect-home")
    os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    from prefect import flow, task
    from prefect.testing.utilities import prefect_test_harness

    from prefect_volcano import current_lease, locked_task

    run = uuid.uuid4().hex[:10]
    keys = [f"chaos-prefect-{run}-{i}" for i in range(args.jobs)]
    tables = {k: f"chaos_pf_{run}_{i}" for i, k in enumerate(keys)}
    store_path = str(work / "fenced.sqlite3")
    for table in tables.values():
        open_store(store_path, table).current()  # create the tables up front
    bodies: list[dict[str, Any]] = []
    bodies_lock = threading.Lock()

    def body_record(key: str, kind: str) -> dict[str, Any]:
        lease = current_lease()
        rec = {
            "key": key,
            "kind": kind,
            "fencing_token": lease.fencing_token,
            "writes": 0,
            "rejected": 0,
            "finished": False,
        }
        with bodies_lock:
            bodies.append(rec)
        return rec

    @contextlib.contextmanager
    def job_body(key: str, kind: str) -> Iterator[tuple[dict[str, Any], Callable[[], None]]]:
        """One job's body record and its fenced write (counted in the record); the store closed after."""
        rec = body_record(key, kind)
        store = open_store(store_path, tables[key], lock_key=key)

        def write() -> None:
            if store.write(rec["fencing_token"], kind, writer=key, cs=0):
                rec["writes"] += 1
            else:
                rec["rejected"] += 1

        try:
            yield rec, write
        finally:
            store.close()
        rec["finished"] = True

    @locked_task("{key}", ttl=TTL, on_contention="wait", wait_timeout=60)
    @task
    def sync_job(key: str) -> int:
        with job_body(key, "sync") as (rec, write):
            end = time.monotonic() + BODY_SECONDS
            while time.monotonic() < end:
                time.sleep(0.25)
                write()
        return int(rec["fencing_token"])

    @locked_task("{key}", ttl=TTL, on_contention="wait", wait_timeout=60)
    @task
    async def async_job(key: str) -> int:
        with job_body(key, "async") as (rec, write):
            end = time.monotonic() + BODY_SECONDS
            while time.monotonic() < end:
                await asyncio.sleep(0.25)
                write()
        return int(rec["fencing_token"])

    @flow(name="volcano-chaos-prefect")
    def chaos_flow() -> list[dict[str, Any]]:
        futures = []
        for i, key in enumerate(keys):
            job = sync_job if i % 2 == 0 else async_job
            futures.append((key, "sync" if i % 2 == 0 else "async", job.submit(key)))
        results = []
        for key, kind, fut in futures:
            fut.wait()
            state = fut.state
            results.append(
                {
                    "key": key,
                    "kind": kind,
                    "type": state.type.value,
                    "name": state.name,
                    "message": (state.message or "")[:300],
                }
            )
        return results

    started = time.monotonic()
    with LocalServer(admin=True, quota=1_000_000, faults=FAULTS, log_requests=False) as server:
        os.environ.update(server.env())
        thefts: list[Any] = []
        with prefect_test_harness(server_startup_timeout=180):
            booted = time.monotonic()
            thieves = [
                threading.Thread(target=_thief, args=(server, [key], store_path, tables, thefts), daemon=True)
                for key in keys[:2]
            ]
            for thief in thieves:
                thief.start()
            flow_state = chaos_flow(return_state=True)
            tasks = flow_state.result(raise_on_failure=False)
            for thief in thieves:
                thief.join(60)
        requests = server.requests()
    writes = {}
    for key, table in tables.items():
        store = open_store(store_path, table)
        writes[key] = [r.as_dict() for r in store.writes()]
        store.close()
    result = {
        "ttl": TTL,
        "faults": FAULTS,
        "max_delay": MAX_DELAY,
        "keys": keys,
        "forced": keys[:2],
        "flow": {"type": flow_state.type.value, "name": flow_state.name},
        "tasks": tasks if isinstance(tasks, list) else [],
        "bodies": bodies,
        "thefts": thefts,
        "requests": requests,
        "writes": writes,
        "boot_seconds": round(booted - started, 1),
        "run_seconds": round(time.monotonic() - booted, 1),
    }
    args.out.write_text(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
