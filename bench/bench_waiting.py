"""Waiting benchmark: what waiting costs the project's quota, and how soon a released lock is granted.

Two families of rows, against a fresh LocalServer (SQLite, loopback, quota off so that what is
measured is what the waiters choose to spend):

* **keys in one process**: 1, 10, 100 and 1,000 async waiters in one process, each on its own held key
  (a mapped task with one lock per map index, a fan-out over regions). The holders are another
  credential of the same project, so their releases are seen only by polling, as a release in another
  process would be.
* **processes on one key**: 1, 10 and 50 waiting processes (``tests/e2e/fleet_waiter.py``) on one key
  that this process holds, as a Prefect process worker or a fleet of Airflow workers waiting in place.

For each row: the waiters' requests a minute once their backoff has settled (measured over the
window after a warm-up, from the server's request log), and the grant latency from a release to the
waiter holding the lock (median and worst over the released keys; for processes, the first grant after
the holder's release).

    python bench/bench_waiting.py             # every row (about ten minutes)
    python bench/bench_waiting.py --quick     # shorter windows, 1,000 keys left out
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

from volcano_locks import AsyncVolcanoLocks, VolcanoLocks, WaitTimeout
from volcano_locks.governor import DEFAULT_WAIT_BUDGET
from volcano_locks.server.harness import LocalServer

REPO = Path(__file__).resolve().parents[1]
WAITER = REPO / "tests" / "e2e" / "fleet_waiter.py"


def _waiting_requests(srv: LocalServer, prefix: str, since: float, until: float) -> int:
    return sum(
        1
        for r in srv.requests()
        if r.get("op") in ("get", "acquire") and prefix in r.get("path", "") and since <= r["time"] <= until
    )


async def keys_row(srv: LocalServer, n: int, warmup: float, window: float) -> dict[str, object]:
    """``n`` waiters in this process on ``n`` held keys; release a few after the warm-up."""
    prefix = f"bw{n}-{uuid.uuid4().hex[:6]}"
    keys = [f"{prefix}-{i}" for i in range(n)]
    other = srv.mint_key(permissions=["locks.manage"])  # another credential: no in-process wake-up
    with VolcanoLocks(srv.url, service_key=other) as holder:
        leases = {k: holder.acquire(k, 3600) for k in keys}
    got: dict[str, float] = {}
    async with AsyncVolcanoLocks(srv.url, service_key=srv.service_key) as client:

        async def wait(k: str) -> None:
            try:
                lease = await client.wait_acquire(k, 30, timeout=warmup + window + 60)
            except WaitTimeout:
                return
            got[k] = time.time()
            await client.release(k, lease)

        tasks = [asyncio.create_task(wait(k)) for k in keys]
        await asyncio.sleep(warmup)
        measured_from = time.time()
        released: dict[str, float] = {}
        chosen = keys[:: max(1, n // 5)][:5]
        with VolcanoLocks(srv.url, service_key=other) as holder:
            for i, k in enumerate(chosen):
                await asyncio.sleep(window / (len(chosen) + 1) if i else 1.0)
                holder.release(k, leases[k])
                released[k] = time.time()
        end = measured_from + window
        await asyncio.sleep(max(0.0, end - time.time()))
        measured_until = time.time()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    with VolcanoLocks(srv.url, service_key=other) as holder:
        for k in keys:
            if k not in released:
                holder.release(k, leases[k])
    latencies = [got[k] - released[k] for k in released if k in got]
    spent = _waiting_requests(srv, prefix, measured_from, measured_until)
    return {
        "row": f"{n} key(s), 1 process",
        "per_minute": spent / ((measured_until - measured_from) / 60),
        "every": (measured_until - measured_from) * n / spent if spent else float("inf"),
        "median": statistics.median(latencies) if latencies else float("nan"),
        "worst": max(latencies) if latencies else float("nan"),
        "granted": f"{len(latencies)}/{len(released)}",
    }


def processes_row(srv: LocalServer, p: int, hold: float) -> dict[str, object]:
    """``p`` waiting processes on one key that this process holds for ``hold`` seconds."""
    key = f"bp{p}-{uuid.uuid4().hex[:6]}"
    env = {**os.environ, **srv.env(), "PYTHONPATH": str(REPO)}
    with VolcanoLocks(srv.url, service_key=srv.service_key) as client:
        guard_ctx = client.with_lock(key, 15)
        guard = guard_ctx.__enter__()
        procs = [
            subprocess.Popen(
                [sys.executable, str(WAITER), "--key", key, "--ttl", "15", "--hold", "0.2"],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(p)
        ]
        time.sleep(hold / 2)  # let the waiters start and back off
        measured_from = time.time()
        time.sleep(hold / 2)
        measured_until = time.time()
        assert not guard.lost
        guard_ctx.__exit__(None, None, None)
        released = time.time()
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=1800)
        if proc.returncode != 0:
            raise RuntimeError(err[-2000:])
        results.append(json.loads(out.strip().splitlines()[-1]))
    results.sort(key=lambda r: r["acquired"])
    handoffs = [b["acquired"] - a["released"] for a, b in itertools.pairwise(results)]
    spent = _waiting_requests(srv, key, measured_from, measured_until)
    return {
        "row": f"1 key, {p} process(es)",
        "per_minute": spent / ((measured_until - measured_from) / 60),
        "every": (measured_until - measured_from) * p / spent if spent else float("inf"),
        "median": results[0]["acquired"] - released if p == 1 else statistics.median(handoffs),
        "worst": results[0]["acquired"] - released if p == 1 else max(handoffs),
        "granted": f"{len(results)}/{p}",
    }


def main() -> None:
    """Run the rows and print the table."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="shorter windows, no 1,000-key row")
    args = parser.parse_args()
    warmup, window, hold = (20.0, 30.0, 40.0) if args.quick else (40.0, 60.0, 100.0)
    key_counts = [1, 10, 100] if args.quick else [1, 10, 100, 1000]
    rows = []
    with LocalServer(admin=True, quota=10_000_000) as srv:
        for n in key_counts:
            rows.append(asyncio.run(keys_row(srv, n, warmup, window)))
            print(f"  measured {rows[-1]['row']}", file=sys.stderr, flush=True)
        for p in (1, 10, 50):
            rows.append(processes_row(srv, p, hold))
            print(f"  measured {rows[-1]['row']}", file=sys.stderr, flush=True)
    print(f"\nWaiting for held locks (waiting budget {DEFAULT_WAIT_BUDGET}/min per process, defaults)\n")
    print(
        "| waiters | waiting requests/min | each waiter looks every (s) | grant latency median (s) "
        "| worst (s) | granted in the window |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['row']} | {r['per_minute']:.0f} | {r['every']:.1f} | {r['median']:.2f} | {r['worst']:.2f} "
            f"| {r['granted']} |"
        )
    print(
        "\nkeys rows: latency from a release by another credential (seen by polling only);"
        " processes rows: from the holder's release to the first grant (1 process), else between"
        " successive waiters' release and grant."
    )


if __name__ == "__main__":
    main()
