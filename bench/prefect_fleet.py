"""A line of runs of one deployment on a process work pool: `locked_task` beside Prefect's concurrency limit.

What a Prefect user runs: a real `prefect server start` (PostgreSQL, all services), a `process` work pool
with real `prefect worker start` workers, and two deployments of the same shape, each a flow whose
one task holds a lock for `hold` seconds:

* `volcano-line`: the task is a `locked_task` on one key (`on_contention="wait"`, ttl 15), against a
  local Volcano-compatible server at the contract's quota (600 requests a minute);
* `limit-line`: the task holds Prefect's own global concurrency limit of 1 (`concurrency(name, occupy=1)`).

For each, `runs` flow runs are created at once; the workers start each as a process of its own, and
each run waits at a gate until every run is up (starting 50 Prefect processes takes minutes on a
loaded 2-core machine; that is the pool's cost, not the lock's), then they all go for the lock at
once. Every body writes when it entered and left (wall clock, one machine). Printed side by side:
the drain (the gate opening to the last body out, against the ideal `runs * hold`), the time the
runs took to be up, handoffs (a body's end to the next body's start) median / p90 / max, whether
the bodies never overlapped, lock requests per hold (counted by the lock server; the limit's are
Prefect API calls, not counted), and runs that did not end Completed.

Run by `bench_prefect.py --fleet [--runs 50] [--hold 2] [--workers 2]`.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import os
import signal
import statistics
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from prefect.exceptions import PrefectHTTPStatusError

from volcano_locks.server.harness import LocalServer

__all__ = ["line", "print_line"]

POOL = "bench-fleet"
SERVER_POOL = {
    "PREFECT_SERVER_DATABASE_SQLALCHEMY_POOL_SIZE": "20",
    "PREFECT_SERVER_DATABASE_SQLALCHEMY_MAX_OVERFLOW": "30",
    "PREFECT_SERVER_DATABASE_CONNECTION_TIMEOUT": "30",
    "PREFECT_SERVER_DATABASE_TIMEOUT": "30",
}
"""The Prefect server's database settings for 50 runs starting at once on two cores. With Prefect's
defaults (a pool of 5, overflow 10) its requests waited 30 s for a connection and failed with 500
(`QueuePool limit ... reached`, server.log); with a larger pool, opening a connection took over its
5 s timeout while the runs' processes started. Either way runs crashed while they started, whichever
lock they were to take."""
TTL = 15
MODES = ("volcano", "limit")

_FLOWS = """
import logging, os, time
from pathlib import Path
from prefect import flow, task
from prefect.concurrency.sync import concurrency
from prefect.runtime import flow_run
from prefect_volcano import locked_task

OUT = Path(os.environ["BENCH_FLEET_DIR"])
HOLD = float(os.environ["BENCH_FLEET_HOLD"])

def record(mode, what):
    # O_APPEND writes of one short line are atomic: the processes' lines never interleave.
    with open(OUT / f"{mode}.sections", "a") as out:
        out.write(f"{what} {flow_run.id} {time.time():.6f}\\n")

@locked_task(os.environ["BENCH_FLEET_KEY"], ttl=int(os.environ["BENCH_FLEET_TTL"]))
@task
def volcano_hold():
    record("volcano", "enter")
    time.sleep(HOLD)
    record("volcano", "exit")

def gate(mode):
    # The line starts when every run is up (a process each, slow to start on a loaded machine).
    record(mode, "ready")
    while not (OUT / f"{mode}.go").exists():
        time.sleep(0.05)

def log_wakes():
    # What this run's listener saw and when (the line's evidence: each line is the time it was logged,
    # then the message, which names the event's own time), one file a run.
    handler = logging.FileHandler(OUT / f"wake-{flow_run.id}.log")
    handler.setFormatter(logging.Formatter("%(created).6f %(message)s"))
    wake = logging.getLogger("prefect_volcano.wake")
    wake.addHandler(handler)
    wake.setLevel(logging.DEBUG)

@flow
def volcano_line():
    log_wakes()
    gate("volcano")
    volcano_hold()

@task
def limit_hold():
    with concurrency(os.environ["BENCH_FLEET_LIMIT"], occupy=1):
        record("limit", "enter")
        time.sleep(HOLD)
        record("limit", "exit")

@flow
def limit_line():
    gate("limit")
    limit_hold()
