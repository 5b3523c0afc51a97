"""What a locked_task costs and how it recovers from a crash, beside Prefect's own concurrency limit.

One run: a local Volcano-compatible server and a Prefect test server (harness) are started side by
side, then:

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
   repossessor). This section runs against a real `prefect server start` with its services: the
   harness runs none, so there a crashed holder's concurrency slot is never given back.

3. **A line on a process work pool** (`--fleet`, its own run; see `prefect_fleet.py`): `--runs` flow
   runs (default 50) of one deployment, each holding one lock `--hold` seconds (default 2), created at
   once on a process work pool served by `--workers` real workers (default 2); `locked_task` and then
   Prefect's own concurrency limit in the same run. Printed: drain against the ideal, handoff median /
   p90 / max, overlap, lock requests per hold, runs not Completed.

Run:  .venv-prefect/bin/python bench/bench_prefect.py [--n 300] [--warmup 20] [--skip-crash]
      .venv-prefect/bin/python bench/bench_prefect.py --fleet [--runs 50] [--hold 2] [--workers 2]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

# Prefect reads its settings at import: keep the benchmark's home, results and telemetry private.
os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix="bench-prefect-home-")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")

from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.concurrency.sync import concurrency
from prefect.settings import PREFECT_API_URL, temporary_settings
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


class _Proc:
    """A child process whose stdout lines are read on a thread, so waiting for one can time out."""

    def __init__(self, code: str, *args: str, **env: str) -> None:
        self.popen = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=dict(os.environ, **env),
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self._lines.put(line.strip())
        self._lines.put(None)

    def line(self, prefix: str, timeout: float | None = None) -> str | None:
        """The next line starting with `prefix`; None if the process ended or `timeout` passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(
                    timeout=None if deadline is None else max(0.0, deadline - time.monotonic())
                )
            except queue.Empty:
                return None
            if line is None:
                return None
            if line.startswith(prefix):
                return line

    def must(self, prefix: str) -> str:
        """The next line starting with `prefix`; raises if the process ends first."""
        line = self.line(prefix)
        if line is None:
            raise RuntimeError(f"process exited ({self.popen.wait()}) before printing {prefix}")
        return line

    def stop(self) -> None:
        """Kill the process if it still runs, and reap it."""
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait()
        if self.popen.stdout is not None:
            self.popen.stdout.close()


def crash_recovery(code: str, *args: str) -> float:
    """Seconds from SIGKILL of a holder inside the lock until an already waiting process's body starts."""
    holder = _Proc(code, "holder", *args)
    waiter: _Proc | None = None
    try:
        holder.must("BODY")
        waiter = _Proc(code, "waiter", *args)
        waiter.must("READY")
        time.sleep(5)  # the waiter is past its imports and waiting on the held lock
        killed_at = time.time()
        holder.popen.send_signal(signal.SIGKILL)
        holder.popen.wait()
        body = waiter.line("BODY", timeout=CRASH_TIMEOUT)
        return float("inf") if body is None else float(body.split()[1]) - killed_at
    finally:
        for proc in (holder, waiter):
            if proc is not None:
                proc.stop()


@contextlib.contextmanager
def prefect_server() -> Iterator[str]:
    """A real `prefect server start` (all services, default settings) on a free port; yields its API URL.

    The test harness runs no background services, so a crashed holder's concurrency lease would
    never be reclaimed there; a real server's lease repossessor is what a user's fleet has.
    """
    from tests.prefect.helpers import prefect_server as running_prefect_server

    with running_prefect_server(Path(tempfile.mkdtemp(prefix="bench-prefect-server-"))) as base:
        yield f"{base}/api"


def enter_exit(server: LocalServer, run: str, n: int, warmup: int) -> list[tuple[str, list[float]]]:
    """Section 1: the enter+exit rows (inside a Prefect test harness)."""
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

        return [
            ("`locked_task`, credentials by block name (loaded once)", timed(n, warmup, by_name)),
            ("`locked_task`, credentials from the environment", timed(n, warmup, by_env)),
            ("core `with_lock`, reused client", timed(n, warmup, core_reused)),
            ("Prefect `concurrency(name, occupy=1)`", timed(n, warmup, prefect_gcl)),
        ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=300, help="timed enter+exit pairs per row")
    parser.add_argument("--warmup", type=int, default=20, help="untimed pairs before each row")
    parser.add_argument("--skip-crash", action="store_true", help="only the enter+exit rows")
    parser.add_argument("--fleet", action="store_true", help="only the line on a process work pool (3.)")
    parser.add_argument("--runs", type=int, default=50, help="flow runs in the line (3.)")
    parser.add_argument("--hold", type=float, default=2.0, help="seconds each run holds the lock (3.)")
    parser.add_argument("--workers", type=int, default=2, help="process workers serving the pool (3.)")
    args = parser.parse_args()
    if args.fleet:
        from prefect_fleet import line, print_line

        for name in ("runs", "workers"):
            if getattr(args, name) < 1:
                parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
        if not args.hold > 0:
            parser.error(f"--hold must be positive seconds, got {args.hold}")
        print_line(line(args.runs, args.hold, args.workers), args.runs, args.hold, args.workers)
        return

    run = uuid.uuid4().hex[:8]
    crash_rows: list[tuple[str, float]] = []
    with LocalServer(quota=10_000_000) as server:
        os.environ.update(server.env())
        with prefect_test_harness(server_startup_timeout=120):
            rows = enter_exit(server, run, args.n, args.warmup)
        if not args.skip_crash:
            with prefect_server() as api:
                os.environ["PREFECT_API_URL"] = api
                for ttl in (30, 10):
                    crash_rows.append(
                        (
                            f"`locked_task` (ttl {ttl} s), waiting flow run",
                            crash_recovery(_LOCKED_TASK_PROC, f"bench-crash-{run}-{ttl}", str(ttl)),
                        )
                    )
                with (
                    temporary_settings(updates={PREFECT_API_URL: api}),
                    get_client(sync_client=True) as client,
                ):
                    client.create_global_concurrency_limit(
                        GlobalConcurrencyLimitCreate(name=f"bench-crash-{run}", limit=1)
                    )
                crash_rows.append(
                    (
                        "Prefect global concurrency limit (defaults), waiting `concurrency()`",
                        crash_recovery(_PREFECT_GCL_PROC, f"bench-crash-{run}"),
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
