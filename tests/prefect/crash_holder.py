"""A flow run in its own process that takes a lock and holds it until killed (run by test_board.py).

Usage: python crash_holder.py KEY [TTL]   (TTL: seconds, default 5)
Prints "HOLDING <fencing token> <flow run id>" once inside (the lock's current view is written beside it).
"""

from __future__ import annotations

import sys
import time

from prefect import flow, task
from prefect.runtime import flow_run

from prefect_volcano import current_lease, locked_task

KEY = sys.argv[1]
TTL = int(sys.argv[2]) if len(sys.argv) > 2 else 5


@locked_task(KEY, ttl=TTL)
@task
def hold() -> None:
    print(f"HOLDING {current_lease().fencing_token} {flow_run.id}", flush=True)
    time.sleep(600)  # until SIGKILL: no release, no loss report, no artifact update


@flow
def crash_holder() -> None:
    hold()


if __name__ == "__main__":
    crash_holder()
