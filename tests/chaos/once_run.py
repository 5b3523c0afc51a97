"""The run-once chaos run: thousands of duplicate attempts over a few hundred business keys, with faults.

Every business key gets about ``attempts / keys`` attempts, queued next to each other so that several
workers take the same key at once (concurrent duplicates). Faults, from a seeded plan:

- **killed**: the attempt's process kills itself (SIGKILL) right after its effect committed, before it
  reports; a new process takes its place and the attempt is retried (a retry after commit);
- **stale**: the attempt stops itself once it holds the lock (the parent SIGSTOPs it) past its lease; a
  duplicate of its key is queued meanwhile, and the process is resumed (SIGCONT) to write as a stale holder.

The same plan runs in four modes, side by side:

- ``ledger/sql``: ``with_lock(once=SQLLedger.once(key))`` and the effect through ``guard.once.begin()``
  (PostgreSQL); ``ledger/s3``: the same with ``S3Ledger`` (a fenced prefix per key, moto's server);
- ``lock/sql``: the lock alone, no ledger, no fence: a user who relies on the lock;
- ``prefect-limit/sql``: Prefect's global concurrency limit (one per key, limit 1) instead of the lock.

What is counted, from the stores afterwards (never from what the workers claim): effects per key
(rows, or publications accepted), duplicate effects (effects beyond one per key), stale writes (an
effect committed under a fencing token lower than one its key had already accepted, found in commit
order), and whether the ledger agrees with the data (one record per key, with the token of its one
effect). Run it: ``.venv-prefect/bin/python -m tests.chaos.once_run --attempts 10000 --keys 300``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import random
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from tests.fencing.s3_server import MotoServer, client_for
from tests.support import pg_select
from volcano_locks.server.harness import LocalServer

MODES = ("ledger/sql", "ledger/s3", "lock/sql", "prefect-limit/sql")
TTL = 5  # the contract's shortest lease: a stopped holder lapses soon
PAUSE = TTL + 2.5  # how long a stale holder stays stopped: past its lease and the grace second
WORKERS = 24
"""Worker processes: an attempt mostly waits (for its key's lock, behind its duplicates), so 24 keep two cores
busy (600 attempts over 60 keys, ledger/sql: 96 s with 6 workers, 30 s with 24)."""


@dataclass(frozen=True)
class Attempt:
    """One attempt: its id, the business key's index, and its fault (``""``, ``"killed"``, ``"stale"``)."""

    id: int
    key: int
    fault: str = ""


def make_plan(
    attempts: int, keys: int, seed: int, kill_rate: float, stale_rate: float, burst_rate: float = 0.2
) -> list[Attempt]:
    """The attempts in queue order, about ``attempts`` of them.

    Rounds: each round takes every key once, in a shuffled order, so a key comes back about ``keys``
    attempts later (a re-run, a backfill); in each round a key is, with ``burst_rate``, taken three times
    in a row (concurrent duplicates: the workers take them at once). The first round's attempts do the
    effects, so the faults go there: a key's first attempt is killed after its commit with
    ``kill_rate``, stopped past its lease with ``stale_rate``.
    """
    rng = random.Random(seed)
    plan: list[Attempt] = []
    first = True
    while len(plan) < attempts:
        order = list(range(keys))
        rng.shuffle(order)
        for k in order:
            if len(plan) >= attempts:
                break
            fault = ""
            if first:
                roll = rng.random()
                fault = "killed" if roll < kill_rate else "stale" if roll < kill_rate + stale_rate else ""
            for _ in range(3 if rng.random() < burst_rate else 1):
                plan.append(Attempt(len(plan), k, fault))
        first = False
    return plan[:attempts] if len(plan) > attempts else plan


@dataclass
class Counts:
    """What one mode's run left in its store."""

    mode: str
    attempts: int = 0
    keys: int = 0
    effects: int = 0
    duplicate_effects: int = 0
    keys_without_effect: int = 0
    stale_writes: int = 0
    ledger_agrees: bool | None = None
    kills: int = 0
    stops: int = 0
    seconds: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)


