"""What a locked_task costs and how it recovers from a crash, beside Prefect's own concurrency limit.

One process, one run: a local Volcano-compatible server and a Prefect test server (harness) are
started side by side, then:

1. **Enter + exit** (N pairs each, around an empty body):
   - `locked_task`, credentials by block name: a `locked_task("...", credentials="bench")`-wrapped
     no-op called outside a task run: render the key, reuse the block loaded on first use, build a
     client, acquire (POST), start the keeper, stop it, release (DELETE).
   - `locked_task`, credentials from the environment (`credentials=None`).
   - core `with_lock` on one long-lived client (what the decorator's per-run client costs shows as
     the difference).
   - Prefect `concurrency(name, occupy=1)`: the sync global-concurrency-limit context manager against
     the harness (limit 1, so it is a lock too): increment-with-lease, lease renewal, decrement.
2. **Crash recovery**: a holder process is inside the lock when it is killed with SIGKILL; a second
   process is already waiting. Measured: seconds from the kill until the waiter's body starts.
   `locked_task` at its default TTL (30 s) and at TTL 10, against Prefect's global concurrency limit
   at its defaults (the lease a crashed holder leaves behind is reclaimed by the server's lease
   expiry).

Run:  .venv-prefect/bin/python bench/bench_prefect.py [--n 300] [--warmup 20] [--skip-crash]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Callable

# Prefect reads its settings at import: keep the benchmark's home, results and telemetry private.
os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix="bench-prefect-home-")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")

from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.concurrency.sync import concurrency
from prefect.settings import PREFECT_API_URL
from prefect.testing.utilities import prefect_test_harness

from prefect_volcano import VolcanoCredentials, locked_task
from volcano_locks import VolcanoLocks
from volcano_locks.server.harness import LocalServer

CRASH_TIMEOUT = 420.0
"""Give up on a crash-recovery row after this many seconds (printed as "> N s")."""


def timed(n: int, warmup: int, one: Callable[[], None]) -> list[float]:
    """Milliseconds per call of `one`, after `warmup` untimed calls."""
    for _ in range(warmup):
        one()
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        one()
        samples.append((time.perf_counter() - start) * 1000)
    return samples


def p99(samples: list[float]) -> float:
    """The 99th percentile (nearest rank)."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(0.99 * len(ordered)) - 1)]


# The holder and the waiter of the crash rows: each a process of its own, as under a Prefect worker.
_LOCKED_TASK_PROC = """
import sys, time
from prefect import flow, task
from prefect_volcano import locked_task

role, key, ttl = sys.argv[1], sys.argv[2], int(sys.argv[3])

@locked_task(key, ttl=ttl, on_contention="wait")
@task
def body() -> None:
    print("BODY", time.time(), flush=True)
    if role == "holder":
        time.sleep(3600)

@flow
def run() -> None:
    body()

print("READY", flush=True)
run()
"""

_PREFECT_GCL_PROC = """
import sys, time
from prefect.concurrency.sync import concurrency

role, name = sys.argv[1], sys.argv[2]
print("READY", flush=True)
with concurrency(name, occupy=1, strict=True, timeout_seconds=None):
    print("BODY", time.time(), flush=True)
    if role == "holder":
        time.sleep(3600)
"""


def _spawn(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=dict(os.environ, PREFECT_API_URL=str(PREFECT_API_URL.value())),
    )


def _line(proc: subprocess.Popen[str], prefix: str) -> str:
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(prefix):
            return line.strip()
    raise RuntimeError(f"process exited ({proc.wait()}) before printing {prefix}")


