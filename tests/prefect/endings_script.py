"""Locked runs that end every way a user meets, in one process (run by test_endings.py): its output
must carry no ERROR line, traceback or `lapsed` event of ours.

Usage: python endings_script.py KEY
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

from prefect import flow, task

from prefect_volcano import current_lease, is_skipped, locked_task
from volcano_locks import VolcanoLocks

KEY = sys.argv[1]
DELIBERATE = "deliberate failure"
attempts: list[int] = []


@locked_task(f"{KEY}:retried")
@task(retries=1, retry_delay_seconds=0)
def retried() -> int:
    attempts.append(current_lease().fencing_token)
    if len(attempts) == 1:
        raise RuntimeError(f"{DELIBERATE}: first attempt")
    return current_lease().fencing_token


@locked_task(f"{KEY}:raises")
@task
def raises() -> None:
    raise ValueError(f"{DELIBERATE}: the body raised")


@locked_task(f"{KEY}:skip", on_contention="skip")
@task
def skipped() -> int:
    return current_lease().fencing_token


inside = threading.Event()


@locked_task(f"{KEY}:forced", ttl=6)
@task
def forced() -> None:
    inside.set()
    threading.Event().wait(8)  # past the next renewal, which finds the lease gone


@locked_task(f"{KEY}:killed", ttl=10)
@task
def after_a_killed_holder() -> int:
    return current_lease().fencing_token


def killed_holder() -> None:
    """A holder in a process of its own, killed with SIGKILL inside the lock (its lease lapses)."""
    crash_holder = Path(__file__).with_name("crash_holder.py")
    with subprocess.Popen(
        [sys.executable, str(crash_holder), f"{KEY}:killed"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as holder:
        assert holder.stdout is not None
        assert holder.stdout.readline().startswith("HOLDING")
        holder.kill()
        holder.wait()


@flow
def endings() -> None:
    print("RETRIED", retried(), flush=True)
    print("RAISES", raises(return_state=True).name, flush=True)
    with VolcanoLocks() as other, other.with_lock(f"{KEY}:skip", 30):
        print("SKIPPED", is_skipped(skipped()), flush=True)

    def breaker() -> None:
        if inside.wait(30):
            with VolcanoLocks() as admin:
                admin.force_release(f"{KEY}:forced")

    threading.Thread(target=breaker, daemon=True).start()
    print("FORCED", forced(return_state=True).name, flush=True)
    killed_holder()
    print("KILLED", after_a_killed_holder(return_state=True).name, flush=True)


if __name__ == "__main__":
    endings(return_state=True)
    print("DONE", flush=True)