# -- the worker processes -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Setup:
    """What every worker of a mode needs (picklable)."""

    mode: str
    run: str
    api_url: str
    service_key: str = field(repr=False)
    db_url: str
    s3_url: str
    bucket: str


def lock_key(setup: Setup, k: int) -> str:
    return f"once-{setup.run}-{k}"


def business_key(k: int) -> str:
    return f"rollup:{k}"


def effects_table(setup: Setup) -> sa.Table:
    """The user's table: one row per effect, with the fencing token it was done under (0: none)."""
    return sa.Table(
        f"once_chaos_{setup.run}_effects",
        sa.MetaData(),
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("business_key", sa.String(64), nullable=False),
        sa.Column("fencing_token", sa.BigInteger, nullable=False),
    )


def _next(urgent: Any, todo: Any) -> Attempt | None:
    """The next attempt: a duplicate queued behind a stopped holder first, then the plan's."""
    while True:
        try:
            return urgent.get_nowait()  # type: ignore[no-any-return]
        except queue.Empty:
            pass
        try:
            return todo.get(timeout=0.1)  # type: ignore[no-any-return]
        except queue.Empty:
            continue


def _worker(setup: Setup, todo: Any, urgent: Any, events: Any, resume: Any) -> None:  # a forked process
    from volcano_locks import VolcanoLocks
    from volcano_locks.fencing import FencedS3Prefix, FencedSQL
    from volcano_locks.once import S3Ledger, SQLLedger, Who

    engine = sa.create_engine(setup.db_url, pool_size=2)
    table = effects_table(setup)
    # The run's own guard table: the business keys repeat from run to run, and a guard row left by an
    # earlier run (another lock server, higher tokens) would refuse this run's every write as stale.
    fenced = FencedSQL(engine, guard_table=f"once_chaos_{setup.run}_guard")
    ledger = SQLLedger(fenced, table=f"once_chaos_{setup.run}_ledger")
    s3 = client_for(setup.s3_url) if setup.mode == "ledger/s3" else None
    pid = os.getpid()

    def stop_here(attempt: Attempt) -> None:
        events.put(("stop", attempt.id, pid))
        resume.wait()  # the parent stops this process, then sets this once it resumed it
        resume.clear()

    def effect(conn: Any, k: int, token: int) -> None:
        conn.execute(sa.insert(table).values(business_key=business_key(k), fencing_token=token))

    with VolcanoLocks(setup.api_url, service_key=setup.service_key, timeout=10.0) as locks:
        while True:
            attempt = _next(urgent, todo)
            if attempt is None:
                return
            events.put(("start", attempt.id, pid))
            k = attempt.key
            outcome = "done"
            try:
                if setup.mode.startswith("ledger/"):
                    who = Who.of("python", worker=pid, attempt=attempt.id)
                    once: Any
                    if s3 is not None:
                        prefix = FencedS3Prefix(s3, setup.bucket, f"once/{setup.run}/{k}")
                        once = S3Ledger(prefix).once(business_key(k), who=who)
                    else:
                        once = ledger.once(business_key(k), who=who)
                    with locks.with_lock(
                        lock_key(setup, k), TTL, on_contention="wait", wait_timeout=120, once=once
                    ) as guard:
                        if guard.duplicate is not None:
                            outcome = "duplicate"
                        else:
                            if attempt.fault == "stale":
                                stop_here(attempt)
                            if s3 is not None:
                                guard.once.publish({"part-0": b"x"}, result={"attempt": attempt.id})
                            else:
                                with guard.once.begin() as done:
                                    effect(done.connection, k, guard.fencing_token or 0)
                                    done.result = {"attempt": attempt.id}
                elif setup.mode == "lock/sql":
                    with locks.with_lock(
                        lock_key(setup, k), TTL, on_contention="wait", wait_timeout=120
                    ) as g:
                        if attempt.fault == "stale":
                            stop_here(attempt)
                        with engine.begin() as conn:
                            effect(conn, k, g.fencing_token or 0)
                else:
                    from prefect.concurrency.sync import concurrency

                    with concurrency(lock_key(setup, k), occupy=1, strict=True, timeout_seconds=120):
                        if attempt.fault == "stale":
                            stop_here(attempt)
                        with engine.begin() as conn:
                            effect(conn, k, 0)
            except Exception as exc:
                outcome = type(exc).__name__
            if attempt.fault == "killed" and outcome == "done":
                # The queue's feeder thread sends in the background: flush what this worker already
                # reported (its "start" above, the "end" of its previous attempt), or the parent never
                # learns of them and waits for attempts nobody will do.
                events.close()
                events.join_thread()
                os.kill(pid, signal.SIGKILL)  # the effect committed, the lock is released: no report
            events.put(("end", attempt.id, outcome))


