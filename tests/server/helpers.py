"""Raw clients for the server tests: the contract's headers over httpx, and bytes over a socket."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx


def new_id() -> str:
    """A fresh UUID string (request ids and ownership tokens)."""
    return str(uuid.uuid4())


class Raw:
    """Speak the wire contract directly with httpx, over one keep-alive connection."""

    def __init__(self, url: str, key: str | None) -> None:
        self.key = key
        self.http = httpx.Client(base_url=url, timeout=10.0)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Raw:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def headers(
        self, token: str | None = None, request_id: str | None = None, key: str | None = None
    ) -> dict[str, str]:
        h = {"X-Volcano-Request-Id": request_id or new_id()}
        bearer = key if key is not None else self.key
        if bearer is not None:
            h["Authorization"] = f"Bearer {bearer}"
        if token is not None:
            h["X-Volcano-Lock-Token"] = token
        return h

    def acquire(self, lock: str, token: str, ttl: Any = 30, **kw: Any) -> httpx.Response:
        return self.http.post(
            f"/locks/{lock}/lease", json={"ttl_seconds": ttl}, headers=self.headers(token, **kw)
        )

    def renew(self, lock: str, token: str, ttl: Any = 30, **kw: Any) -> httpx.Response:
        return self.http.patch(
            f"/locks/{lock}/lease", json={"ttl_seconds": ttl}, headers=self.headers(token, **kw)
        )

    def release(self, lock: str, token: str, **kw: Any) -> httpx.Response:
        return self.http.delete(f"/locks/{lock}/lease", headers=self.headers(token, **kw))

    def get(self, lock: str, **kw: Any) -> httpx.Response:
        return self.http.get(f"/locks/{lock}", headers=self.headers(**kw))

    def force_release(self, lock: str, **kw: Any) -> httpx.Response:
        return self.http.delete(f"/locks/{lock}", headers=self.headers(**kw))


def read_all(sock: socket.socket, timeout: float = 20.0) -> bytes:
    """Everything the server sends until it closes the connection (a reset ends it too)."""
    sock.settimeout(timeout)
    chunks = []
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def exchange(port: int, data: bytes, timeout: float = 20.0) -> bytes:
    """Send `data` on a new loopback connection, half-close it, and read until the server closes.

    The server may close early on garbage; whatever it sent back is still read.
    """
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        with contextlib.suppress(OSError):
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        return read_all(sock, timeout)


def responses(answer: bytes) -> list[tuple[int, bytes]]:
    """Split raw bytes into (status, body) pairs (keep-alive may carry several); anything else fails."""
    found = []
    while answer.startswith(b"HTTP/1."):
        head, sep, rest = answer.partition(b"\r\n\r\n")
        assert sep, answer[:500]
        lines = head.split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
        found.append((status, rest[:length]))
        answer = rest[length:]
    assert answer == b"", answer[:500]  # nothing but well-formed responses, or nothing at all
    return found


def park_huge_heads(port: int, connections: int = 100, lines: int = 99) -> list[socket.socket]:
    """Open `connections` sockets, each sending `Host` and `lines` header lines of 65 KB, never ending.

    The attack of issue 14 that once took the server to 680 MiB; the caller closes the sockets.
    """
    pad = [f"X-Pad-{i}: ".encode() + b"p" * 65_000 + b"\r\n" for i in range(lines)]
    socks = []
    for _ in range(connections):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        with contextlib.suppress(OSError):  # the server answered 431 and closed: over for this socket
            sock.sendall(b"GET /locks/x HTTP/1.1\r\nHost: x\r\n")
            for line in pad:
                sock.sendall(line)
        socks.append(sock)
    return socks


def serve_until_exit(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 20.0
) -> subprocess.CompletedProcess[str]:
    """Run `volcano-locks serve` on a free port and a fresh SQLite file to its exit (a usage error)."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "volcano_locks",
            "serve",
            "--port",
            "0",
            "--db",
            str(tmp_path / "l.sqlite3"),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def with_schema(dsn: str, schema: str) -> str:
    """Add the server's `schema=` parameter to a PostgreSQL DSN."""
    return f"{dsn}{'&' if '?' in dsn else '?'}schema={schema}"


def drop_schema(dsn: str, schema: str) -> None:
    """Drop a test schema and everything in it."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
