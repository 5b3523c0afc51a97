"""Benchmark of the Airflow provider: handoffs on the full stack, waiting triggers, import cost.

Prints three markdown tables (``--only`` runs some of them):

1. ``handoff``: on the full stack (api-server, dag processor, scheduler with LocalExecutor,
   triggerer; tests/airflow/helpers.running_stack), side by side in one run, the
   handoff latency from one task's release to the next task's code starting, when the tasks take
   turns through a Volcano lock (the waiters deferred to VolcanoLockTrigger) and through an Airflow
   pool of one slot; the same again with an executor that takes longer than the lock's TTL to start
   each task (bench/airflow_handoff/slow_start_executor.py), as a Celery queue or a pod start would.
   The DAGs are bench/airflow_handoff/dags/bench_handoff.py. Two more pairs of rows (issue 28): a
   long hold (the first task holds ``--long-hold`` s: how soon the line behind it notices the
   release) and a crash takeover (the first task's process is killed with SIGKILL mid-hold: how soon
   the next task runs after the kill, and after the dead lease's expiry), each printed in a second
   table beside a one-slot pool in the same run.
2. ``triggers``: N VolcanoLockTriggers (default 1 and 500) waiting in one event loop on one key held
   from outside: requests per minute the waiting costs, CPU share of one core, resident memory, and
   what happens on release (time to the first acquisition, how many woke).
3. ``import``: the added import time of ``airflow_provider_volcano.operators.lock`` over
   ``import airflow.sdk``, measured in fresh subprocesses (median of several repeats).

Usage: .venv-airflow/bin/python bench/bench_airflow.py [--only handoff,triggers,import]
       [--handoff-rows pool,lock,long-pool,long-lock,crash-pool,crash-lock,slow-pool,slow-lock]
       [--handoff-tasks 6] [--hold 4] [--ttl 10] [--long-hold 60]
       [--slow-ttl 5] [--slow-start 8] [--slow-handoff-ttl N] [--batch-timeout 180]
       [--triggers 500] [--seconds 30] [--poll 2] [--import-repeats 7]
e.g. only the lock's handoff, after a change to the trigger or the operator:
       .venv-airflow/bin/python bench/bench_airflow.py --only handoff --handoff-rows pool,lock
and the long-hold and crash-takeover rows (issue 28):
       .venv-airflow/bin/python bench/bench_airflow.py --only handoff \
           --handoff-rows long-pool,long-lock,crash-pool,crash-lock --handoff-tasks 4
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
HANDOFF_DIR = REPO / "bench" / "airflow_handoff"
HANDOFF_ROWS = (
    "pool",
    "lock",
    "long-pool",
    "long-lock",
    "crash-pool",
    "crash-lock",
    "slow-pool",
    "slow-lock",
)
"""Run in this order: a livelock goes last. ``long-``: the first task holds ``--long-hold`` s;
``crash-``: the first task's process is killed (SIGKILL) mid-hold (issue 28)."""
HANDOFF_POOL = "bench_handoff_one"


# ---- 1. handoffs on the full stack ------------------------------------------------------------


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _p90(values: list[float]) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]


def _epoch(sqlite_time: str | None) -> float | None:
    if not sqlite_time:
        return None
    when = datetime.fromisoformat(sqlite_time)
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


def _restart(stack: Any, name: str) -> None:
    """Stop one of the stack's processes and start it again with the stack's (changed) environment."""
    proc = stack.procs[name]
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
    stack.start(name, name)


