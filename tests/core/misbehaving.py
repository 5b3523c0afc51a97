"""A deliberately misbehaving HTTP server on loopback: response shapes a correct server never produces.

Each connection is answered by one scripted behaviour: drip the response a byte at a time, send a
body far larger than any the contract has, or answer with chosen status, headers and body.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

Behaviour = Callable[[socket.socket], None]


def drip(interval: float = 0.2, limit: float = 30.0) -> Behaviour:
    """Send a valid-looking response head one byte every ``interval`` seconds (never finishing)."""

    def run(conn: socket.socket) -> None:
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + b"X-Pad: " + b"a" * 10_000
        ends = time.monotonic() + limit
        for byte in head:
            if time.monotonic() > ends:
                return
            conn.sendall(bytes([byte]))
            time.sleep(interval)

    return run


def huge_body(size: int = 10 * 1024 * 1024) -> Behaviour:
    """A 200 whose JSON body is ``size`` bytes."""

    def run(conn: socket.socket) -> None:
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % size
        )
        chunk = b" " * 65536
        sent = 0
        while sent < size:
            conn.sendall(chunk[: size - sent])
            sent += len(chunk)

    return run


def answer(status: int, body: bytes, headers: dict[str, str] | None = None) -> Behaviour:
    """A complete response with ``status``, ``headers`` and ``body``."""

    def run(conn: socket.socket) -> None:
        lines = [f"HTTP/1.1 {status} X", f"Content-Length: {len(body)}", "Connection: close"]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        conn.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)

    return run


def _read_request(conn: socket.socket) -> None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(rest) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return
        rest += chunk


@contextmanager
def misbehaving(behaviour: Behaviour) -> Iterator[str]:
    """Serve ``behaviour`` on every connection until the block ends; yield the base URL."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve_one(conn: socket.socket) -> None:
        with conn:
            try:
                _read_request(conn)
                behaviour(conn)
            except OSError:
                pass  # the client gave up: that is what the tests want

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=serve_one, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        listener.close()
        thread.join(5)