# -- the parent --------------------------------------------------------------------------------------


class Fleet:
    """The worker processes of one mode, the queue they share, and the faults the parent injects."""

    def __init__(self, setup: Setup, plan: list[Attempt], workers: int) -> None:
        self.ctx = mp.get_context("fork")
        self.setup = setup
        self.plan = {a.id: a for a in plan}
        self.todo = self.ctx.Queue()
        self.urgent = self.ctx.Queue()
        self.events = self.ctx.Queue()
        for attempt in plan:
            self.todo.put(attempt)
        self.procs: dict[int, tuple[Any, Any]] = {}  # pid -> (process, its resume event)
        self.running: dict[int, int] = {}  # pid -> attempt id in flight
        self.pending = len(plan)
        self.kills = 0
        self.stops: list[tuple[float, int]] = []  # (resume at, pid)
        self.stopped = 0
        self.outcomes: dict[str, int] = {}
        for _ in range(workers):
            self._spawn()

    def _spawn(self) -> None:
        resume = self.ctx.Event()
        proc = self.ctx.Process(
            target=_worker, args=(self.setup, self.todo, self.urgent, self.events, resume), daemon=True
        )
        proc.start()
        assert proc.pid is not None
        self.procs[proc.pid] = (proc, resume)

    def run(self, deadline: float) -> None:
        while self.pending > 0:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.setup.mode}: {self.pending} attempts left at the deadline")
            self._resume_due()
            try:
                event = self.events.get(timeout=0.2)
            except queue.Empty:
                self._reap()
                continue
            kind, attempt_id, detail = event
            if kind == "start":
                self.running[detail] = attempt_id
            elif kind == "end":
                self.pending -= 1
                self.outcomes[detail] = self.outcomes.get(detail, 0) + 1
                self.running = {p: a for p, a in self.running.items() if a != attempt_id}
            elif kind == "stop":
                os.kill(detail, signal.SIGSTOP)
                self.stopped += 1
                self.stops.append((time.monotonic() + PAUSE, detail))
                # A duplicate of its key, to be done by a newer holder while this one is stopped.
                again = Attempt(max(self.plan) + 1, self.plan[attempt_id].key)
                self.plan[again.id] = again
                self.pending += 1
                self.urgent.put(again)
        for _ in self.procs:
            self.todo.put(None)
        for proc, _ in self.procs.values():
            proc.join(30)

    def _resume_due(self) -> None:
        now = time.monotonic()
        for due in [s for s in self.stops if s[0] <= now]:
            self.stops.remove(due)
            pid = due[1]
            os.kill(pid, signal.SIGCONT)
            self.procs[pid][1].set()

    def _reap(self) -> None:
        """Replace a killed worker; its attempt in flight is queued again (the retry after its commit)."""
        for pid, (proc, _) in list(self.procs.items()):
            if proc.is_alive():
                continue
            proc.join()
            del self.procs[pid]
            self.kills += 1
            attempt_id = self.running.pop(pid, None)
            if attempt_id is not None:
                original = self.plan[attempt_id]
                self.urgent.put(Attempt(original.id, original.key))  # the retry: no fault this time
            self._spawn()


