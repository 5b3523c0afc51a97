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

3. **A fleet waiting on one lock** (`--fleet`, its own run: about five minutes): a holder flow run
   (`locked_task`, ttl 15) holds the lock for over a minute while 20 more flow runs, each a process
   of its own as under a process worker, wait for it; each then holds it for 1 s in turn. Printed:
   whether the holder kept its lease, whether every waiter got the lock in turn (no overlap, rising
   fencing tokens), the handoff latency (release to the next body starting), and the project's lock
   requests a minute (the server's request log). Run twice: woken by Prefect events, and with
   `VOLCANO_PREFECT_WAKE=off` (polling alone).

Run:  .venv-prefect/bin/python bench/bench_prefect.py [--n 300] [--warmup 20] [--skip-crash]
      .venv-prefect/bin/python bench/bench_prefect.py --fleet [--waiters 20]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import json
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


_FLEET_PROC = """
import os, sys, time
from pathlib import Path
from prefect import flow, task
from prefect_volcano import current_lease, locked_task

role, key, workdir = sys.argv[1], sys.argv[2], Path(sys.argv[3])
if os.environ.get("BENCH_FLEET_DUMP"):  # each run's wake and wait decisions, for a slow handoff's why
    import logging
    handler = logging.FileHandler(workdir / f"{role}.log")
    handler.setFormatter(logging.Formatter("%(created).3f %(name)s %(message)s"))
    for name in ("prefect_volcano.wake", "volcano_locks.waiting"):
        logging.getLogger(name).addHandler(handler)
        logging.getLogger(name).setLevel(logging.DEBUG)

def record(what: str, token: int) -> None:
    # O_APPEND writes of one short line are atomic: the processes' lines never interleave.
    with open(workdir / "sections", "a") as out:
        out.write(f"{what} {role} {token} {time.time():.6f}\\n")

@locked_task(key, ttl=15, on_contention="wait")
@task
def body() -> int:
    token = current_lease().fencing_token
    record("enter", token)
    if role == "holder":
        print("HOLDING", flush=True)
        start = time.monotonic()
        while time.monotonic() - start < 65 or not (workdir / "go").exists():
            time.sleep(0.2)
    else:
        time.sleep(1.0)
    record("exit", current_lease().fencing_token)
    return token

@flow
def run() -> int:
    return body()

print("READY", flush=True)
state = run(return_state=True)
print("RESULT", state.name, flush=True)
os._exit(0)
"""


def fleet(server: LocalServer, waiters: int, wake: bool) -> dict[str, object]:
    """One fleet run: a holder for over a minute, `waiters` flow-run processes waiting; its figures."""
    workdir = Path(tempfile.mkdtemp(prefix="bench-prefect-fleet-"))
    key = f"bench-fleet-{uuid.uuid4().hex[:8]}"
    env = {"VOLCANO_PREFECT_WAKE": "on" if wake else "off"}
    server.clear_requests()
    started = time.time()
    holder = _Proc(_FLEET_PROC, "holder", key, str(workdir), **env)
    procs = [holder]
    try:
        holder.must("HOLDING")
        procs += [_Proc(_FLEET_PROC, f"waiter{i:02d}", key, str(workdir), **env) for i in range(waiters)]
        for proc in procs[1:]:
            proc.must("READY")
        time.sleep(10)  # every waiter is past its imports and waiting
        (workdir / "go").touch()
        results = [proc.must("RESULT").split()[1] for proc in procs]
        ended = time.time()
    finally:
        for proc in procs:
            proc.stop()
    sections: dict[str, dict[str, tuple[int, float]]] = {}
    for line in (workdir / "sections").read_text().splitlines():
        what, who, token, at = line.split()
        sections.setdefault(who, {})[what] = (int(token), float(at))
    ordered = sorted(sections.values(), key=lambda s: s["enter"][1])
    in_turn = all(
        a["exit"][1] <= b["enter"][1] and a["enter"][0] < b["enter"][0]
        for a, b in itertools.pairwise(ordered)
    )
    handoffs = [b["enter"][1] - a["exit"][1] for a, b in itertools.pairwise(ordered)]
    if os.environ.get("BENCH_FLEET_DUMP"):
        (workdir / "requests.json").write_text(json.dumps(server.requests(), default=str))
        print(f"fleet (wake={wake}) in {workdir}: handoffs", [f"{h:.2f}" for h in handoffs], flush=True)
    holder_kept = (
        sections["holder"]["enter"][0] == sections["holder"]["exit"][0] and results[0] == "Completed"
    )
    lock_requests = [r for r in server.requests() if r["op"] is not None]
    minutes = (ended - started) / 60
    per_clock_minute = collections.Counter(int(r["time"] // 60) for r in lock_requests)
    return {
        "wake": wake,
        "runs": len(results),
        "completed": results.count("Completed"),
        "holder_kept": holder_kept,
        "holder_held_s": sections["holder"]["exit"][1] - sections["holder"]["enter"][1],
        "in_turn": in_turn and len(ordered) == waiters + 1,
        "handoff_median_s": statistics.median(handoffs),
        "handoff_max_s": max(handoffs),
        "requests": len(lock_requests),
        "minutes": minutes,
        "per_minute": len(lock_requests) / minutes,
        "max_clock_minute": max(per_clock_minute.values()),
        "by_op": dict(collections.Counter(str(r["op"]) for r in lock_requests)),
    }


def print_fleet(rows: list[dict[str, object]], waiters: int) -> None:
    """The fleet table."""
    print(f"3. {waiters} waiting flow runs (separate processes) behind one holder (ttl 15, over a minute)\n")
    print(
        "| waiters woken by | runs Completed | holder kept its lease (held s) | every waiter in turn |"
        " handoff median s | handoff max s | lock requests/min (run average) | busiest clock minute |"
        " requests by op |"
    )
    print("| --- | ---: | --- | --- | ---: | ---: | ---: | ---: | --- |")
    for r in rows:
        ops = ", ".join(f"{op} {n}" for op, n in sorted(r["by_op"].items()))  # type: ignore[attr-defined]
        print(
            f"| {'Prefect events' if r['wake'] else 'polling alone (VOLCANO_PREFECT_WAKE=off)'}"
            f" | {r['completed']}/{r['runs']}"
            f" | {'yes' if r['holder_kept'] else 'NO'} ({r['holder_held_s']:.0f})"
            f" | {'yes' if r['in_turn'] else 'NO'} | {r['handoff_median_s']:.2f} | {r['handoff_max_s']:.2f}"
            f" | {r['per_minute']:.0f} | {r['max_clock_minute']} of 600 | {ops} |"
        )


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
    parser.add_argument(
        "--fleet", action="store_true", help="only the fleet run (3.), with and without events"
    )
    parser.add_argument("--waiters", type=int, default=20, help="waiting flow runs in the fleet run")
    args = parser.parse_args()
    if args.fleet:
        with LocalServer(admin=True) as server, prefect_test_harness(server_startup_timeout=120):
            os.environ.update(server.env())
            os.environ["PREFECT_API_URL"] = str(PREFECT_API_URL.value())  # the children's API: the harness
            rows = [fleet(server, args.waiters, wake=True), fleet(server, args.waiters, wake=False)]
        print_fleet(rows, args.waiters)
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
