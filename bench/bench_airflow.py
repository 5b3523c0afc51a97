"""Benchmark of the Airflow provider: triggers waiting on one key, and the operator's import cost.

Prints two markdown tables:

1. N VolcanoLockTriggers (default 1 and 500) waiting in one event loop on one key held from
   outside: requests per minute the waiting costs, CPU share of one core, resident memory, and
   what happens on release (time to the first acquisition, how many woke).
2. The added import time of ``airflow_provider_volcano.operators.lock`` over ``import airflow.sdk``,
   measured in fresh subprocesses (median of several repeats).

Usage: .venv-airflow/bin/python bench/bench_airflow.py [--triggers 500] [--seconds 30] [--poll 2]
       [--import-repeats 7]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def _wait_phase(server, key: str, n: int, seconds: float, poll: float, holder) -> dict[str, float]:  # type: ignore[no-untyped-def]
    from airflow_provider_volcano._tokens import TaskIdentity
    from airflow_provider_volcano.triggers.lock import VolcanoLockTrigger

    async def first_event(trigger: VolcanoLockTrigger) -> dict[str, object]:
        async for event in trigger.run():
            return dict(event.payload)
        raise RuntimeError("no event")

    held = holder.acquire(key, 600)
    rss_before = _rss_mb()
    triggers = [
        VolcanoLockTrigger(
            volcano_conn_id="volcano_default",
            lock_key=key,
            ttl=30,
            identity=TaskIdentity("bench", f"task{i}", "run", -1, 1).as_dict(),
            poll=poll,
        )
        for i in range(n)
    ]
    tasks = [asyncio.create_task(first_event(t)) for t in triggers]
    await asyncio.sleep(min(3.0, seconds / 4))  # start-up (connection lookups) is not the steady state
    server.clear_requests()
    cpu0, wall0 = time.process_time(), time.monotonic()
    await asyncio.sleep(seconds)
    cpu1, wall1 = time.process_time(), time.monotonic()
    reqs = [r for r in server.requests() if key in str(r.get("path", ""))]
    rss_after = _rss_mb()
    released_at = time.monotonic()
    holder.release(key, held)
    done, _ = await asyncio.wait(tasks, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    first = time.monotonic() - released_at
    await asyncio.sleep(2 * poll)
    woke = sum(1 for t in tasks if t.done())
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    holder.force_release(key)
    return {
        "triggers": n,
        "requests_per_min": len(reqs) * 60 / (wall1 - wall0),
        "cpu_pct": 100 * (cpu1 - cpu0) / (wall1 - wall0),
        "rss_mb": rss_after,
        "rss_delta_mb": rss_after - rss_before,
        "first_acquire_s": first if done else float("nan"),
        "woke": woke,
    }


def bench_triggers(counts: list[int], seconds: float, poll: float) -> list[dict[str, float]]:
    """Run the waiting phase for each trigger count against a fresh local server."""
    from volcano_locks import VolcanoLocks
    from volcano_locks.server.harness import LocalServer

    with LocalServer(admin=True) as server:  # the real quota: 600 requests a minute
        service_key = server.service_key
        os.environ["AIRFLOW_CONN_VOLCANO_DEFAULT"] = json.dumps(
            {"conn_type": "volcano", "host": server.url, "password": service_key}
        )
        rows = []
        with VolcanoLocks(server.url, service_key=service_key) as holder:
            for i, n in enumerate(counts):
                rows.append(
                    asyncio.run(
                        _wait_phase(server, f"bench-airflow-{os.getpid()}-{i}", n, seconds, poll, holder)
                    )
                )
        return rows


_IMPORT_PROBE = """
import time
t0 = time.perf_counter()
import airflow.sdk
t1 = time.perf_counter()
import airflow_provider_volcano.operators.lock
t2 = time.perf_counter()
print(f"{t1 - t0} {t2 - t1}")
"""


def bench_import(repeats: int) -> tuple[float, float, list[float]]:
    """Median seconds of ``import airflow.sdk`` and of the operator module on top, in fresh interpreters."""
    base, added = [], []
    for _ in range(repeats):
        out = subprocess.run(
            [sys.executable, "-c", _IMPORT_PROBE],
            capture_output=True,
            text=True,
            check=True,
            env=os.environ.copy(),
        ).stdout.split()
        base.append(float(out[-2]))
        added.append(float(out[-1]))
    return statistics.median(base), statistics.median(added), added


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--triggers", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=30.0, help="measured waiting window per row")
    parser.add_argument("--poll", type=float, default=2.0, help="the triggers' poll interval")
    parser.add_argument("--import-repeats", type=int, default=7)
    args = parser.parse_args()

    home = tempfile.mkdtemp(prefix="bench-airflow-home-")
    os.environ.setdefault("AIRFLOW_HOME", home)
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    os.environ.setdefault("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", f"sqlite:///{home}/airflow.db")

    rows = bench_triggers(sorted({1, args.triggers}), args.seconds, args.poll)
    print(
        f"\n### Triggers waiting on one held key in one event loop (poll {args.poll:g} s, "
        f"{args.seconds:g} s window, {os.cpu_count()} cores)\n"
    )
    print(
        "| triggers | lock requests/min | CPU (% of one core) | process RSS MB | RSS added by triggers MB "
        "| first acquire after release s | woken by one release |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['triggers']:.0f} | {r['requests_per_min']:.1f} | {r['cpu_pct']:.2f} | {r['rss_mb']:.0f} "
            f"| {r['rss_delta_mb']:.1f} | {r['first_acquire_s']:.2f} | {r['woke']:.0f} |"
        )

    base, added, all_added = bench_import(args.import_repeats)
    print(f"\n### Import time in fresh interpreters (median of {args.import_repeats})\n")
    print("| import | median ms |")
    print("|---|---:|")
    print(f"| `import airflow.sdk` | {base * 1000:.0f} |")
    print(f"| `airflow_provider_volcano.operators.lock` on top (added) | {added * 1000:.1f} |")
    print(f"\n(added ms per run: {', '.join(f'{a * 1000:.1f}' for a in all_added)})")


if __name__ == "__main__":
    main()
