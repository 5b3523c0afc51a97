"""Leader-only rollup: many schedulers may start this flow, only the lock holder does the rollup.

The others end with a Completed state whose message says Skipped (not cached), so the next tick tries again.
Run it with `VOLCANO_API_URL` and `VOLCANO_SERVICE_KEY` set (e.g. from `volcano-locks serve`):

    python flows/leader_rollup.py 2026-11-29
"""

from __future__ import annotations

import sys
import time

from prefect import flow, task
from prefect.states import State

from prefect_volcano import current_lease, locked_task


@locked_task("rollup:{day}", ttl=30, on_contention="skip")
@task(retries=1, retry_delay_seconds=1)
def rollup(day: str, work_seconds: float = 0.0) -> dict[str, object]:
    """Compute the day's rollup; only one run across the fleet gets here at a time."""
    lease = current_lease()
    time.sleep(work_seconds)  # stands in for the real aggregation
    return {"day": day, "rows": 42, "fencing_token": lease.fencing_token}


@flow(name="leader-rollup")
def leader_rollup(day: str, work_seconds: float = 0.0) -> State[dict[str, object]]:
    """Run the rollup if this run wins the lock; otherwise finish quietly as Skipped."""
    return rollup(day, work_seconds, return_state=True)


if __name__ == "__main__":
    state = leader_rollup(sys.argv[1] if len(sys.argv) > 1 else "2026-11-29")
    print(state.name, state.message or "", state.result(raise_on_failure=False))
