"""A TCP forwarder a test can cut, stall, partition and heal: between the server and its database, or
between one client and the lock server (the chaos suite gives every worker its own).

Each direction of every forwarded connection (``up``: client to target, ``down``: target to client) is in
one of four modes, switched at any time with :meth:`TcpProxy.partition` and back with :meth:`heal`:

- ``pass``: forward as it comes;
- ``drop``: swallow what comes (the connection stays open: a one-way partition that loses packets);
- ``hold``: keep what comes and deliver it, in order, when the direction heals (a partition that TCP
  outlasts: the request reaches the server late, after the client gave up on it);
- ``delay``: forward each chunk ``delay`` seconds after it came.

``cut()`` is a crash of the target: every connection reset, new ones refused until ``restore()``;
``stall()`` is a target that hangs: connections accepted, nothing forwarded either way, until ``resume()``
resets them.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

__all__ = ["MODES", "TcpProxy"]

MODES = ("pass", "drop", "hold", "delay")


class TcpProxy:
    """Forward 127.0.0.1:<port> to (host, port), with faults switched per direction."""

    def __init__(self, target: tuple[str, int]) -> None:
        """Pick a free port to listen on (not yet listening: see :meth:`start`)."""
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._listener.close()
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._server: socket.socket | None = None
        self._stalled = False
        self._modes = {"up": "pass", "down": "pass"}
        self._delay = 0.0
        self._closed = False

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``: what a client of a proxied HTTP server connects to."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> TcpProxy:
        """Listen and forward; return self."""
        self._server = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(
            target=self._accept, args=(self._server,), daemon=True, name="tcpproxy-accept"
        ).start()
        return self

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            with self._lock:
                # Checked and recorded under one lock hold: a connection accepted while stalled is in
                # the list resume() resets, never left hanging after it.
                stalled = self._stalled
                if stalled:
                    self._socks.append(client)  # connected, and never answered
            if stalled:
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._socks += [client, upstream]
            for a, b, direction in ((client, upstream, "up"), (upstream, client, "down")):
                threading.Thread(target=self._pipe, args=(a, b, direction), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, direction: str) -> None:
        try:
            while data := src.recv(65536):
                with self._changed:
                    mode = self._modes[direction]
                    if mode == "hold":
                        self._changed.wait_for(lambda: self._modes[direction] != "hold" or self._closed)
                        mode = self._modes[direction]
                    delay = self._delay
                    if self._stalled or self._closed:
                        mode = "drop"
                if mode == "drop":
                    continue
                if mode == "delay":
                    time.sleep(delay)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def partition(self, up: str = "pass", down: str = "pass", *, delay: float = 0.0) -> None:
        """Set each direction's mode (see the module docstring); ``delay`` is the ``delay`` mode's seconds."""
        for mode in (up, down):
            if mode not in MODES:
                raise ValueError(f"proxy mode {mode!r} is not one of {', '.join(MODES)}")
        if delay < 0:
            raise ValueError(f"proxy delay {delay!r} must be >= 0")
        with self._changed:
            self._modes = {"up": up, "down": down}
            self._delay = delay
            self._changed.notify_all()

    def heal(self) -> None:
        """Forward both ways again; what was held is delivered now, in order."""
        self.partition()

    @property
    def modes(self) -> tuple[str, str]:
        """(up, down): the mode of each direction now."""
        with self._lock:
            return self._modes["up"], self._modes["down"]

    def cut(self) -> None:
        """Stop listening and reset every forwarded connection (the target 'goes down')."""
        if self._server is not None:
            # shutdown() wakes the thread blocked in accept(); close() alone would leave it listening
            with contextlib.suppress(OSError):
                self._server.shutdown(socket.SHUT_RDWR)
            self._server.close()
            self._server = None
        self._reset_forwarded()

    def restore(self) -> None:
        """Listen again on the same port."""
        self.start()

    def stall(self) -> None:
        """Stop forwarding: connections stay open and data is swallowed (the target 'hangs')."""
        with self._changed:
            self._stalled = True

    def resume(self) -> None:
        """Forward again; connections open during the stall lost data, so they are reset.

        The flag is cleared, and the connections to reset taken, under one lock hold before the reset: a
        client that retries the moment its stalled connection is reset (a connection pool does) reaches
        the target, not another stalled connection, and is not reset itself.
        """
        with self._changed:
            self._stalled = False
            socks, self._socks = self._socks, []
        self._reset(socks)

    def close(self) -> None:
        """Stop listening, release anything held, and reset every connection."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        self.cut()

    def _reset_forwarded(self) -> None:
        with self._lock:
            socks, self._socks = self._socks, []
        self._reset(socks)

    @staticmethod
    def _reset(socks: list[socket.socket]) -> None:
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
