"""The test proxy itself: a client reconnecting the moment resume() resets it reaches the target.

A connection pool retries at once when its connection is reset; if resume() reset the stalled
connections before it stopped stalling, that retry met another stalled connection and hung (CI saw
tests/server/test_pg_pool.py's pool fail to reconnect after the database came back).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import pytest

from .tcpproxy import TcpProxy


@pytest.fixture
def echo() -> Iterator[tuple[str, int]]:
    server = socket.create_server(("127.0.0.1", 0))

    def serve(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            while data := conn.recv(1024):
                conn.sendall(data)

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = server.accept()
                threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield server.getsockname()
    with contextlib.suppress(OSError):
        server.shutdown(socket.SHUT_RDWR)
    server.close()


def test_a_client_reconnecting_at_once_after_resume_is_forwarded(echo: tuple[str, int]) -> None:
    proxy = TcpProxy(echo).start()
    try:
        for round_ in range(30):
            stalled = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
            proxy.stall()
            stalled.sendall(b"lost")
            answers: list[bytes] = []

            def reconnect_when_reset(sock: socket.socket = stalled, answers: list[bytes] = answers) -> None:
                with contextlib.suppress(OSError):
                    sock.recv(16)  # returns (or raises) the moment resume() resets this connection
                sock.close()
                try:
                    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as again:
                        again.sendall(b"ping")
                        answers.append(again.recv(16))
                except OSError as exc:  # a stalled connection times out
                    answers.append(repr(exc).encode())

            waiter = threading.Thread(target=reconnect_when_reset)
            waiter.start()
            proxy.resume()
            waiter.join(timeout=15)
            assert answers == [b"ping"], f"round {round_}: the reconnect after resume was not forwarded"
    finally:
        proxy.close()