def crash_recovery(code: str, *args: str) -> float:
    """Seconds from SIGKILL of a holder inside the lock until an already waiting process's body starts."""
    holder = _spawn(code, "holder", *args)
    waiter: subprocess.Popen[str] | None = None
    try:
        _line(holder, "BODY")
        waiter = _spawn(code, "waiter", *args)
        _line(waiter, "READY")
        time.sleep(5)  # the waiter is past its imports and waiting on the held lock
        killed_at = time.time()
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        deadline = time.monotonic() + CRASH_TIMEOUT
        while waiter.poll() is None and time.monotonic() < deadline:
            try:
                body = _line(waiter, "BODY")
                return float(body.split()[1]) - killed_at
            except RuntimeError:
                break
        return float("inf")
    finally:
        for proc in (holder, waiter):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=300, help="timed enter+exit pairs per row")
    parser.add_argument("--warmup", type=int, default=20, help="untimed pairs before each row")
    parser.add_argument("--skip-crash", action="store_true", help="only the enter+exit rows")
    args = parser.parse_args()

    run = uuid.uuid4().hex[:8]
    crash_rows: list[tuple[str, float]] = []
    with LocalServer(quota=10_000_000) as server, prefect_test_harness(server_startup_timeout=120):
        os.environ.update(server.env())
        VolcanoCredentials(api_url=server.url, service_key=server.service_key).save("bench", overwrite=True)

        @locked_task(f"bench-prefect-name-{run}", ttl=30, on_contention="fail", credentials="bench")
        def by_name() -> None:
            return None

        @locked_task(f"bench-prefect-env-{run}", ttl=30, on_contention="fail")
        def by_env() -> None:
            return None

        limit = f"bench-prefect-{run}"
        with get_client(sync_client=True) as client:
            client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=limit, limit=1))

        def prefect_gcl() -> None:
            with concurrency(limit, occupy=1, strict=True):
                pass

        with VolcanoLocks() as shared:

            def core_reused() -> None:
                with shared.with_lock(f"bench-core-{run}", 30, interrupt=True):
                    pass

            rows = [
                (
                    "`locked_task`, credentials by block name (loaded once)",
                    timed(args.n, args.warmup, by_name),
                ),
                ("`locked_task`, credentials from the environment", timed(args.n, args.warmup, by_env)),
                ("core `with_lock`, reused client", timed(args.n, args.warmup, core_reused)),
                ("Prefect `concurrency(name, occupy=1)`", timed(args.n, args.warmup, prefect_gcl)),
            ]

        if not args.skip_crash:
            for ttl in (30, 10):
                key = f"bench-crash-{run}-{ttl}"
                crash_rows.append(
                    (
                        f"`locked_task` (ttl {ttl} s), waiting run",
                        crash_recovery(_LOCKED_TASK_PROC, key, str(ttl)),
                    )
                )
            crash_limit = f"bench-crash-{run}"
            with get_client(sync_client=True) as client:
                client.create_global_concurrency_limit(
                    GlobalConcurrencyLimitCreate(name=crash_limit, limit=1)
                )
            crash_rows.append(
                (
                    "Prefect global concurrency limit (defaults), waiting `concurrency()`",
                    crash_recovery(_PREFECT_GCL_PROC, crash_limit),
                )
            )

    ours, prefect = rows[0][1], rows[3][1]
    print(f"1. enter+exit of a lock around an empty body, n={args.n} per row (milliseconds)\n")
    print("| what | median ms | p99 ms |")
    print("| --- | ---: | ---: |")
    for name, samples in rows:
        print(f"| {name} | {statistics.median(samples):.2f} | {p99(samples):.2f} |")
    ratio_median = statistics.median(prefect) / statistics.median(ours)
    ratio_p99 = p99(prefect) / p99(ours)
    print(f"| Prefect / `locked_task` by block name | {ratio_median:.1f}x | {ratio_p99:.1f}x |")
    if crash_rows:
        print("\n2. crash recovery: holder killed with SIGKILL inside the lock, another process waiting\n")
        print("| what | seconds from SIGKILL to the waiter's body |")
        print("| --- | ---: |")
        for name, seconds in crash_rows:
            shown = f"> {CRASH_TIMEOUT:.0f}" if seconds == float("inf") else f"{seconds:.1f}"
            print(f"| {name} | {shown} |")


if __name__ == "__main__":
    main()