"""


@contextlib.contextmanager
def _postgres_database() -> Iterator[str]:
    """A database of this run's own on the local PostgreSQL (SQLite answers 503 under 50 runs' start)."""
    import psycopg

    name = f"bench_prefect_{uuid.uuid4().hex[:10]}"
    admin = os.environ.get("BENCH_PG_ADMIN_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    host = admin.rsplit("/", 1)[0].replace("postgresql://", "postgresql+asyncpg://", 1)
    try:
        yield f"{host}/{name}"
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _sections(path: Path) -> list[dict[str, float]]:
    runs: dict[str, dict[str, float]] = {}
    for row in path.read_text().splitlines() if path.exists() else []:
        what, who, at = row.split()
        runs.setdefault(who, {})[what] = float(at)
    return sorted((r for r in runs.values() if "enter" in r and "exit" in r), key=lambda r: r["enter"])


def _p90(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=10, method="inclusive")[-1] if len(samples) > 1 else samples[0]


def _one(
    client: Any, deployment_id: uuid.UUID, mode: str, runs: int, hold: float, workdir: Path, bound: float
) -> dict[str, Any]:
    submitted = time.time()
    ids = [client.create_flow_run_from_deployment(deployment_id).id for _ in range(runs)]

    def ended() -> list[Any]:
        for attempt in range(5):  # a busy server may answer 5xx for a while: the bench asks again
            try:
                found = client.read_flow_runs(
                    flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)), limit=runs
                )
                break
            except PrefectHTTPStatusError as exc:
                if exc.response.status_code < 500 or attempt == 4:
                    raise
                time.sleep(2.0)
        return [r for r in found if r.state is not None and r.state.is_final()]

    ends = time.monotonic() + bound
    ready = workdir / f"{mode}.sections"
    for look in itertools.count():  # every run's process is up and at the gate, or ended before it
        at_gate = ready.read_text().count("ready ") if ready.exists() else 0
        if at_gate >= runs or time.monotonic() > ends:
            break
        # A run that crashed while it started (the Prefect server answering 500 under 50 starts) never
        # comes to the gate: the line goes without it, and it counts as not Completed.
        if look % 10 == 9 and at_gate + len(ended()) >= runs:
            break
        time.sleep(0.5)
    up = time.time()
    (workdir / f"{mode}.go").touch()
    drained_by = time.monotonic() + runs * hold * 6 + 120
    while True:
        final = ended()
        if len(final) == runs or time.monotonic() > drained_by:
            break
        time.sleep(1.0)
    sections = _sections(workdir / f"{mode}.sections")
    handoffs = [b["enter"] - a["exit"] for a, b in itertools.pairwise(sections)]
    completed = sum(1 for r in final if r.state is not None and r.state.is_completed())
    return {
        "mode": mode,
        "runs": runs,
        "holds": len(sections),
        "failed": runs - completed,
        "drain": sections[-1]["exit"] - up if sections else float("nan"),
        "up": up - submitted,
        "ideal": runs * hold,
        "handoffs": handoffs,
        "overlap": any(h < 0 for h in handoffs),
    }


def line(runs: int, hold: float, workers: int) -> list[dict[str, Any]]:
    """Run the line with `locked_task`, then with Prefect's concurrency limit, on one pool; the figures."""
    # SIGTERM (a timeout, a kill by pid) unwinds like Ctrl-C: the workers, the servers and the database go.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    workdir = Path(tempfile.mkdtemp(prefix="bench-prefect-line-"))
    (workdir / "fleet_flows.py").write_text(textwrap.dedent(_FLOWS))
    key, limit = f"bench-line-{uuid.uuid4().hex[:8]}", f"bench-line-{uuid.uuid4().hex[:8]}"
    from tests.support.prefect_pool import process_pool  # the suite's server, pool and workers

    rows = []
    with _postgres_database() as database_url, LocalServer(admin=True, quota=600) as volcano:
        env = dict(
            volcano.env(),
            PREFECT_LOGGING_LEVEL="WARNING",
            BENCH_FLEET_DIR=str(workdir),
            BENCH_FLEET_HOLD=str(hold),
            BENCH_FLEET_KEY=key,
            BENCH_FLEET_TTL=str(TTL),
            BENCH_FLEET_LIMIT=limit,
            PYTHONPATH=os.pathsep.join(
                filter(None, [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH")])
            ),
        )
        server = {
            "database_url": database_url,
            "start_timeout": 900,
            "log": workdir / "server.log",
            "extra_env": SERVER_POOL,
        }
        with process_pool(workdir, env, pool=POOL, workers=workers, server=server) as pool:
            pool.client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=limit, limit=1))
            deployments = {
                mode: pool.deploy(f"{mode}-line", f"fleet_flows.py:{mode}_line", workdir) for mode in MODES
            }
            for mode in MODES:
                volcano.clear_requests()
                row = _one(
                    pool.client, deployments[mode], mode, runs, hold, workdir, bound=runs * hold * 6 + 600
                )
                if mode == "volcano":
                    calls = [r for r in volcano.requests() if r.get("op") is not None]
                    (workdir / "requests.json").write_text(json.dumps(calls, default=str))
                    row["requests"] = len(calls)
                    row["by_op"] = dict(collections.Counter(f"{r['op']} {r.get('served')}" for r in calls))
                rows.append(row)
    print(f"(flows, sections, worker and server logs in {workdir})", file=sys.stderr)
    return rows


def print_line(rows: list[dict[str, Any]], runs: int, hold: float, workers: int) -> None:
    """The fleet table."""
    print(
        f"3. a line of {runs} runs of one deployment, each holding one lock {hold:g} s, created at once on a"
        f" process work pool ({workers} workers, `prefect server start` on PostgreSQL), all let go at once\n"
    )
    print(
        "| lock | drain s (ideal) | drain / ideal | runs up after s | handoff median s | p90 s | max s |"
        " bodies overlapped | lock requests per hold | runs not Completed |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |")
    for r in rows:
        name = "`locked_task` (ttl 15)" if r["mode"] == "volcano" else "Prefect `concurrency(limit 1)`"
        hs = r["handoffs"] or [float("nan")]
        per_hold = f"{r['requests'] / max(r['holds'], 1):.2f}" if "requests" in r else "n/a (Prefect API)"
        print(
            f"| {name} | {r['drain']:.1f} ({r['ideal']:.0f}) | {r['drain'] / r['ideal']:.2f}x"
            f" | {r['up']:.0f}"
            f" | {statistics.median(hs):.2f} | {_p90(hs):.2f} | {max(hs):.2f}"
            f" | {'YES' if r['overlap'] else 'no'} | {per_hold} | {r['failed']} of {r['runs']} |"
        )
    for r in rows:
        if "by_op" in r:
            ops = ", ".join(f"{op}: {n}" for op, n in sorted(r["by_op"].items()))
            print(f"\nlock requests by operation and answer (`locked_task`): {ops}")
