"""A real process writing through a fenced adapter, for test_takeover.

Run from the repository root as ``python -m tests.fencing.adapter_worker MODE ADAPTER KEY NAME ...`` with
VOLCANO_* (the lock server) and FENCED_* (the store, see ``helpers``) in the environment.

- ``stall ADAPTER KEY NAME GO``: hold KEY (TTL 5 s), print ``{"held": token}``, then wait for the file GO
  (the test SIGSTOPs the process meanwhile, past the TTL, and a successor writes). Then write once without
  checking the guard: a process frozen between its check and its write. Print ``{"accepted": true}`` or
  ``{"refused": stored_token, "resource": ...}``. ADAPTER ``sql-claim``: the SQL job is a claim on a
  connection with commit-as-you-go: one batch committed before the stall, the next after it.
- ``contend ADAPTER KEY NAME THREADS ITERATIONS``: THREADS threads, each ITERATIONS times: take KEY through
  ``with_lock`` and write once with the guard's lease. Print one ``{"accepted": [tokens]}`` line at the end.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

from volcano_locks import LockContention, VolcanoError, VolcanoLocks
from volcano_locks.fencing import Fence, StaleFencingToken

from .helpers import SqlTarget, s3_prefix_from_env, s3_publish

RESOURCE = "fenced-adapter"


def writer_for(adapter: str, name: str) -> Any:
    """A function ``(lease, writer) -> None`` writing once through ``adapter`` ("sql" or "s3")."""
    if adapter.startswith("sql"):
        target = SqlTarget.from_env(name)
        return lambda lease, writer: target.write(RESOURCE, lease, writer, pause=0.005)
    prefix = s3_prefix_from_env(name)
    return lambda lease, writer: s3_publish(prefix, lease, writer)


def stall(adapter: str, key: str, name: str, go: Path) -> None:
    with VolcanoLocks() as client:
        try:
            with client.with_lock(key, 5) as guard:
                if adapter == "sql-claim":
                    _stall_claimed(SqlTarget.from_env(name), guard, go)
                    return
                write = writer_for(adapter, name)
                print(json.dumps({"held": guard.fencing_token}), flush=True)
                _wait_for(go)
                try:
                    write(guard.lease, f"stalled-{os.getpid()}")
                    print(json.dumps({"accepted": True, "lost": guard.lost}), flush=True)
                except StaleFencingToken as exc:
                    print(json.dumps({"refused": exc.stored_token, "resource": exc.resource}), flush=True)
        except VolcanoError:
            pass  # the guard lost the lease while frozen: with_lock says so on the way out


def _wait_for(go: Path) -> None:
    while not go.exists():
        time.sleep(0.05)


def _stall_claimed(target: SqlTarget, guard: Any, go: Path) -> None:
    """Claim on a connection, commit one batch, stall, then the next batch on the same connection."""
    fence = Fence(guard.lease.key, guard.fencing_token)
    writer = f"stalled-{os.getpid()}"
    first, second = (target._rows(RESOURCE, fence.fencing_token, writer, batch) for batch in (0, 1))
    outcome: dict[str, Any] = {"accepted": True}

    if not target.is_async:
        with target.engine.connect() as conn, target.fenced.claim(conn, RESOURCE, fence):
            for statement in first:
                conn.execute(statement)
            conn.commit()
            print(json.dumps({"held": fence.fencing_token}), flush=True)
            _wait_for(go)
            try:
                for statement in second:
                    conn.execute(statement)
                conn.commit()
            except StaleFencingToken as exc:
                outcome = {"refused": exc.stored_token, "resource": exc.resource}
    else:

        async def claimed() -> None:
            nonlocal outcome
            async with target.async_engine.connect() as conn:
                with await target.fenced.claim(conn, RESOURCE, fence):
                    for statement in first:
                        await conn.execute(statement)
                    await conn.commit()
                    print(json.dumps({"held": fence.fencing_token}), flush=True)
                    await asyncio.to_thread(_wait_for, go)
                    try:
                        for statement in second:
                            await conn.execute(statement)
                        await conn.commit()
                    except StaleFencingToken as exc:
                        outcome = {"refused": exc.stored_token, "resource": exc.resource}

        asyncio.run(claimed())
    print(json.dumps(outcome), flush=True)


def contend(adapter: str, key: str, name: str, threads: int, iterations: int) -> None:
    write = writer_for(adapter, name)
    accepted: list[int] = []

    def run(i: int) -> None:
        rng = random.Random()
        done = 0
        with VolcanoLocks() as client:
            while done < iterations:
                try:
                    with client.with_lock(key, 5) as guard:
                        write(guard.lease, f"{os.getpid()}-{i}")
                        accepted.append(guard.lease.fencing_token)
                    done += 1
                except LockContention:
                    time.sleep(rng.uniform(0.005, 0.03))

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    print(json.dumps({"accepted": accepted}), flush=True)


def main() -> None:
    mode, adapter, key, name, *rest = sys.argv[1:]
    if mode == "stall":
        stall(adapter, key, name, Path(rest[0]))
    else:
        contend(adapter, key, name, int(rest[0]), int(rest[1]))


if __name__ == "__main__":
    main()
