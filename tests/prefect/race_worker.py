"""One contender in the two-process race (run by test_race.py, not collected by pytest).

Usage: python race_worker.py KEY POLICY WORKDIR NAME
Waits for WORKDIR/go, runs a flow whose locked task records its critical section in
WORKDIR/sections (append-only lines), and prints the task's final state name.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from prefect import flow, task

from prefect_volcano import current_lease, is_skipped, locked_task

KEY, POLICY, WORKDIR, NAME = sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4]


def record(event: str, token: int) -> None:
    # O_APPEND writes of one short line are atomic, so the two processes' lines never interleave.
    with open(WORKDIR / "sections", "a") as out:
        out.write(f"{event} {NAME} {token} {time.time():.6f}\n")


@locked_task(KEY, ttl=5, on_contention=POLICY)  # type: ignore[arg-type]
@task
def critical() -> str:
    token = current_lease().fencing_token
    record("enter", token)
    if POLICY == "skip":
        # Stay inside until the other process has been turned away, so the race is decided.
        deadline = time.monotonic() + 60
        while not (WORKDIR / "skipped").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    else:
        time.sleep(0.5)
    record("exit", token)
    return NAME


@flow
def racer() -> str:
    state = critical(return_state=True)
    if is_skipped(state):
        (WORKDIR / "skipped").touch()
    return "Skipped" if is_skipped(state) else str(state.name)


if __name__ == "__main__":
    (WORKDIR / f"ready-{NAME}").touch()
    deadline = time.monotonic() + 120
    while not (WORKDIR / "go").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    print(f"RESULT {racer()}", flush=True)
    os._exit(0)  # the result is printed; skip Prefect's slow interpreter shutdown