def _run_batch(
    stack: Any,
    server: Any,
    row: str,
    tasks: int,
    hold: float,
    timeout: float,
    records: Path,
    long_hold: float = 0.0,
) -> dict[str, Any]:
    """Trigger one run of the row's DAG (``tasks`` mapped tasks) and measure its handoffs."""
    slow, variant = row.startswith("slow-"), row.rpartition("-")[2]
    special = row.partition("-")[0] if row.startswith(("long-", "crash-")) else ""
    dag_id = f"bench_{'slow_' if slow else ''}handoff_{variant}"
    key = f"bench-handoff-{row}-{os.getpid()}"
    server.clear_requests()
    started = time.time()
    conf: dict[str, Any] = {"lock_key": key, "hold": hold}
    if special:
        conf.update(
            first_marker=str(records.parent / f"first-{row}-{os.getpid()}"),
            first_hold=long_hold if special == "long" else 2 * hold,
            crash_first=special == "crash",
        )
    if variant == "pool":
        conf.pop("lock_key")
    stack.cli("dags", "trigger", dag_id, "--conf", json.dumps(conf))

    def done() -> list[dict[str, Any]]:
        if not records.exists():
            return []
        lines = records.read_text(encoding="utf-8").splitlines()
        batch = str(conf.get("first_marker", ""))
        return [r for r in map(json.loads, lines) if r["dag"] == dag_id and r.get("batch", "") == batch]

    while len(done()) < tasks and time.time() - started < timeout:
        stack.alive()
        time.sleep(1)
    finished = sorted(done(), key=lambda r: r["start"])
    wall = time.time() - started

    requests = [r for r in server.requests() if r.get("path", "").startswith(f"/locks/{key}")]
    if dump := os.environ.get("BENCH_HANDOFF_DUMP"):  # the lock's request log and the records, to study
        Path(dump, f"{row}.json").write_text(json.dumps({"requests": requests, "records": done()}))
    releases = sorted(r["time"] for r in requests if r["op"] == "release" and r["status"] == 204)
    grants = sorted(
        (r["time"], r["token_sha256"]) for r in requests if r["op"] == "acquire" and r["status"] == 201
    )
    ends: dict[int, float] = {}
    if variant == "pool":  # the slot is free again when the task instance has ended
        for map_index, end_date in stack.query(
            "SELECT map_index, end_date FROM task_instance WHERE dag_id = ?", dag_id
        ):
            if (end := _epoch(end_date)) is not None:
                ends[int(map_index)] = end
    from_release, code_to_code, to_grant, grant_to_code = [], [], [], []
    overlaps = 0
    for prev, nxt in itertools.pairwise(finished):
        code_to_code.append(nxt["start"] - prev["end"])
        overlaps += nxt["start"] < prev["end"]
        if variant == "lock":
            release = next((t for t in releases if t >= prev["end"]), None)
            if release is None or release > nxt["start"]:
                continue
            from_release.append(nxt["start"] - release)
            # The first grant after the release is the trigger acquiring for the next task; the
            # resumed task then takes that lease over (an idempotent re-acquire, same token).
            grant = next((t for t, _ in grants if t >= release), None)
            if grant is not None and grant <= nxt["start"]:
                to_grant.append(grant - release)
                grant_to_code.append(nxt["start"] - grant)
        elif (release := ends.get(prev["i"])) is not None:
            from_release.append(nxt["start"] - release)
    first = _first_handoff(finished, requests, releases, grants, ends, variant, special) if special else {}
    return {
        "row": row,
        "first": first,
        "tasks": tasks,
        "ran": len(finished),
        "wall": wall,
        "from_release": from_release,
        "code_to_code": code_to_code,
        "to_grant": to_grant,
        "grant_to_code": grant_to_code,
        "overlaps": overlaps,
        # Each batch locks a fresh key and the server's fencing token rises by one per new lease, so
        # the last task's token is how many leases the batch took (lapsed handoffs included).
        "leases": max((r["fencing_token"] for r in finished), default=0) if variant == "lock" else None,
    }


def _first_handoff(
    finished: list[dict[str, Any]],
    requests: list[dict[str, Any]],
    releases: list[float],
    grants: list[tuple[float, str]],
    ends: dict[int, float],
    variant: str,
    special: str,
) -> dict[str, float]:
    """The handoff after the run's first task (the long hold, or the one killed mid-hold).

    ``release``: the lock's release (long-lock), the slot's (the task instance's end: the pools) or the
    kill (crash-lock); then the next task's code start, the trigger's acquisition (lock rows) and,
    after a kill, the dead lease's expiry from its last renewal's answer.
    """
    first = next((r for r in finished if r.get("first")), None)
    if first is None:
        return {}
    later = [r for r in finished if r["start"] >= first["end"] - 0.001 and r is not first]
    if not later:
        return {}
    nxt = min(later, key=lambda r: r["start"])
    out: dict[str, float] = {}
    if special == "long":
        release = (
            ends.get(first["i"], first["end"])
            if variant == "pool"
            else next((t for t in releases if t >= first["end"]), first["end"])
        )
    else:
        release = first["end"]  # the kill
    if special == "crash" and variant == "lock":
        kept = [
            r
            for r in requests
            if r["time"] <= first["end"]
            and r["status"] in (200, 201)
            and r["op"] in ("acquire", "renew")
            and isinstance(r.get("answer"), dict)
        ]
        if kept:
            expiry = datetime.fromisoformat(str(kept[-1]["answer"]["expires_at"]).replace("Z", "+00:00"))
            out["kill_to_expiry"] = expiry.timestamp() - release
            out["expiry_to_code"] = nxt["start"] - expiry.timestamp()
    out["release_to_code"] = nxt["start"] - release
    if variant == "lock":
        grant = next((t for t, _ in grants if t >= release), None)
        if grant is not None:
            out["release_to_grant"] = grant - release
    return out


