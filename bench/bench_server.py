"""Throughput of the local locks server: acquire+release pairs per second over keep-alive HTTP.

Starts `volcano-locks serve` (SQLite in a temp dir, and PostgreSQL if reachable) and drives it with
1 and 8 client threads, each with its own httpx.Client (one keep-alive connection) and its own key.
Prints a markdown table. Usage:

    .venv-prefect/bin/python bench/bench_server.py [--seconds 3] [--threads 1,8] [--no-postgres]
    .venv-prefect/bin/python bench/bench_server.py --compare-uvicorn
    .venv-prefect/bin/python bench/bench_server.py --abuse

`--abuse` replays the attacks of issue 14 at a smaller scale against `volcano-locks serve` and prints
the server's memory and CPU (run it from another checkout's directory to measure that checkout's server).

`--compare-uvicorn` measures the alternative the server did not take: the same LockApp as an ASGI app
under uvicorn (h11, `limit_concurrency`), against the stdlib server, on SQLite: throughput, and how long
an idle socket and a slowloris drip stay open.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx

from volcano_locks.server.harness import LocalServer, printed_variables

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.server.helpers, from the repository root

from tests.server.helpers import park_huge_heads

PG_DSN = "postgresql://postgres@127.0.0.1:5432/test"
# Longer than the server's idle (15 s) and request (10 s) timeouts, so the hold test shows them.
HOLD_SECONDS = 16


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


def _uvicorn_child(db: str, limit: int) -> None:
    """Serve LockApp as an ASGI app under uvicorn (the measured alternative), printing the URL, then ready."""
    import socket

    import anyio.to_thread
    import uvicorn

    from volcano_locks.server.app import Request
    from volcano_locks.server.backends import open_store
    from volcano_locks.server.runner import build_app

    app = build_app(open_store(db), os.environ["VOLCANO_LOCAL_SECRET"], quota=0, log_requests=False)

    async def asgi(scope: dict, receive, send) -> None:  # type: ignore[no-untyped-def]
        if scope["type"] != "http":
            return
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        req = Request(scope["method"], scope["raw_path"].decode("latin-1"), headers, body)
        resp = await anyio.to_thread.run_sync(app.handle, req)
        payload = b"" if resp.body is None else json.dumps(resp.body, separators=(",", ":")).encode()
        out = [(b"content-type", b"application/json")] if resp.body is not None else []
        if resp.status != 204:
            out.append((b"content-length", str(len(payload)).encode()))
        out += [(k.lower().encode(), v.encode()) for k, v in resp.headers.items()]
        await send({"type": "http.response.start", "status": resp.status, "headers": out})
        await send({"type": "http.response.body", "body": payload})

    # proto=IPPROTO_TCP, or asyncio leaves Nagle on for accepted sockets (40 ms per response here).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    print(f"VOLCANO_API_URL=http://127.0.0.1:{sock.getsockname()[1]}\nready", flush=True)
    config = uvicorn.Config(asgi, http="h11", lifespan="off", log_level="warning", limit_concurrency=limit)
    uvicorn.Server(config).run(sockets=[sock])


def _held_open(url: str, seconds: float) -> tuple[bool, bool]:
    """Open an idle socket and a slowloris (one header byte a second); is each still open after `seconds`?"""
    import socket

    host, port = url.rsplit("/", 1)[1].split(":")
    idle = socket.create_connection((host, int(port)))
    drip = socket.create_connection((host, int(port)))
    drip.sendall(b"GET /locks/x HTTP/1.1\r\nHost: x\r\n")
    deadline = time.monotonic() + seconds
    drip_open = True
    while time.monotonic() < deadline:
        if drip_open:
            try:
                drip.sendall(b"X")
            except OSError:
                drip_open = False
        time.sleep(1)

    def still_open(s: socket.socket) -> bool:
        """True if the server has not closed `s` (whatever it answered before closing)."""
        s.settimeout(0.5)
        try:
            while s.recv(65536):
                pass
        except TimeoutError:
            return True
        except OSError:
            return False
        return False

    result = (still_open(idle), drip_open and still_open(drip))
    idle.close()
    drip.close()
    return result


def compare_uvicorn(seconds: float) -> None:
    """Print stdlib vs uvicorn throughput and hold times for the same LockApp on SQLite."""
    import secrets
    import subprocess
    import tempfile

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        with LocalServer(db=f"{tmp}/a.sqlite3", quota=0, log_requests=False) as srv:
            drive(srv.url, srv.service_key, 1, 0.3)
            rates = [drive(srv.url, srv.service_key, t, seconds)[0] / seconds for t in (1, 8)]
            rows.append(
                ("stdlib socketserver, bounded (this server)", *rates, *_held_open(srv.url, HOLD_SECONDS))
            )
        secret = secrets.token_urlsafe(48)
        env = {**os.environ, "VOLCANO_LOCAL_SECRET": secret}
        cmd = [sys.executable, __file__, "--uvicorn-child", f"{tmp}/b.sqlite3"]
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, env=env, text=True) as proc:
            assert proc.stdout is not None
            url = proc.stdout.readline().split("=", 1)[1].strip()
            proc.stdout.readline()
            from volcano_locks.server.auth import mint_key

            key = mint_key(secret)
            drive(url, key, 1, 0.3)
            rates = [drive(url, key, t, seconds)[0] / seconds for t in (1, 8)]
            rows.append(("uvicorn 0.54 h11, limit_concurrency=64", *rates, *_held_open(url, HOLD_SECONDS)))
            proc.terminate()
    print(f"HTTP layer for the same LockApp on SQLite ({seconds:g} s per rate; hold test {HOLD_SECONDS} s)\n")
    print(
        f"| HTTP layer | pairs/s, 1 client | pairs/s, 8 clients | idle socket open after {HOLD_SECONDS} s | "
        f"slowloris drip open after {HOLD_SECONDS} s |"
    )
    print("| --- | ---: | ---: | --- | --- |")
    for name, r1, r8, idle, drip in rows:
        print(f"| {name} | {r1:,.0f} | {r8:,.0f} | {'yes' if idle else 'no'} | {'yes' if drip else 'no'} |")


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def _served_in(url: str, key: str) -> str:
    """How long a fresh client waits for one lock read (or why it got none)."""
    started = time.monotonic()
    try:
        r = httpx.get(
            url + "/locks/probe",
            headers={"Authorization": f"Bearer {key}", "X-Volcano-Request-Id": str(uuid.uuid4())},
            timeout=5,
        )
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__} after {time.monotonic() - started:.1f} s"
    return f"{r.status_code} in {time.monotonic() - started:.2f} s"


def abuse() -> None:
    """Print server memory and CPU under the long-path, huge-header and low open-file-limit attacks."""
    import contextlib
    import secrets
    import socket
    import subprocess
    import tempfile

    rows = []
    with LocalServer(admin=True, quota=1_000_000, log_requests=False) as srv:
        assert srv.proc is not None
        with httpx.Client(base_url=srv.url, timeout=60) as http:
            for _ in range(50):
                http.get("/locks/warm-up")
            before = _rss_mib(srv.proc.pid)
            huge = b"GET /locks/" + b"a" * 65_000 + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            for _ in range(1_000):
                with (
                    socket.create_connection(("127.0.0.1", srv.port), timeout=30) as sock,
                    contextlib.suppress(OSError),
                ):
                    sock.sendall(huge)
                    while sock.recv(65536):
                        pass
            for _ in range(2_000):
                http.get("/locks/" + "b" * 8_000)
        rows.append(
            ("1,000 requests with 65 KB paths + 2,000 with 8 KB paths, --admin on", f"{before:.0f} MiB",
             f"{_rss_mib(srv.proc.pid):.0f} MiB", _served_in(srv.url, srv.service_key))
        )  # fmt: skip
    with LocalServer(quota=1_000_000, log_requests=False) as srv:
        assert srv.proc is not None
        _served_in(srv.url, srv.service_key)
        before = _rss_mib(srv.proc.pid)
        socks = park_huge_heads(srv.port)
        time.sleep(0.5)
        rows.append(
            ("100 connections parking Host + 99 header lines of 65 KB", f"{before:.0f} MiB",
             f"{_rss_mib(srv.proc.pid):.0f} MiB", _served_in(srv.url, srv.service_key))
        )  # fmt: skip
        for sock in socks:
            sock.close()
    code = (
        "import resource, sys\nresource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))\n"
        "from volcano_locks.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    )
    secret = secrets.token_urlsafe(48)
    with tempfile.TemporaryDirectory() as tmp:
        out_path = f"{tmp}/out.log"
        with open(out_path, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-c", code, "serve", "--port", "0", "--db", f"{tmp}/l.sqlite3"],
                stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "VOLCANO_LOCAL_SECRET": secret},
            )  # fmt: skip
        try:
            text = ""
            while "\nready" not in text:
                time.sleep(0.05)
                with open(out_path) as fh:
                    text = fh.read()
            url = printed_variables(text)["VOLCANO_API_URL"]
            port = int(url.rsplit(":", 1)[1])
            socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(100)]
            time.sleep(0.5)
            cpu0 = cpu_seconds(proc.pid)
            time.sleep(2)
            spent = cpu_seconds(proc.pid) - cpu0
            from volcano_locks.server.auth import mint_key

            rows.append(
                ("100 idle sockets at RLIMIT_NOFILE 64", "-", f"{spent:.2f} CPU s in 2 s",
                 _served_in(url, mint_key(secret)))
            )  # fmt: skip
            for sock in socks:
                sock.close()
        finally:
            proc.terminate()
            proc.wait()
    print("The server under the attacks of issue 14 (scaled down), unauthenticated, over loopback\n")
    print("| attack | server RSS before | server RSS after (or CPU) | a new client meanwhile |")
    print("| --- | ---: | ---: | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="measuring time per row")
    parser.add_argument("--threads", default="1,8", help="comma-separated client thread counts")
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--pg-dsn", default=PG_DSN)
    parser.add_argument("--compare-uvicorn", action="store_true", help="stdlib vs uvicorn, see above")
    parser.add_argument("--abuse", action="store_true", help="server memory/CPU under attack, see above")
    parser.add_argument("--uvicorn-child", metavar="DB", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.uvicorn_child:
        _uvicorn_child(args.uvicorn_child, 64)
        return 0
    if args.compare_uvicorn:
        compare_uvicorn(args.seconds)
        return 0
    if args.abuse:
        abuse()
        return 0
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
