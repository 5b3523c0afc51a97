"""Core client benchmark: latency of acquire+release and with_lock enter+exit, and what a hold costs.

Runs against a fresh LocalServer (SQLite, loopback) and prints one markdown table comparing the sync and
async clients side by side, with a plain ``get`` (one request) as the floor of any call. Then holds a
lock with ``with_lock`` at TTL 15 (sync and async at once) and counts ``requests_sent``: the physical
minimum is 2 (acquire, release) plus one renewal per third of the TTL.

    python bench/bench_core.py            # 300 iterations, 60 s hold
    python bench/bench_core.py --quick    # 50 iterations, 15 s hold (same formula, shorter)
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

from volcano_locks import AsyncVolcanoLocks, VolcanoLocks
from volcano_locks.server.harness import LocalServer

HOLD_TTL = 15


def _key(prefix: str) -> str:
    return f"bench-{prefix}-{uuid.uuid4().hex[:8]}"


def _stats(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return statistics.median(ordered) * 1000, p99 * 1000


def _time_sync(n: int, ops: dict[str, Callable[[], object]]) -> dict[str, list[float]]:
    """Time each op ``n`` times, interleaved so machine noise falls on all of them alike."""
    out: dict[str, list[float]] = {name: [] for name in ops}
    for op in ops.values():
        op()  # warm the connection pool
    for _ in range(n):
        for name, op in ops.items():
            start = time.perf_counter()
            op()
            out[name].append(time.perf_counter() - start)
    return out


async def _time_async(n: int, ops: dict[str, Callable[[], Awaitable[object]]]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {name: [] for name in ops}
    for op in ops.values():
        await op()
    for _ in range(n):
        for name, op in ops.items():
            start = time.perf_counter()
            await op()
            out[name].append(time.perf_counter() - start)
    return out


def bench_sync(url: str, service_key: str, n: int) -> dict[str, list[float]]:
    with VolcanoLocks(url, service_key=service_key) as client:
        key, key2 = _key("sync"), _key("sync-wl")

        def acquire_release() -> None:
            client.release(key, client.acquire(key, 15))

        def with_lock() -> None:
            with client.with_lock(key2, 15):
                pass

        return _time_sync(
            n,
            {
                "get (1 request)": lambda: client.get(key),
                "acquire + release": acquire_release,
                "with_lock enter + exit": with_lock,
            },
        )


async def bench_async(url: str, service_key: str, n: int) -> dict[str, list[float]]:
    async with AsyncVolcanoLocks(url, service_key=service_key) as client:
        key, key2 = _key("async"), _key("async-wl")

        async def acquire_release() -> None:
            await client.release(key, await client.acquire(key, 15))

        async def with_lock() -> None:
            async with client.with_lock(key2, 15):
                pass

        return await _time_async(
            n,
            {
                "get (1 request)": lambda: client.get(key),
                "acquire + release": acquire_release,
                "with_lock enter + exit": with_lock,
            },
        )


def hold_sync(url: str, service_key: str, seconds: float, result: dict[str, int]) -> None:
    with VolcanoLocks(url, service_key=service_key) as client:
        with client.with_lock(_key("hold-sync"), HOLD_TTL) as guard:
            time.sleep(seconds)
            assert not guard.lost
        result["sync"] = client.requests_sent


async def hold_async(url: str, service_key: str, seconds: float) -> int:
    async with AsyncVolcanoLocks(url, service_key=service_key) as client:
        async with client.with_lock(_key("hold-async"), HOLD_TTL) as guard:
            await asyncio.sleep(seconds)
            assert not guard.lost
        return client.requests_sent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="50 iterations and a 15 s hold")
    parser.add_argument("--iterations", type=int, default=None)
    parser.add_argument("--hold", type=float, default=None, help="hold seconds (default 60, quick 15)")
    args = parser.parse_args(argv)
    n = args.iterations or (50 if args.quick else 300)
    hold = args.hold or (15.0 if args.quick else 60.0)

    with (
        tempfile.TemporaryDirectory() as tmp,
        LocalServer(db=str(Path(tmp) / "bench.sqlite3"), quota=1_000_000) as srv,
    ):
        sync = bench_sync(srv.url, srv.service_key, n)
        asyn = asyncio.run(bench_async(srv.url, srv.service_key, n))
        print(f"\n### volcano-locks core client, local server over loopback ({n} iterations each)\n")
        print("| operation | sync median ms | sync p99 ms | async median ms | async p99 ms |")
        print("| --- | ---: | ---: | ---: | ---: |")
        for name in sync:
            sm, sp = _stats(sync[name])
            am, ap = _stats(asyn[name])
            print(f"| {name} | {sm:.2f} | {sp:.2f} | {am:.2f} | {ap:.2f} |")

        counts: dict[str, int] = {}
        worker = threading.Thread(target=hold_sync, args=(srv.url, srv.service_key, hold, counts))
        worker.start()
        counts["async"] = asyncio.run(hold_async(srv.url, srv.service_key, hold))
        worker.join()
        per_third = HOLD_TTL / 3
        minimum = 2 + hold / per_third
        print(f"\n### requests spent holding one lock for {hold:g} s at TTL {HOLD_TTL} (with_lock)\n")
        print("| client | requests sent | 2 + hold / (ttl/3) | per minute |")
        print("| --- | ---: | ---: | ---: |")
        for name in ("sync", "async"):
            print(f"| {name} | {counts[name]} | {minimum:g} | {counts[name] * 60 / hold:.1f} |")
        print(
            f"\nRenewals go out every ttl/3 = {per_third:g} s (+-10 % jitter) after each send,"
            f" so a {hold:g} s hold needs about {int(-(-hold // per_third)) - 1} renewals strictly inside it;"
            " 2 + hold / (ttl/3) counts one more at the very end. At 60 s that is 13-14 requests."
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