def count(setup: Setup, keys: int, counts: Counts) -> None:
    """Read the effects (and the ledger) back from the stores."""
    per_key: dict[int, list[int]] = {k: [] for k in range(keys)}
    records: dict[int, int] = {}
    if setup.mode == "ledger/s3":
        s3 = client_for(setup.s3_url)
        from volcano_locks.fencing import FencedS3Prefix

        for k in range(keys):
            manifest = FencedS3Prefix(s3, setup.bucket, f"once/{setup.run}/{k}").current()
            if manifest is None:
                continue
            # Every accepted publish made a generation; its lineage names each with its token.
            tokens = [p.fencing_token for p in reversed(manifest.previous)] + [manifest.fencing_token]
            per_key[k] = tokens
            body = manifest.once.get(business_key(k))
            if body is not None:
                records[k] = int(body["fencing_token"])
    else:
        engine = sa.create_engine(setup.db_url)
        table = effects_table(setup)
        with engine.connect() as conn:
            for row in conn.execute(sa.select(table).order_by(table.c.id)):
                per_key[int(row.business_key.split(":")[1])].append(int(row.fencing_token))
        if setup.mode == "ledger/sql":
            from volcano_locks.once import SQLLedger

            ledger = SQLLedger(engine, table=f"once_chaos_{setup.run}_ledger")
            for record in ledger.records(limit=100_000):
                records[int(record.business_key.split(":")[1])] = record.fencing_token
        engine.dispose()
    counts.keys = keys
    counts.effects = sum(len(t) for t in per_key.values())
    counts.duplicate_effects = sum(max(0, len(t) - 1) for t in per_key.values())
    counts.keys_without_effect = sum(1 for t in per_key.values() if not t)
    counts.stale_writes = sum(
        1 for tokens in per_key.values() for i, t in enumerate(tokens) if t and t < max(tokens[:i], default=0)
    )
    if setup.mode.startswith("ledger/"):
        counts.ledger_agrees = all(
            len(per_key[k]) == 1 and records.get(k) == per_key[k][0] for k in per_key
        ) and (len(records) == keys)


def run_mode(
    mode: str, plan: list[Attempt], keys: int, env: Environment, workers: int, timeout: float
) -> Counts:
    """Run ``plan`` in ``mode`` and count what it left."""
    run = uuid.uuid4().hex[:8]
    setup = Setup(mode, run, env.server.url, env.server.service_key, env.db_url, env.s3.url, env.bucket)
    engine = sa.create_engine(env.db_url)
    effects_table(setup).create(engine)
    engine.dispose()
    if mode == "prefect-limit/sql":
        env.prefect_limits([lock_key(setup, k) for k in range(keys)])
    started = time.monotonic()
    fleet = Fleet(setup, plan, workers)
    fleet.run(started + timeout)
    counts = Counts(mode, attempts=len(fleet.plan), kills=fleet.kills, stops=fleet.stopped)
    counts.seconds = time.monotonic() - started
    counts.errors = {k: v for k, v in fleet.outcomes.items() if k not in ("done", "duplicate")}
    count(setup, keys, counts)
    return counts


class Environment:
    """The lock server, PostgreSQL, the S3-compatible server and (for its mode) a Prefect API."""

    def __init__(self, stack: ExitStack, db_url: str, workdir: Path, modes: tuple[str, ...]) -> None:
        self.db_url = db_url
        self.server = stack.enter_context(
            LocalServer(db=str(workdir / "locks.sqlite3"), quota=0, log_requests=False, startup_timeout=60.0)
        )
        self.s3 = MotoServer(log=workdir / "moto.log").start(timeout=180)  # a loaded machine starts it slowly
        stack.callback(self.s3.stop)
        self.bucket = self.s3.bucket()
        self._stack = stack
        self._prefect = False

    def prefect_limits(self, names: list[str]) -> None:
        """Start a Prefect API (once, when its mode comes) and make one concurrency limit per key."""
        from prefect.client.orchestration import get_client

        if not self._prefect:
            os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")  # no telemetry calls out
            from prefect.testing.utilities import prefect_test_harness

            self._stack.enter_context(prefect_test_harness(server_startup_timeout=600))  # a loaded machine
            self._prefect = True
        from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate

        with get_client(sync_client=True) as client:
            for name in names:
                client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))


