"""Waiting benchmark: what waiting costs the project's quota, and how soon a released lock is granted.

Two families of rows, against a fresh LocalServer (SQLite, loopback, quota off so that what is
measured is what the waiters choose to spend):

* **keys in one process**: 1, 10, 100 and 1,000 async waiters in one process, each on its own held key
  (a mapped task with one lock per map index, a fan-out over regions). The holders are another
  credential of the same project, so their releases are seen only by polling, as a release in another
  process would be.
* **processes on one key**: 1, 10 and 50 waiting processes (``tests/e2e/fleet_waiter.py``) on one key
  that this process holds, as a Prefect process worker or a fleet of Airflow workers waiting in place.

For each row: the waiters' requests a minute once their backoff has settled (measured over the
window after a warm-up, from the server's request log), and the grant latency from a release to the
waiter holding the lock (median and worst over the released keys; for processes, the first grant after
the holder's release).

Two more tables run at the contract's real quota (600 a minute), where no process sees the others:

* **fleet**: waiting processes x keys each (core waiters; with ``.venv-airflow`` present, also real
  ``VolcanoLockTrigger.run()``s, ten per triggerer process) beside five holders at ``ttl=15``: waiting
  requests a minute and 429s once settled, holders lost, and the handoff of keys released late.
* **line drain**: twenty processes wait on one key held for 75 s, then each holds it for one second:
  the time from the first release to the last, against the ideal of 20 s, and the requests the line
  spent.

    python bench/bench_waiting.py             # every row (about half an hour)
    python bench/bench_waiting.py --quick     # shorter windows, 1,000 keys left out
    python bench/bench_waiting.py --only fleet,drain
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from volcano_locks import AsyncVolcanoLocks, VolcanoLocks, WaitTimeout
from volcano_locks.governor import DEFAULT_WAIT_BUDGET
from volcano_locks.server.harness import LocalServer

REPO = Path(__file__).resolve().parents[1]
WAITER = REPO / "tests" / "e2e" / "fleet_waiter.py"
TRIGGERER = REPO / "tests" / "airflow" / "trigger_fleet_proc.py"
AIRFLOW_PYTHON = REPO / ".venv-airflow" / "bin" / "python"


def _waiting_requests(srv: LocalServer, prefix: str, since: float, until: float) -> int:
    return sum(
        1
        for r in srv.requests()
        if r.get("op") in ("get", "acquire") and prefix in r.get("path", "") and since <= r["time"] <= until
    )


async def keys_row(srv: LocalServer, n: int, warmup: float, window: float) -> dict[str, object]:
    """``n`` waiters in this process on ``n`` held keys; release a few after the warm-up."""
    prefix = f"bw{n}-{uuid.uuid4().hex[:6]}"
    keys = [f"{prefix}-{i}" for i in range(n)]
    other = srv.mint_key(permissions=["locks.manage"])  # another credential: no in-process wake-up
    with VolcanoLocks(srv.url, service_key=other) as holder:
        leases = {k: holder.acquire(k, 3600) for k in keys}
    got: dict[str, float] = {}
    async with AsyncVolcanoLocks(srv.url, service_key=srv.service_key) as client:

        async def wait(k: str) -> None:
            try:
                lease = await client.wait_acquire(k, 30, timeout=warmup + window + 60)
            except WaitTimeout:
                return
            got[k] = time.time()
            await client.release(k, lease)

        tasks = [asyncio.create_task(wait(k)) for k in keys]
        await asyncio.sleep(warmup)
        measured_from = time.time()
        released: dict[str, float] = {}
        chosen = keys[:: max(1, n // 5)][:5]
        with VolcanoLocks(srv.url, service_key=other) as holder:
            for i, k in enumerate(chosen):
                await asyncio.sleep(window / (len(chosen) + 1) if i else 1.0)
                holder.release(k, leases[k])
                released[k] = time.time()
        end = measured_from + window
        await asyncio.sleep(max(0.0, end - time.time()))
        measured_until = time.time()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    with VolcanoLocks(srv.url, service_key=other) as holder:
        for k in keys:
            if k not in released:
                holder.release(k, leases[k])
    latencies = [got[k] - released[k] for k in released if k in got]
    spent = _waiting_requests(srv, prefix, measured_from, measured_until)
    return {
        "row": f"{n} key(s), 1 process",
        "per_minute": spent / ((measured_until - measured_from) / 60),
        "every": (measured_until - measured_from) * n / spent if spent else float("inf"),
        "median": statistics.median(latencies) if latencies else float("nan"),
        "worst": max(latencies) if latencies else float("nan"),
        "granted": f"{len(latencies)}/{len(released)}",
    }


def processes_row(srv: LocalServer, p: int, hold: float) -> dict[str, object]:
    """``p`` waiting processes on one key that this process holds for ``hold`` seconds."""
    key = f"bp{p}-{uuid.uuid4().hex[:6]}"
    env = {**os.environ, **srv.env(), "PYTHONPATH": str(REPO)}
    with VolcanoLocks(srv.url, service_key=srv.service_key) as client:
        guard_ctx = client.with_lock(key, 15)
        guard = guard_ctx.__enter__()
        procs = [
            subprocess.Popen(
                [sys.executable, str(WAITER), "--key", key, "--ttl", "15", "--hold", "0.2"],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(p)
        ]
        time.sleep(hold / 2)  # let the waiters start and back off
        measured_from = time.time()
        time.sleep(hold / 2)
        measured_until = time.time()
        assert not guard.lost
        guard_ctx.__exit__(None, None, None)
        released = time.time()
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=1800)
        if proc.returncode != 0:
            raise RuntimeError(err[-2000:])
        results.append(json.loads(out.strip().splitlines()[-1]))
    results.sort(key=lambda r: r["acquired"])
    handoffs = [b["acquired"] - a["released"] for a, b in itertools.pairwise(results)]
    spent = _waiting_requests(srv, key, measured_from, measured_until)
    return {
        "row": f"1 key, {p} process(es)",
        "per_minute": spent / ((measured_until - measured_from) / 60),
        "every": (measured_until - measured_from) * p / spent if spent else float("inf"),
        "median": results[0]["acquired"] - released if p == 1 else statistics.median(handoffs),
        "worst": results[0]["acquired"] - released if p == 1 else max(handoffs),
        "granted": f"{len(results)}/{p}",
    }


def _spawn(cmd: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def _holders(srv: LocalServer, prefix: str, stop: threading.Event, lost: list[str]) -> list[threading.Thread]:
    def hold(n: int) -> None:
        with (
            VolcanoLocks(srv.url, service_key=srv.service_key) as client,
            client.with_lock(f"{prefix}-h{n}", 15) as guard,
        ):
            stop.wait(3600)
            if guard.lost:
                lost.append(f"h{n}")

    threads = [threading.Thread(target=hold, args=(n,), daemon=True) for n in range(5)]
    for t in threads:
        t.start()
    return threads


def fleet_row(
    srv: LocalServer, processes: int, keys: int, triggers: bool, seconds: float
) -> dict[str, object]:
    """``processes`` waiting processes on ``keys`` held keys each, beside five holders, at quota 600."""
    prefix = f"bf{processes}x{keys}{'t' if triggers else ''}-{uuid.uuid4().hex[:6]}"
    names = [[f"{prefix}-p{p}-k{k}" for k in range(keys)] for p in range(processes)]
    other = srv.mint_key(permissions=["locks.manage"])
    with VolcanoLocks(srv.url, service_key=other) as holder:
        leases = {k: holder.acquire(k, 3600) for k in itertools.chain(*names)}
    env = {**os.environ, **srv.env(), "PYTHONPATH": str(REPO)}
    conn = {"conn_type": "volcano", "host": srv.url, "password": srv.service_key}
    stop, lost = threading.Event(), []
    threads = _holders(srv, prefix, stop, lost)
    started = time.time()
    procs = []
    for ks in names:
        args = [a for k in ks for a in ("--key", k)]
        if triggers:
            trig_env = {
                **env,
                "AIRFLOW_CONN_VOLCANO_DEFAULT": json.dumps(conn),
                "AIRFLOW_HOME": str(REPO / ".tmp"),
            }
            procs.append(_spawn([str(AIRFLOW_PYTHON), str(TRIGGERER), *args], trig_env))
        else:
            procs.append(_spawn([sys.executable, str(WAITER), "--timeout", str(seconds + 60), *args], env))
    time.sleep(seconds - 40)
    released = {ks[0]: time.time() for ks in names}
    with VolcanoLocks(srv.url, service_key=other) as holder:
        for k in released:
            holder.release(k, leases.pop(k))
    time.sleep(40)
    ended = time.time()
    stop.set()
    for t in threads:
        t.join(30)
    got: dict[str, float] = {}
    for proc in procs:
        if triggers:
            proc.terminate()
        out, _ = proc.communicate(timeout=120)
        for line in out.splitlines():
            if line.startswith("{"):
                r = json.loads(line)
                at = r.get("at", r.get("acquired"))
                if r.get("lock_key", r.get("key")) in released and at is not None:
                    got[r.get("lock_key", r.get("key"))] = at
    with VolcanoLocks(srv.url, service_key=other) as holder:
        for k, lease in leases.items():
            holder.release(k, lease)
    log = [r for r in srv.requests() if prefix in r.get("path", "")]
    settled_from = started + 120
    waiting = [r for r in log if r.get("op") in ("get", "acquire") and "-h" not in r["path"]]
    settled = [r for r in waiting if settled_from <= r["time"] <= ended]
    minutes = (ended - settled_from) / 60
    handoffs = [got[k] - released[k] for k in released if k in got]
    return {
        "row": f"{processes} x {keys} {'triggers' if triggers else 'core waiters'}",
        "per_minute": len(settled) / minutes,
        "refused": sum(r.get("status") == 429 for r in settled) / minutes,
        "keeping_refused": sum(r.get("status") == 429 for r in log if r.get("op") in ("renew", "release")),
        "lost": len(lost),
        "handoff": statistics.median(handoffs) if handoffs else float("nan"),
        "granted": f"{len(handoffs)}/{len(released)}",
    }


def drain_row(srv: LocalServer, waiters: int = 20, hold: float = 75.0) -> dict[str, object]:
    """``waiters`` processes wait on one key held ``hold`` s; then each holds it one second in turn."""
    key = f"bd{waiters}-{uuid.uuid4().hex[:6]}"
    env = {**os.environ, **srv.env(), "PYTHONPATH": str(REPO)}
    other = srv.mint_key(permissions=["locks.manage"])
    with VolcanoLocks(srv.url, service_key=other) as holder:
        lease = holder.acquire(key, 3600)
        procs = [
            _spawn([sys.executable, str(WAITER), "--key", key, "--hold", "1", "--timeout", "600"], env)
            for _ in range(waiters)
        ]
        started = time.time()
        time.sleep(hold)
        released = time.time()
        holder.release(key, lease)
    results = [json.loads(p.communicate(timeout=900)[0].strip().splitlines()[-1]) for p in procs]
    last = max(r["released"] for r in results)
    spent = _waiting_requests(srv, key, started, last)
    during = _waiting_requests(srv, key, released, last)
    kinds = _drain_kinds([r for r in srv.requests() if key in r.get("path", "")], started, released, last)
    return {
        "drain": last - released,
        "ideal": waiters * 1.0,
        "spent": spent,
        "during": during,
        "hold": hold,
        "kinds": kinds,
    }


def _drain_kinds(
    log: list[dict[str, object]], started: float, released: float, last: float
) -> dict[str, int]:
    """Where a line's waiting requests go: the long hold, and during the drain a lock held or free."""
    kinds = dict.fromkeys(("hold", "held", "free", "granted", "refused", "429"), 0)
    free = False  # during the drain: between a release and the next grant (the lock changing hands)
    for r in sorted(log, key=lambda r: float(r["time"])):  # type: ignore[arg-type]
        at, op, status = float(r["time"]), r.get("op"), r.get("status")  # type: ignore[arg-type]
        if op == "release" and status == 204 and at >= released:
            free = True
        if op not in ("get", "acquire") or not started <= at <= last:
            continue
        if status == 429:
            kinds["429"] += 1
        elif op == "acquire" and status in (200, 201):
            kinds["granted"] += 1
            free = False
        elif at < released:
            kinds["hold"] += 1
        elif op == "acquire":
            kinds["refused"] += 1
        else:
            kinds["free" if free else "held"] += 1
    return kinds