def bench_handoff(
    rows: list[str],
    tasks: int,
    hold: float,
    ttl: int,
    slow_ttl: int,
    slow_start: float,
    slow_handoff_ttl: int | None,
    timeout: float,
    long_hold: float = 60.0,
) -> list[dict[str, Any]]:
    """Run the chosen handoff rows on one full stack, one batch (one DAG run) after the other."""
    sys.path.insert(0, str(REPO))  # tests.airflow.helpers, from the repository root
    from tests.airflow.helpers import airflow_bin, running_stack
    from volcano_locks.server.harness import LocalServer

    work = Path(tempfile.mkdtemp(prefix="bench-airflow-handoff-"))
    db_dir = work / "db"
    db_dir.mkdir()
    subprocess.run(
        [airflow_bin(), "db", "migrate"],
        env={
            **os.environ,
            "AIRFLOW_HOME": str(db_dir),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{db_dir}/airflow.db",
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        },
        check=True,
        capture_output=True,
        timeout=600,
    )
    shutil.copy(db_dir / "airflow.db", db_dir / "airflow.pristine.db")
    records = work / "records.jsonl"
    results = []
    try:
        with LocalServer(admin=True) as server:  # the real quota: 600 requests a minute
            os.environ["AIRFLOW_CONN_VOLCANO_DEFAULT"] = json.dumps(
                {"conn_type": "volcano", "host": server.url, "password": server.service_key}
            )
            run_dir = work / "stack"
            run_dir.mkdir()
            with running_stack(db_dir, run_dir) as stack:
                # The harness runs the example DAGs on LocalExecutor; the bench's own DAGs need its
                # DAG folder and the slow-start executor, so those two processes start again.
                stack.env.update(
                    {
                        "AIRFLOW__CORE__DAGS_FOLDER": str(HANDOFF_DIR / "dags"),
                        "AIRFLOW__CORE__EXECUTOR": "slow_start_executor.SlowStartLocalExecutor",
                        "PYTHONPATH": os.pathsep.join(
                            [str(HANDOFF_DIR), *filter(None, [os.environ.get("PYTHONPATH")])]
                        ),
                        "BENCH_HANDOFF_TASKS": str(tasks),
                        "BENCH_HANDOFF_TTL": str(ttl),
                        "BENCH_SLOW_TTL": str(slow_ttl),
                        "BENCH_SLOW_START_S": str(slow_start),
                        "BENCH_SLOW_HANDOFF_TTL": "" if slow_handoff_ttl is None else str(slow_handoff_ttl),
                        "BENCH_HANDOFF_POOL": HANDOFF_POOL,
                        "BENCH_HANDOFF_RECORDS": str(records),
                        # A task's start calls the Execution API; on a loaded machine the default 5 s
                        # failed a task before it ran (httpx.ReadTimeout in the executor).
                        "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "30",
                    }
                )
                for name in ("dag-processor", "scheduler"):
                    _restart(stack, name)
                stack.cli("pools", "set", HANDOFF_POOL, "1", "bench: one task at a time")
                for row in rows:
                    slow, variant = row.startswith("slow-"), row.rpartition("-")[2]
                    stack.unpause_when_parsed(f"bench_{'slow_' if slow else ''}handoff_{variant}")
                for row in rows:
                    results.append(
                        _run_batch(stack, server, row, tasks, hold, timeout + long_hold, records, long_hold)
                    )
                    print(
                        f"# {row}: {results[-1]['ran']}/{tasks} ran in {results[-1]['wall']:.0f} s",
                        file=sys.stderr,
                    )
    finally:
        if all(r["ran"] == tasks for r in results) and len(results) == len(rows):
            shutil.rmtree(work, ignore_errors=True)
        else:  # keep the Airflow logs and the metadata DB of a row that did not finish, to read them
            print(f"# a row did not finish: its Airflow home and logs are kept in {work}", file=sys.stderr)
    return results


