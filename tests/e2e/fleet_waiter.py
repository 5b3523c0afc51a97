"""One waiting process of the fleet tests and benchmarks: wait for a lock, hold it briefly, release.

Reads VOLCANO_API_URL / VOLCANO_SERVICE_KEY from the environment; prints one JSON line with when it
started waiting, when it got the lock, its fencing token, when it released and what it spent.
"""

from __future__ import annotations

import argparse
import json
import time

from volcano_locks import VolcanoLocks


def main() -> None:
    """Wait for ``--key``, hold it ``--hold`` seconds, release, and report."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--key", required=True)
    parser.add_argument("--ttl", type=int, default=15)
    parser.add_argument("--hold", type=float, default=0.3)
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    with VolcanoLocks() as client:
        started = time.time()
        lease = client.wait_acquire(args.key, args.ttl, timeout=args.timeout)
        acquired = time.time()
        time.sleep(args.hold)
        released = time.time()
        client.release(args.key, lease)
        print(
            json.dumps(
                {
                    "started": started,
                    "acquired": acquired,
                    "released": released,
                    "fencing_token": lease.fencing_token,
                    "requests": client.requests_sent,
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
