"""One waiting process of the fleet tests and benchmarks: wait for a lock, hold it briefly, release.

Reads VOLCANO_API_URL / VOLCANO_SERVICE_KEY from the environment; prints one JSON line per key with when
it started waiting, when it got the lock, its fencing token, when it released and what it spent. With
several ``--key``s the process waits for all of them at once in one event loop (a mapped task with one
lock per map index), sharing one client, one governor and one waiting budget; a key still held at
``--timeout`` is reported with ``"acquired": null``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from volcano_locks import AsyncVolcanoLocks, LockLease, VolcanoLocks, WaitTimeout


def _report(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def _report_held(
    key: str, started: float, acquired: float, released: float, lease: LockLease, **more: object
) -> None:
    _report(
        key=key,
        started=started,
        acquired=acquired,
        released=released,
        fencing_token=lease.fencing_token,
        **more,
    )


def _one(key: str, ttl: int, hold: float, timeout: float) -> None:
    with VolcanoLocks() as client:
        started = time.time()
        lease = client.wait_acquire(key, ttl, timeout=timeout)
        acquired = time.time()
        time.sleep(hold)
        released = time.time()
        client.release(key, lease)
        _report_held(key, started, acquired, released, lease, requests=client.requests_sent)


async def _many(keys: list[str], ttl: int, hold: float, timeout: float) -> None:
    async with AsyncVolcanoLocks() as client:

        async def wait(key: str) -> None:
            started = time.time()
            try:
                lease = await client.wait_acquire(key, ttl, timeout=timeout)
            except WaitTimeout:
                _report(key=key, started=started, acquired=None)
                return
            acquired = time.time()
            await asyncio.sleep(hold)
            released = time.time()
            await client.release(key, lease)
            _report_held(key, started, acquired, released, lease)

        await asyncio.gather(*(wait(k) for k in keys))


def main() -> None:
    """Wait for each ``--key``, hold it ``--hold`` seconds, release, and report."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--key", action="append", required=True)
    parser.add_argument("--ttl", type=int, default=15)
    parser.add_argument("--hold", type=float, default=0.3)
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    if len(args.key) == 1:
        _one(args.key[0], args.ttl, args.hold, args.timeout)
    else:
        asyncio.run(_many(args.key, args.ttl, args.hold, args.timeout))


if __name__ == "__main__":
    main()
