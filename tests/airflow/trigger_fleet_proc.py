"""One triggerer-like process of the project fleet tests: real ``VolcanoLockTrigger.run()``s in one loop.

Run with the Airflow environment's python and ``AIRFLOW_CONN_VOLCANO_DEFAULT`` set. Every trigger waits
for its key (no deadline), as a triggerer runs the triggers of deferred tasks; each event is printed as
one JSON line the moment it fires (``key``, ``status``, ``fencing_token``, ``at``), and the process waits
for the others until it is terminated. The last line, printed on SIGTERM, holds the governor's counts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time

from airflow_provider_volcano._tokens import TaskIdentity, new_nonce
from airflow_provider_volcano.triggers.lock import VolcanoLockTrigger


async def _wait(trigger: VolcanoLockTrigger) -> None:
    async for event in trigger.run():
        payload = dict(event.payload)
        line = {k: payload.get(k) for k in ("lock_key", "status", "fencing_token")}
        print(json.dumps({**line, "at": time.time()}), flush=True)
        return


async def main() -> None:
    """Run one trigger per ``--key`` until SIGTERM."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--key", action="append", required=True)
    parser.add_argument("--ttl", type=int, default=15)
    parser.add_argument("--name", default="fleet")
    args = parser.parse_args()
    nonce = new_nonce()
    triggers = [
        VolcanoLockTrigger(
            volcano_conn_id="volcano_default",
            lock_key=key,
            ttl=args.ttl,
            identity=TaskIdentity(args.name, f"t{i}", "r", -1, 1, nonce).as_dict(),
        )
        for i, key in enumerate(args.key)
    ]
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    tasks = [asyncio.create_task(_wait(t)) for t in triggers]
    print(json.dumps({"ready": len(tasks)}), flush=True)
    await stop.wait()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    print(json.dumps({"done": sum(t.done() and not t.cancelled() for t in tasks)}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
