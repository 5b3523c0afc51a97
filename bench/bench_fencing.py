"""Fenced-write benchmark: what fencing adds to a write, in statements or requests and in time.

For each store, the same write plain and fenced, interleaved so machine noise falls on both alike:

- SQL (FencedSQL, SQLite file and PostgreSQL at 127.0.0.1:5432/test if it answers): the user's write is
  one transaction of two statements (an UPDATE of the day's total, an INSERT of a detail row); fenced, the
  guard's conditional upsert comes first. Statements are counted with SQLAlchemy's
  ``before_cursor_execute`` event (BEGIN/COMMIT are not statements there; they are the same in both).
- S3 (FencedS3Prefix, moto's server as its own process on loopback): the user's write is N ``PutObject``
  of the data; fenced, it is a publish: read the manifest, the N uploads under a fresh version, the
  conditional manifest swap. Requests are counted with botocore's ``before-send`` event.
- A refused write (a stale token) on each: what refusing costs.

    python bench/bench_fencing.py            # 200 SQL / 100 S3 iterations
    python bench/bench_fencing.py --quick    # 40 / 20
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.fencing.s3_server, from the repo root

from tests.fencing.s3_server import MotoServer
from volcano_locks.fencing import Fence, FencedS3Prefix, FencedSQL, StaleFencingToken

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


def bench_sql(url: str, n: int) -> dict[str, tuple[float, float, float]]:
    engine = sa.create_engine(url)
    name = f"bench_{uuid.uuid4().hex[:8]}"
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
    md.create_all(engine)
    fenced = FencedSQL(engine, guard_table=f"{name}_guard")
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

    def fenced_write() -> None:
        with fenced.begin("day:d", Fence(KEY, 10)) as conn:
            statements(conn)

    def stale() -> None:
        with fenced.begin("day:d", Fence(KEY, 9)) as conn:
            statements(conn)

    try:
        return _measure(
            n, counter, {"plain": plain, "fenced": fenced_write, "refused (stale token)": _refused(stale)}
        )
    finally:
        sa.event.remove(engine, "before_cursor_execute", counter.hit)
        md.drop_all(engine)
        fenced.table.drop(engine)
        engine.dispose()


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python bench/bench_fencing.py", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer iterations (same rows)")
    args = p.parse_args(argv)
    n_sql, n_s3 = (40, 20) if args.quick else (200, 100)
    rows: list[tuple[str, str, tuple[float, float, float], float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        targets = [("SQLite file", f"sqlite:///{Path(tmp) / 'bench.sqlite3'}")]
        try:
            with sa.create_engine(PG_URL).connect() as conn:
                conn.execute(sa.text("SELECT 1"))
            targets.append(("PostgreSQL (loopback)", PG_URL))
        except Exception as exc:
            print(f"(PostgreSQL skipped: {type(exc).__name__})")
        for label, url in targets:
            got = bench_sql(url, n_sql)
            rows += [(f"SQL, {label}", name, got[name], got["plain"][0]) for name in got]
    with MotoServer() as server:
        for files in (1, 4):
            got = bench_s3(server, n_s3, files)
            rows += [(f"S3 (moto), {files} file(s)", name, got[name], got["plain"][0]) for name in got]
    print(f"\n### fenced writes: cost per write ({n_sql} SQL / {n_s3} S3 iterations, interleaved)\n")
    print("| store | write | statements or requests | added by fencing | median ms | p99 ms |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for store, name, (sent, median, p99), plain in rows:
        added = f"{sent - plain:+g}" if name == "fenced" else ""  # a refusal runs none of the user's write
        print(f"| {store} | {name} | {sent:g} | {added} | {median:.2f} | {p99:.2f} |")
    print("\nSQL counts statements (BEGIN/COMMIT excluded, the same in both); S3 counts HTTP requests.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