def print_handoff(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    """Print the handoff table and the lock-to-pool ratios."""
    print(
        f"\n### Handoff on the full stack: {args.handoff_tasks} mapped tasks take turns, each holding "
        f"{args.hold:g} s (LocalExecutor, parallelism 4, {os.cpu_count()} cores)\n"
    )
    print(
        "| how the tasks take turns | ran | handoffs | release → next code, median s | p90 s | max s "
        "| code end → next code, median s | release → trigger acquires, median s "
        "| trigger acquires → code, median s | overlaps | leases granted | wall s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    names = {
        "pool": "Airflow pool, 1 slot",
        "lock": f"Volcano lock, deferred waiters (TTL {args.ttl} s)",
        "slow-pool": f"Airflow pool, 1 slot, tasks start {args.slow_start:g} s late",
        "slow-lock": f"Volcano lock, TTL {args.slow_ttl} s, tasks start {args.slow_start:g} s late, "
        + (
            f"handoff_ttl {args.slow_handoff_ttl} s"
            if args.slow_handoff_ttl is not None
            else "the operator's default handoff_ttl"
        ),
    }
    for r in results:
        if r["row"] not in names:
            continue  # the long-hold and crash rows: their own table below
        fr = r["from_release"]
        lock = r["row"].endswith("lock")
        split = f"{_median(r['to_grant']):.2f} | {_median(r['grant_to_code']):.2f}" if lock else "n/a | n/a"
        print(
            f"| {names[r['row']]} | {r['ran']}/{r['tasks']} | {len(r['code_to_code'])} "
            f"| {_median(fr):.2f} | {_p90(fr):.2f} | {max(fr, default=float('nan')):.2f} "
            f"| {_median(r['code_to_code']):.2f} | {split} "
            f"| {r['overlaps']} | {r['leases'] if lock else 'n/a'} | {r['wall']:.0f} |"
        )
    by_row = {r["row"]: _median(r["from_release"]) for r in results}
    for lock, pool in (("lock", "pool"), ("slow-lock", "slow-pool")):
        if lock in by_row and pool in by_row:
            print(f"\n{lock} / {pool} (median release → next code): {by_row[lock] / by_row[pool]:.2f}x")
    specials = [r for r in results if r["row"].startswith(("long-", "crash-"))]
    if specials:
        print_first_handoffs(specials, args)


def print_first_handoffs(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    """Print the long-hold and crash-takeover rows: the handoff after the first task, lock beside pool."""

    def cell(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.2f}"

    print(
        f"\n### After a long hold ({args.long_hold:g} s) and after a holder killed mid-hold "
        f"(SIGKILL; lock TTL {args.ttl} s): the first task's handoff\n"
    )
    print(
        "| row | release (or kill) → next code s | release → trigger acquires s | kill → lease expiry s "
        "| lease expiry → next code s | other handoffs, median release → next code s | ran |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    names = {
        "long-pool": f"Airflow pool, 1 slot, first task holds {args.long_hold:g} s",
        "long-lock": f"Volcano lock, deferred waiters, first task holds {args.long_hold:g} s",
        "crash-pool": "Airflow pool, 1 slot, first task killed mid-hold",
        "crash-lock": f"Volcano lock (TTL {args.ttl} s), deferred waiters, first task killed mid-hold",
    }
    for r in results:
        f = r["first"]
        print(
            f"| {names[r['row']]} | {cell(f.get('release_to_code'))} | {cell(f.get('release_to_grant'))} "
            f"| {cell(f.get('kill_to_expiry'))} | {cell(f.get('expiry_to_code'))} "
            f"| {_median(r['from_release']):.2f} | {r['ran']}/{r['tasks']} |"
        )


# ---- 2. triggers waiting on one key -----------------------------------------------------------


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def _wait_phase(server, key: str, n: int, seconds: float, poll: float, holder) -> dict[str, float]:  # type: ignore[no-untyped-def]
    from airflow_provider_volcano._tokens import TaskIdentity, new_nonce
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
            identity=TaskIdentity("bench", f"task{i}", "run", -1, 1, new_nonce()).as_dict(),
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


# ---- 3. import cost ----------------------------------------------------------------------------

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
    """Run the chosen parts and print their tables."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", default="handoff,triggers,import", help="comma-separated parts to run")
    parser.add_argument("--handoff-rows", default=",".join(HANDOFF_ROWS), help="comma-separated rows")
    parser.add_argument("--handoff-tasks", type=int, default=6, help="tasks taking turns per row (>= 4)")
    parser.add_argument("--hold", type=float, default=4.0, help="seconds each task holds the resource")
    parser.add_argument("--ttl", type=int, default=10, help="the lock's TTL in the lock row")
    parser.add_argument("--slow-ttl", type=int, default=5, help="the lock's TTL in the slow-lock row")
    parser.add_argument("--slow-start", type=float, default=8.0, help="executor start delay, slow rows")
    parser.add_argument(
        "--slow-handoff-ttl",
        type=int,
        default=None,
        help="the slow-lock row's handoff_ttl (default: the operator's)",
    )
    parser.add_argument(
        "--long-hold", type=float, default=60.0, help="seconds the first task holds, long-hold rows"
    )
    parser.add_argument("--batch-timeout", type=float, default=180.0, help="give up on a row after this")
    parser.add_argument("--triggers", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=30.0, help="measured waiting window per row")
    parser.add_argument("--poll", type=float, default=2.0, help="the triggers' poll interval")
    parser.add_argument("--import-repeats", type=int, default=7)
    args = parser.parse_args()
    parts = {p.strip() for p in args.only.split(",") if p.strip()}
    unknown = parts - {"handoff", "triggers", "import"}
    if unknown:
        parser.error(f"--only: unknown part(s) {sorted(unknown)}; choose from handoff, triggers, import")
    rows = [r.strip() for r in args.handoff_rows.split(",") if r.strip()]
    if set(rows) - set(HANDOFF_ROWS):
        parser.error(f"--handoff-rows: unknown row(s) {sorted(set(rows) - set(HANDOFF_ROWS))}")
    rows = [r for r in HANDOFF_ROWS if r in rows]

    home = tempfile.mkdtemp(prefix="bench-airflow-home-")
    os.environ.setdefault("AIRFLOW_HOME", home)
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    os.environ.setdefault("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", f"sqlite:///{home}/airflow.db")

    if "handoff" in parts and rows:
        results = bench_handoff(
            rows,
            args.handoff_tasks,
            args.hold,
            args.ttl,
            args.slow_ttl,
            args.slow_start,
            args.slow_handoff_ttl,
            args.batch_timeout,
            args.long_hold,
        )
        print("# results: " + json.dumps(results), file=sys.stderr)  # kept if a table cannot print
        print_handoff(results, args)

    if "triggers" in parts:
        trigger_rows = bench_triggers(sorted({1, args.triggers}), args.seconds, args.poll)
        print(
            f"\n### Triggers waiting on one held key in one event loop (poll {args.poll:g} s, "
            f"{args.seconds:g} s window, {os.cpu_count()} cores)\n"
        )
        print(
            "| triggers | lock requests/min | CPU (% of one core) | process RSS MB "
            "| RSS added by triggers MB | first acquire after release s | woken by one release |"
        )
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for r in trigger_rows:
            print(
                f"| {r['triggers']:.0f} | {r['requests_per_min']:.1f} | {r['cpu_pct']:.2f} "
                f"| {r['rss_mb']:.0f} | {r['rss_delta_mb']:.1f} | {r['first_acquire_s']:.2f} "
                f"| {r['woke']:.0f} |"
            )

    if "import" in parts:
        base, added, all_added = bench_import(args.import_repeats)
        print(f"\n### Import time in fresh interpreters (median of {args.import_repeats})\n")
        print("| import | median ms |")
        print("|---|---:|")
        print(f"| `import airflow.sdk` | {base * 1000:.0f} |")
        print(f"| `airflow_provider_volcano.operators.lock` on top (added) | {added * 1000:.1f} |")
        print(f"\n(added ms per run: {', '.join(f'{a * 1000:.1f}' for a in all_added)})")


if __name__ == "__main__":
    main()
