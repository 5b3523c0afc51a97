"""Mapped fan-out: one task run per region, each holding its own region's lock.

Two deployments refreshing overlapping regions never refresh the same region at once, while
different regions still run in parallel. Each result carries the lease's fencing token.

    python flows/regional_fanout.py eu us apac
"""

from __future__ import annotations

import sys
import time

from prefect import flow, task

from prefect_volcano import LockedResult, locked_task


@task
@locked_task("refresh:{region}", ttl=30, on_contention="wait", wait_timeout=120, result="locked_result")
def refresh_region(region: str, work_seconds: float = 0.0) -> str:
    """Refresh one region's cache; the region's lock keeps other runs off the same region."""
    time.sleep(work_seconds)
    return f"{region} refreshed"


@flow(name="regional-fanout")
def regional_fanout(regions: list[str], work_seconds: float = 0.0) -> list[LockedResult[str]]:
    """Refresh every region in parallel, one lock per region."""
    futures = refresh_region.map(regions, work_seconds=work_seconds)
    return futures.result()


if __name__ == "__main__":
    for item in regional_fanout(sys.argv[1:] or ["eu", "us", "apac"]):
        print(f"{item.lock_key}: {item.value} (fencing token {item.fencing_token})")
