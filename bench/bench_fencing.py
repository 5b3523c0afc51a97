"""Fenced-write benchmark: what fencing adds to a write, in statements or requests and in time.

For each store, the same write plain and fenced, interleaved so machine noise falls on both alike:

- SQL (FencedSQL, SQLite file and PostgreSQL at 127.0.0.1:5432/test if it answers, through psycopg 3 and
  psycopg2; AsyncFencedSQL through aiosqlite and asyncpg): the user's write is one transaction of two
  statements (an UPDATE of the day's total, an INSERT of a detail row); fenced, the guard's conditional
  upsert comes first. Statements are counted with SQLAlchemy's ``before_cursor_execute`` event
  (BEGIN/COMMIT are not statements there; they are the same in both).
- The first use: a new FencedSQL (a new run's, on a guard table that exists) for the write, beside what
  each new FencedSQL paid before this round (a transaction of its own making sure of the table first:
  ``create_guard_table()``, then the write); and a new FencedTable per write beside a reused one.
- S3 (FencedS3Prefix, moto's server as its own process on loopback): the user's write is N ``PutObject``
  of the data; fenced, it is a publish: read the manifest, the N uploads under a fresh version, the
  conditional manifest swap. Requests are counted with botocore's ``before-send`` event.
- A refused write (a stale token) on each: what refusing costs.

    python bench/bench_fencing.py            # 200 SQL / 100 S3 iterations
    python bench/bench_fencing.py --quick    # 40 / 20
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.fencing.s3_server, from the repo root

from tests.fencing.s3_server import MotoServer
from volcano_locks.fencing import (
    AsyncFencedSQL,
    Fence,
    FencedS3Prefix,
    FencedSQL,
    FencedTable,
    StaleFencingToken,
)

PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
KEY = "bench-fencing"


class Counter:
    """Counts what one operation sends: statements (SQLAlchemy) or HTTP requests (botocore)."""

    def __init__(self) -> None:
        self.n = 0

    def hit(self, *_: Any, **__: Any) -> None:
        self.n += 1


def _stats(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return statistics.median(ordered) * 1000, p99 * 1000


def _measure(
    n: int, counter: Counter, ops: dict[str, Callable[[], object]]
) -> dict[str, tuple[float, float, float]]:
    """Per op: (sent per call, median ms, p99 ms); ops interleaved, each warmed once."""
    for op in ops.values():
        op()
    times: dict[str, list[float]] = {name: [] for name in ops}
    sent: dict[str, int] = dict.fromkeys(ops, 0)
    for _ in range(n):
        for name, op in ops.items():
            before = counter.n
            start = time.perf_counter()
            op()
            times[name].append(time.perf_counter() - start)
            sent[name] += counter.n - before
    return {name: (sent[name] / n, *_stats(times[name])) for name in ops}


def _refused(call: Callable[[], object]) -> Callable[[], None]:
    def run() -> None:
        try:
            call()
        except StaleFencingToken:
            return
        raise AssertionError("the stale write was accepted")

    return run


def _user_tables(name: str) -> tuple[sa.MetaData, sa.Table, sa.Table]:
    md = sa.MetaData()
    totals = sa.Table(
        f"{name}_totals", md, sa.Column("day", sa.String(10), primary_key=True), sa.Column("n", sa.Integer)
    )
    details = sa.Table(
        f"{name}_details",
        md,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("day", sa.String(10)),
    )
    return md, totals, details


def bench_sql(url: str, n: int) -> dict[str, tuple[float, float, float]]:
    engine = sa.create_engine(url)
    name = f"bench_{uuid.uuid4().hex[:8]}"
    md, totals, details = _user_tables(name)
    md.create_all(engine)
    guard_table = f"{name}_guard"
    fenced = FencedSQL(engine, guard_table=guard_table)
    fenced.create_guard_table()
    with engine.begin() as conn:
        conn.execute(totals.insert().values(day="d", n=0))
    counter = Counter()
    sa.event.listen(engine, "before_cursor_execute", counter.hit)

    def statements(conn: sa.Connection) -> None:
        conn.execute(totals.update().where(totals.c.day == "d").values(n=totals.c.n + 1))
        conn.execute(details.insert().values(day="d"))

    def plain() -> None:
        with engine.begin() as conn:
            statements(conn)

    def fenced_write(using: FencedSQL = fenced, token: int = 10) -> None:
        with using.begin("day:d", Fence(KEY, token)) as conn:
            statements(conn)

    def first_use() -> None:
        fenced_write(FencedSQL(engine, guard_table=guard_table))

    def first_use_before() -> None:
        new = FencedSQL(engine, guard_table=guard_table)
        new.create_guard_table()
        fenced_write(new)

    try:
        return _measure(
            n,
            counter,
            {
                "plain": plain,
                "fenced": fenced_write,
                "fenced, first use (a new FencedSQL)": first_use,
                "fenced, first use as before (table made sure of first)": first_use_before,
                "refused (stale token)": _refused(lambda: fenced_write(token=9)),
            },
        )
    finally:
        sa.event.remove(engine, "before_cursor_execute", counter.hit)
        md.drop_all(engine)
        fenced.table.drop(engine)
        engine.dispose()


def bench_async_sql(url: str, n: int) -> dict[str, tuple[float, float, float]]:
    """The same writes through an asyncio engine and AsyncFencedSQL, timed inside one event loop."""

    async def run() -> dict[str, tuple[float, float, float]]:
        engine = create_async_engine(url)
        name = f"bench_{uuid.uuid4().hex[:8]}"
        md, totals, details = _user_tables(name)
        async with engine.begin() as conn:
            await conn.run_sync(md.create_all)
            await conn.execute(totals.insert().values(day="d", n=0))
        fenced = AsyncFencedSQL(engine, guard_table=f"{name}_guard")
        await fenced.create_guard_table()
        counter = Counter()
        sa.event.listen(engine.sync_engine, "before_cursor_execute", counter.hit)

        async def statements(conn: Any) -> None:
            await conn.execute(totals.update().where(totals.c.day == "d").values(n=totals.c.n + 1))
            await conn.execute(details.insert().values(day="d"))

        async def plain() -> None:
            async with engine.begin() as conn:
                await statements(conn)

        async def fenced_write(token: int = 10) -> None:
            async with fenced.begin("day:d", Fence(KEY, token)) as conn:
                await statements(conn)

        async def stale() -> None:
            try:
                await fenced_write(9)
            except StaleFencingToken:
                return
            raise AssertionError("the stale write was accepted")

        ops = {"plain": plain, "fenced": fenced_write, "refused (stale token)": stale}
        for op in ops.values():
            await op()
        times: dict[str, list[float]] = {name: [] for name in ops}
        sent = dict.fromkeys(ops, 0)
        for _ in range(n):
            for op_name, op in ops.items():
                before, start = counter.n, time.perf_counter()
                await op()
                times[op_name].append(time.perf_counter() - start)
                sent[op_name] += counter.n - before
        async with engine.begin() as conn:
            await conn.run_sync(md.drop_all)
            await conn.run_sync(fenced.table.drop)
        await engine.dispose()
        return {op_name: (sent[op_name] / n, *_stats(times[op_name])) for op_name in ops}

    return asyncio.run(run())


def bench_table(db: str, n: int) -> dict[str, tuple[float, float, float]]:
    """FencedTable (one conditional upsert and a history row per write): reused, and new per write."""
    name = f"bench_{uuid.uuid4().hex[:8]}"
    table = FencedTable(db, table=name)
    table.write("day:d", KEY, 10, "warm")
    counter = Counter()  # FencedTable talks to its driver directly: no statements counted here

    def write(using: FencedTable = table) -> None:
        using.write("day:d", KEY, 10, "v")

    try:
        return _measure(
            n,
            counter,
            {
                "fenced": write,
                "fenced, first use (a new FencedTable)": lambda: write(FencedTable(db, table=name)),
            },
        )
    finally:
        if db.startswith("postgresql"):
            import psycopg

            with psycopg.connect(db, autocommit=True) as conn:
                conn.execute(f"DROP TABLE IF EXISTS {name}, {name}_history")


def bench_s3(server: MotoServer, n: int, files: int) -> dict[str, tuple[float, float, float]]:
    client = server.client()
    bucket = server.bucket()
    counter = Counter()
    client.meta.events.register("before-send.s3", counter.hit)
    prefix = FencedS3Prefix(client, bucket, f"bench/{uuid.uuid4().hex[:8]}")
    data = {f"part-{i}.parquet": b"x" * 4096 for i in range(files)}

    def plain() -> None:
        for name, body in data.items():
            client.put_object(Bucket=bucket, Key=f"plain/{name}", Body=body)

    prefix.publish(Fence(KEY, 10), data)
    return _measure(
        n,
        counter,
        {
            "plain": plain,
            "fenced": lambda: prefix.publish(Fence(KEY, 10), data),
            "refused (stale token)": _refused(lambda: prefix.publish(Fence(KEY, 9), data)),
        },
    )


def _postgres_answers() -> bool:
    try:
        with sa.create_engine(PG_URL).connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    except Exception as exc:
        print(f"(PostgreSQL skipped: {type(exc).__name__})")
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python bench/bench_fencing.py", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer iterations (same rows)")
    args = p.parse_args(argv)
    n_sql, n_s3 = (40, 20) if args.quick else (200, 100)
    rows: list[tuple[str, str, tuple[float, float, float], float | None]] = []

    def add(store: str, got: dict[str, tuple[float, float, float]], counted: bool = True) -> None:
        rows.extend(
            (store, name, got[name], got["plain"][0] if counted and "plain" in got else None) for name in got
        )

    with tempfile.TemporaryDirectory() as tmp:
        lite = Path(tmp) / "bench.sqlite3"
        pg = _postgres_answers()
        pg_host = PG_URL.split("://", 1)[1]
        add("SQL, SQLite file (sqlite3)", bench_sql(f"sqlite:///{lite}", n_sql))
        add(
            "SQL, SQLite file (aiosqlite, AsyncFencedSQL)",
            bench_async_sql(f"sqlite+aiosqlite:///{lite}", n_sql),
        )
        if pg:
            add("SQL, PostgreSQL (psycopg 3)", bench_sql(PG_URL, n_sql))
            add("SQL, PostgreSQL (psycopg2)", bench_sql(f"postgresql+psycopg2://{pg_host}", n_sql))
            add(
                "SQL, PostgreSQL (asyncpg, AsyncFencedSQL)",
                bench_async_sql(f"postgresql+asyncpg://{pg_host}", n_sql),
            )
        add("FencedTable, SQLite file", bench_table(str(lite), n_sql), counted=False)
        if pg:
            add("FencedTable, PostgreSQL", bench_table(f"postgresql://{pg_host}", n_sql), counted=False)
    with MotoServer() as server:
        for files in (1, 4):
            add(f"S3 (moto), {files} file(s)", bench_s3(server, n_s3, files))
    print(f"\n### fenced writes: cost per write ({n_sql} SQL / {n_s3} S3 iterations, interleaved)\n")
    print("| store | write | statements or requests | added by fencing | median ms | p99 ms |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for store, name, (sent, median, p99), plain in rows:
        shown = f"{sent:g}" if plain is not None else "-"
        # A refusal runs none of the user's write: nothing "added" to compare.
        added = f"{sent - plain:+g}" if plain is not None and name.startswith("fenced") else ""
        print(f"| {store} | {name} | {shown} | {added} | {median:.2f} | {p99:.2f} |")
    print(
        "\nSQL counts statements (BEGIN/COMMIT excluded, the same in both; SQLite's PRAGMA catalog reads"
        " included); S3 counts HTTP requests; FencedTable talks to its driver directly (not counted)."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
