"""A nightly pipeline that runs alone: one lock for the whole flow run, shared by all its tasks.

Many schedulers (or a retried deployment) may start tonight's run; only the run holding the
lock does the work, and the others end in a Completed state whose message says Skipped, so the runs list
shows which run did it. Every task, called or submitted, stamps its writes with the flow's one
fencing token through `current_lease()`.

Run it with `VOLCANO_API_URL` and `VOLCANO_SERVICE_KEY` set (e.g. from `volcano-locks serve`):

    python flows/nightly_pipeline.py 2026-11-29
"""

from __future__ import annotations

import sys
import time

from prefect import flow, task

from prefect_volcano import current_lease, locked_flow


@task
def extract(day: str) -> list[int]:
    """Fetch the day's rows (a stand-in for a real source)."""
    return [len(day), 7, 35]


@task
def transform(rows: list[int], work_seconds: float) -> dict[str, int]:
    """Aggregate the rows, stamped with the flow run's fencing token."""
    time.sleep(work_seconds)  # stands in for the real aggregation
    return {"total": sum(rows), "fencing_token": current_lease().fencing_token}


@task
def publish(day: str, part: str) -> dict[str, object]:
    """Publish one part of the day's report; every part carries the same fencing token."""
    return {"day": day, "part": part, "fencing_token": current_lease().fencing_token}


@locked_flow("nightly:{day}", ttl=30, on_contention="skip")
@flow(name="nightly-pipeline")
def nightly_pipeline(day: str, work_seconds: float = 0.0) -> dict[str, object]:
    """Extract, transform, then publish the parts in parallel, all under the one lock of the night."""
    summary = transform(extract(day), work_seconds)
    parts = publish.map(day, ["sales", "stock", "returns"]).result()
    return {"day": day, "summary": summary, "parts": parts, "fencing_token": current_lease().fencing_token}


if __name__ == "__main__":
    state = nightly_pipeline(sys.argv[1] if len(sys.argv) > 1 else "2026-11-29", return_state=True)
    print(state.name, state.message or "", state.result(raise_on_failure=False))