@contextmanager
def environment(modes: tuple[str, ...], dsn: str | None = None) -> Iterator[Environment]:
    """Start what the modes need; PostgreSQL as the suite chooses it (``tests.support.pg_select``)."""
    if dsn is None:
        choice = pg_select.choose(
            os.environ, pg_select.local_probe, lambda: pg_select.Probe(None, "not tried")
        )
        if choice.dsn is None:
            raise RuntimeError(f"the run-once chaos run needs PostgreSQL: {choice.reason}")
        dsn = choice.dsn
    db_url = "postgresql+psycopg://" + dsn.split("://", 1)[1]
    with tempfile.TemporaryDirectory(prefix="once-chaos-") as tmp, ExitStack() as stack:
        yield Environment(stack, db_url, Path(tmp), modes)


def table(results: list[Counts]) -> str:
    """The side-by-side table."""
    head = (
        "| mode | attempts | keys | killed after commit | stopped past lease | effects | duplicate effects "
        "| stale writes | ledger = data | seconds |"
    )
    rows = [head, "| " + " | ".join(["---"] * 10) + " |"]
    for c in results:
        agrees = "n/a" if c.ledger_agrees is None else "yes" if c.ledger_agrees else "NO"
        stale = "n/a (no token)" if c.mode.startswith("prefect") else str(c.stale_writes)
        rows.append(
            f"| {c.mode} | {c.attempts} | {c.keys} | {c.kills} | {c.stops} | {c.effects} "
            f"| {c.duplicate_effects} | {stale} | {agrees} | {c.seconds:.0f} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    """Run every mode on one plan and print the table; exit 1 if a ledger mode did not hold."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attempts", type=int, default=10_000)
    parser.add_argument("--keys", type=int, default=300)
    parser.add_argument("--seed", type=int, default=31)
    parser.add_argument("--workers", type=int, default=WORKERS)
    parser.add_argument("--kill-rate", type=float, default=0.25, help="of the keys' first attempts")
    parser.add_argument("--stale-rate", type=float, default=0.04, help="of the keys' first attempts")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma list of {', '.join(MODES)}")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per mode")
    args = parser.parse_args(argv)
    modes = tuple(m for m in args.modes.split(",") if m)
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"unknown mode {unknown[0]!r}: expected {', '.join(MODES)}")
    plan = make_plan(args.attempts, args.keys, args.seed, args.kill_rate, args.stale_rate)
    print(
        f"run-once chaos: {len(plan)} attempts over {args.keys} keys, {args.workers} workers, "
        f"seed {args.seed}, {sum(a.fault == 'killed' for a in plan)} killed after commit, "
        f"{sum(a.fault == 'stale' for a in plan)} stopped past their lease",
        flush=True,
    )
    results = run_all(plan, args.keys, modes, args.workers, args.timeout)
    print(table(results))
    return 0 if all(held(c) for c in results if c.mode.startswith("ledger/")) else 1


def run_all(
    plan: list[Attempt],
    keys: int,
    modes: tuple[str, ...],
    workers: int,
    timeout: float,
    dsn: str | None = None,
) -> list[Counts]:
    """Run ``plan`` in each mode, one after the other, in one environment."""
    results = []
    with environment(modes, dsn) as env:
        for mode in modes:
            counts = run_mode(mode, plan, keys, env, workers, timeout)
            print(
                f"{mode}: {counts.seconds:.0f} s, outcomes other than done/duplicate: {counts.errors}",
                flush=True,
            )
            print(table([counts]).splitlines()[-1], flush=True)  # its row now: later modes may be slow
            results.append(counts)
    return results


def held(c: Counts) -> bool:
    """Whether a ledger mode did each key's effect exactly once, with no stale write, ledger = data."""
    return (
        c.duplicate_effects == 0
        and c.stale_writes == 0
        and bool(c.ledger_agrees)
        and c.keys_without_effect == 0
    )


if __name__ == "__main__":
    sys.exit(main())
