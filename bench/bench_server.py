"""Throughput of the local locks server: acquire+release pairs per second over keep-alive HTTP.

Starts `volcano-locks serve` (SQLite in a temp dir, and PostgreSQL if reachable) and drives it with
1 and 8 client threads, each with its own httpx.Client (one keep-alive connection) and its own key.
Prints a markdown table. Usage:

    .venv-prefect/bin/python bench/bench_server.py [--seconds 3] [--threads 1,8] [--no-postgres]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
import uuid

import httpx

from volcano_locks.server.harness import LocalServer

PG_DSN = "postgresql://postgres@127.0.0.1:5432/test"


def pg_reachable(dsn: str) -> bool:
    try:
        import psycopg

        with psycopg.connect(dsn, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
        return True
    except Exception:
        return False


def cpu_seconds(pid: int) -> float:
    """User+system CPU seconds a process has used so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def drive(url: str, key: str, threads: int, seconds: float) -> tuple[int, list[float]]:
    """Run `threads` clients for `seconds`; return completed pairs and per-pair latencies (s)."""
    stop = threading.Event()
    latencies: list[list[float]] = [[] for _ in range(threads)]
    errors: list[str] = []

    def client(i: int) -> None:
        lock = f"bench-{uuid.uuid4().hex[:8]}-{i}"
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as http:
            while not stop.is_set():
                token = str(uuid.uuid4())
                t0 = time.perf_counter()
                a = http.post(
                    f"/locks/{lock}/lease",
                    json={"ttl_seconds": 30},
                    headers={"X-Volcano-Lock-Token": token, "X-Volcano-Request-Id": str(uuid.uuid4())},
                )
                r = http.delete(
                    f"/locks/{lock}/lease",
                    headers={"X-Volcano-Lock-Token": token, "X-Volcano-Request-Id": str(uuid.uuid4())},
                )
                latencies[i].append(time.perf_counter() - t0)
                if a.status_code != 201 or r.status_code != 204:
                    errors.append(f"{a.status_code}/{r.status_code}")
                    return

    workers = [threading.Thread(target=client, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    time.sleep(seconds)
    stop.set()
    for w in workers:
        w.join()
    if errors:
        raise RuntimeError(f"unexpected statuses: {errors[:3]}")
    flat = [x for lat in latencies for x in lat]
    return len(flat), flat


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="measuring time per row")
    parser.add_argument("--threads", default="1,8", help="comma-separated client thread counts")
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--pg-dsn", default=PG_DSN)
    args = parser.parse_args()
    thread_counts = [int(t) for t in args.threads.split(",")]

    storages = [("SQLite", None)]
    schema = f"vl_bench_{uuid.uuid4().hex[:10]}"
    if not args.no_postgres:
        if pg_reachable(args.pg_dsn):
            storages.append(("PostgreSQL", f"{args.pg_dsn}?schema={schema}"))
        else:
            print(f"(PostgreSQL not reachable at {args.pg_dsn}; SQLite only)", file=sys.stderr)

    rows = []
    for name, db in storages:
        for log_requests in (True, False):
            with LocalServer(db=db, quota=0, log_requests=log_requests) as srv:
                drive(srv.url, srv.service_key, 1, 0.3)  # warm-up
                for threads in thread_counts:
                    assert srv.proc is not None
                    cpu0, client0 = cpu_seconds(srv.proc.pid), time.process_time()
                    pairs, lat = drive(srv.url, srv.service_key, threads, args.seconds)
                    cpu_us = (cpu_seconds(srv.proc.pid) - cpu0) / max(1, 2 * pairs) * 1e6
                    client_us = (time.process_time() - client0) / max(1, 2 * pairs) * 1e6
                    rate = pairs / args.seconds
                    lat_ms = sorted(x * 1000 for x in lat)
                    p99 = lat_ms[min(len(lat_ms) - 1, int(len(lat_ms) * 0.99))]
                    rows.append(
                        (name, "on" if log_requests else "off", threads, rate, 2 * rate,
                         statistics.median(lat_ms), p99, cpu_us, client_us)
                    )  # fmt: skip
    if any(db for _, db in storages):
        import psycopg

        from volcano_locks.server.store_postgres import split_schema

        base, _ = split_schema(storages[-1][1] or "")
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

    print(f"Server throughput: acquire+release pairs over keep-alive HTTP/1.1 ({args.seconds:g} s per row)\n")
    load = os.getloadavg()[0]
    print(f"Machine: {os.cpu_count()} CPUs, load average {load:.1f} at the end (clients share the machine)\n")
    header = ["storage", "request log", "client threads", "pairs/s", "requests/s", "pair p50 ms"]
    header += ["pair p99 ms", "server CPU µs/request", "client CPU µs/request"]
    print("| " + " | ".join(header) + " |")
    print("| --- | --- |" + " ---: |" * (len(header) - 2))
    for name, log, threads, rate, ops, p50, p99, cpu_us, client_us in rows:
        cells = [name, log, str(threads), f"{rate:,.0f}", f"{ops:,.0f}", f"{p50:.2f}", f"{p99:.2f}"]
        cells += [f"{cpu_us:,.0f}", f"{client_us:,.0f}"]
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
