"""A run in another process that holds a lock for a while, then releases it (run by test_wake.py).

Usage: python wake_holder.py KEY HOLD_SECONDS
Prints "HOLDING <fencing token>" once inside, holds until a line arrives on stdin (the test's waiter is
waiting) or for HOLD_SECONDS at most, and prints "RELEASED" after the lock is released.
"""

from __future__ import annotations

import os
import select
import sys

from prefect import flow, task

from prefect_volcano import current_lease, locked_task

KEY, HOLD = sys.argv[1], float(sys.argv[2])


@locked_task(KEY, ttl=15)
@task
def hold() -> None:
    print(f"HOLDING {current_lease().fencing_token}", flush=True)
    select.select([sys.stdin], [], [], HOLD)


@flow
def holder() -> None:
    hold()


if __name__ == "__main__":
    holder()
    print("RELEASED", flush=True)
    os._exit(0)  # skip Prefect's slow interpreter shutdown; the events were drained by the flow's end