def main() -> None:
    """Run the rows and print the tables."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="shorter windows, no 1,000-key row")
    parser.add_argument(
        "--only", default="keys,processes,fleet,drain", help="tables to run (comma-separated)"
    )
    args = parser.parse_args()
    only = set(args.only.split(","))
    warmup, window, hold = (20.0, 30.0, 40.0) if args.quick else (40.0, 60.0, 100.0)
    key_counts = [1, 10, 100] if args.quick else [1, 10, 100, 1000]
    rows = []
    with LocalServer(admin=True, quota=10_000_000) as srv:
        for n in key_counts if "keys" in only else []:
            rows.append(asyncio.run(keys_row(srv, n, warmup, window)))
            print(f"  measured {rows[-1]['row']}", file=sys.stderr, flush=True)
        for p in (1, 10, 50) if "processes" in only else []:
            rows.append(processes_row(srv, p, hold))
            print(f"  measured {rows[-1]['row']}", file=sys.stderr, flush=True)
    if rows:
        print(f"\nWaiting for held locks (waiting budget {DEFAULT_WAIT_BUDGET}/min per process, defaults)\n")
        print(
            "| waiters | waiting requests/min | each waiter looks every (s) | grant latency median (s) "
            "| worst (s) | granted in the window |"
        )
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        for r in rows:
            print(
                f"| {r['row']} | {r['per_minute']:.0f} | {r['every']:.1f} | {r['median']:.2f} "
                f"| {r['worst']:.2f} | {r['granted']} |"
            )
        print(
            "\nkeys rows: latency from a release by another credential (seen by polling only);"
            " processes rows: from the holder's release to the first grant (1 process), else between"
            " successive waiters' release and grant."
        )
    fleet = []
    if "fleet" in only:
        shapes = [(1, 10, False), (6, 10, False), (20, 1, False)]
        if AIRFLOW_PYTHON.exists():
            shapes.append((6, 10, True))
        seconds = 150.0 if args.quick else 240.0
        for processes, keys, triggers in shapes:
            with LocalServer(admin=True, quota=600) as srv:
                fleet.append(fleet_row(srv, processes, keys, triggers, seconds))
            print(f"  measured {fleet[-1]['row']}", file=sys.stderr, flush=True)
        print("\nA fleet at the real quota (600/min) beside five holders at ttl=15 (~60/min)\n")
        print(
            "| waiting processes x keys | waiting requests/min (settled) | 429s/min | renewals refused "
            "| holders lost | handoff median (s) | granted |"
        )
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for r in fleet:
            print(
                f"| {r['row']} | {r['per_minute']:.0f} | {r['refused']:.1f} | {r['keeping_refused']} "
                f"| {r['lost']}/5 | {r['handoff']:.2f} | {r['granted']} |"
            )
        print(
            "\nsettled: from the third minute on; handoff: a key of each process released 40 s before the end"
        )
    if "drain" in only:
        with LocalServer(admin=True, quota=600) as srv:
            d = drain_row(srv)
        print("\nA line of short jobs at the real quota: 20 processes, each holds one second in turn\n")
        print(
            "| line | drain (s) | ideal (s) | x ideal | waiting requests (hold + drain) | during the drain |"
        )
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        print(
            f"| 20 x 1 s after a {d['hold']:.0f} s hold | {d['drain']:.1f} | {d['ideal']:.0f} "
            f"| {d['drain'] / d['ideal']:.2f} | {d['spent']} | {d['during']} |"
        )
        k = d["kinds"]
        assert isinstance(k, dict)
        print(
            f"\nwhere they went: {k['hold']} during the {d['hold']:.0f} s hold; in the drain"
            f" {k['held']} looks while a waiter held the lock, {k['free']} while it was free"
            " (changing hands),"
            f" {k['refused']} refused and {k['granted']} granted acquisitions; {k['429']} 429s"
        )


if __name__ == "__main__":
    main()
