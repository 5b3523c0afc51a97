"""A tiny TCP forwarder that a test can cut, stall and restore, to take PostgreSQL away from the server."""

from __future__ import annotations

import contextlib
import socket
import threading


class TcpProxy:
    """Forward 127.0.0.1:<port> to (host, port).

    `cut()` drops every connection and refuses new ones (a database that is down); `stall()` keeps
    accepting and reading but forwards nothing either way (a database that hangs).
    """

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._listener.close()
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._server: socket.socket | None = None
        self._stalled = threading.Event()

    def start(self) -> TcpProxy:
        self._server = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, args=(self._server,), daemon=True).start()
        return self

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            if self._stalled.is_set():
                with self._lock:
                    self._socks.append(client)  # connected, and never answered
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._socks += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                if not self._stalled.is_set():
                    dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        """Stop listening and reset every forwarded connection (PostgreSQL 'goes down')."""
        if self._server is not None:
            # shutdown() wakes the thread blocked in accept(); close() alone would leave it listening
            with contextlib.suppress(OSError):
                self._server.shutdown(socket.SHUT_RDWR)
            self._server.close()
            self._server = None
        self._reset_connections()

    def restore(self) -> None:
        """Listen again on the same port."""
        self.start()

    def stall(self) -> None:
        """Stop forwarding: connections stay open and data is swallowed (PostgreSQL 'hangs')."""
        self._stalled.set()

    def resume(self) -> None:
        """Forward again; connections open during the stall lost data, so they are reset."""
        self._reset_connections()
        self._stalled.clear()

    def _reset_connections(self) -> None:
        """Reset every forwarded connection (both sides)."""
        with self._lock:
            socks, self._socks = self._socks, []
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
